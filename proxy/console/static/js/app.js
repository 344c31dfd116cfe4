// The console's shell: the admin token (from the address bar's fragment into sessionStorage),
// navigation by hash routes, the notifications area, and each screen loaded with import() so
// that one broken screen cannot break the others.

import { TOKEN_KEY, api, token } from "./api.js";
import { feed } from "./feed.js";

// -- the token: #token=<admin token> -> sessionStorage, then gone from the address bar ----

function takeToken() {
  const match = /^#token=([^&]*)/.exec(location.hash);
  if (!match) return;
  try {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
  } catch {
    /* storage refused (private mode): the console stays read-only */
  }
  history.replaceState(null, "", `${location.pathname}${location.search}#/nodes`);
}

takeToken();

export const SCREENS = [
  { route: "/nodes", module: "nodes", title: "Nodes" },
  { route: "/pool", module: "pool", title: "Distributed pool" },
  { route: "/requests", module: "requests", title: "Requests" },
  { route: "/playground", module: "playground", title: "Playground" },
  { route: "/local", module: "local", title: "Local models" },
  { route: "/aliases", module: "aliases", title: "Aliases" },
  { route: "/api/general", module: "general", title: "General" },
  { route: "/api/health", module: "health", title: "Health" },
  { route: "/api/keys", module: "keys", title: "Access keys" },
];

// -- notifications: the gateway's (live) and the console's own --------------------------

const list = document.getElementById("notification-list");
const live = document.getElementById("notify-live");
const gatewayItems = new Map(); // code -> element

function item(message, level, onDismiss) {
  const li = document.createElement("li");
  li.className = `notice ${level === "error" ? "bad" : level === "warning" ? "warn" : "info"}`;
  const text = document.createElement("span");
  text.textContent = message;
  li.append(text);
  if (onDismiss) {
    const close = document.createElement("button");
    close.type = "button";
    close.className = "link";
    close.textContent = "Dismiss";
    close.setAttribute("aria-label", `Dismiss: ${message}`);
    close.addEventListener("click", () => {
      li.remove();
      onDismiss();
    });
    li.append(close);
  }
  return li;
}

function gatewayNotification(entry) {
  gatewayItems.get(entry.code)?.remove();
  gatewayItems.delete(entry.code);
  if (entry.cleared) return;
  const li = item(entry.message, entry.level, () => gatewayItems.delete(entry.code));
  li.dataset.code = entry.code;
  gatewayItems.set(entry.code, li);
  list.append(li);
  live.textContent = entry.message;
}

const NOTICE_MS = 10000; // the console's own messages stay this long

export function notify(message, level = "info") {
  const li = item(message, level, () => {});
  list.append(li);
  live.textContent = message;
  setTimeout(() => li.remove(), NOTICE_MS);
}

feed.on("notification", gatewayNotification);
feed.on("refresh", (hello) => {
  const entries = hello ? hello.notifications : null;
  const apply = (all) => {
    for (const li of gatewayItems.values()) li.remove();
    gatewayItems.clear();
    for (const entry of all) gatewayNotification(entry);
  };
  if (entries) apply(entries);
  else api.get("/api/v1/notifications").then((doc) => apply(doc.notifications), () => {});
  if (hello) document.getElementById("gateway-name").textContent = hello.fingerprint;
});

const connection = document.getElementById("connection");
feed.on("state", (state) => {
  connection.textContent = state === "open" ? "live" : "reconnecting";
  connection.className = `badge ${state === "open" ? "ok" : "warn"}`;
});

// -- read-only mode ----------------------------------------------------------------------

const readOnly = !token();
if (readOnly) {
  const banner = document.getElementById("readonly-banner");
  banner.hidden = false;
  const text = document.createElement("p");
  const code = document.createElement("code");
  code.textContent = "sluice console";
  text.append("Read-only: this page has no admin token, so nothing can be changed here. To ",
              "change settings, run ", code,
              " on the gateway's computer: it opens the console with a token.");
  banner.append(text);
}

// -- screens -----------------------------------------------------------------------------

const app = { api, feed, notify, readOnly };
const screenRoot = document.getElementById("screen");
let unmount = null;
let generation = 0;

function current() {
  const route = location.hash.startsWith("#/") ? location.hash.slice(1) : "/nodes";
  return SCREENS.find((s) => s.route === route) ?? SCREENS[0];
}

async function show() {
  const screen = current();
  const mine = ++generation;
  for (const link of document.querySelectorAll(".sidenav a")) {
    if (link.getAttribute("href") === `#${screen.route}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${screen.title} · sluice console`;
  if (typeof unmount === "function") {
    try {
      unmount();
    } catch (err) {
      console.error(err);
    }
  }
  unmount = null;
  const root = document.createElement("div");
  root.className = "screen";
  root.dataset.screen = screen.module;
  screenRoot.replaceChildren(root);
  try {
    const module = await import(`./screens/${screen.module}.js`);
    if (mine !== generation) return;
    unmount = (await module.mount(root, app)) ?? null;
  } catch (err) {
    if (mine !== generation) return;
    console.error(err);
    const heading = document.createElement("h1");
    heading.textContent = screen.title;
    const problem = document.createElement("p");
    problem.className = "notice bad";
    problem.textContent = `This screen could not be loaded: ${err.message || err}`;
    root.replaceChildren(heading, problem);
  }
}

window.addEventListener("hashchange", (event) => {
  if (!location.hash.startsWith("#/")) return;
  show();
  if (new URL(event.oldURL).hash.startsWith("#/")) document.getElementById("main").focus();
});
if (!location.hash.startsWith("#/")) history.replaceState(null, "", "#/nodes");
show();
feed.start();
