// Nodes > Let another computer connect (SPEC §14): a button that makes a pairing code
// (POST /api/v1/pairing -> {code, expiresAt}: 6 digits, 5 minutes, one use), the code shown
// large ("123 456") with a countdown to its expiry (mm:ss, every second; a role="timer",
// which screen readers do not read out on each change), Cancel (DELETE), and what became of
// it: claimed ("<name> connected"), expired, cancelled, void after too many wrong tries.
// Those changes, and one at a minute left, go to a polite live line; nothing else does.
//
// While a code is shown the section reads GET /api/v1/pairing every 2 s ({active, state,
// expiresAt, triesLeft, name}); the `pairing` event (the same body) tells it sooner, and the
// gateway's notification "<name> connected with a pairing code" names the computer when
// nothing else does. A code made elsewhere (another console, `sluice pair`) shows as active,
// with its countdown and Cancel, but not its digits (the server never says them again).
//
// pairing(app) -> section element with .close()

import { el, uid } from "./components/field.js";

const PAIRING = "/api/v1/pairing";
const POLL_MS = 2000;
// A new code's life (SPEC §14): its expiresAt minus this tells the gateway's clock from the
// page's, so that the countdown is right when the two differ.
const LIFETIME_MS = 5 * 60 * 1000;
const SKEW_MS = 2000; // a difference of clocks worth correcting
const CLAIMED = / connected with a pairing code\.?$/;

// "123456" -> "123 456" (as shown; screen readers get "1 2 3 4 5 6", digit by digit).
export function codeShown(code) {
  const digits = String(code);
  return digits.length === 6 ? `${digits.slice(0, 3)} ${digits.slice(3)}` : digits;
}

// Milliseconds since the epoch of an expiresAt (ISO text, or seconds / milliseconds).
export function expiryMs(value) {
  if (typeof value === "number") return value < 1e12 ? value * 1000 : value;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : at;
}

// Whole seconds as m:ss ("4:59", "0:07").
export function mmss(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

export function pairing(app) {
  let alive = true;
  // What is shown: null (nothing), or { code (null when made elsewhere), expires (ms),
  // triesLeft }.
  let shown = null;
  let ticker = null;
  let poller = null;
  let warned = false;
  let making = false; // a POST of ours under way
  let skew = 0; // the gateway's clock minus this page's, once a new code showed it
  const local = (iso) => {
    const at = expiryMs(iso);
    return at === null ? null : at - skew;
  };
  const headingId = uid("pairing-heading");

  const start = el("button", { type: "button", class: "primary", disabled: app.readOnly,
                               text: "Show a pairing code" });
  const startStatus = el("span", { class: "form-status" });
  const codeText = el("span", { "aria-hidden": "true" });
  const codeSpoken = el("span", { class: "sr-only" });
  const code = el("p", { class: "pairing-code mono" }, codeText, codeSpoken);
  const timer = el("span", { class: "countdown", role: "timer", "aria-live": "off" });
  const tries = el("span", { class: "muted small" });
  const cancel = el("button", { type: "button", class: "small", disabled: app.readOnly });
  cancel.append("Cancel", el("span", { class: "sr-only", text: " pairing code" }));
  const cancelStatus = el("span", { class: "form-status" });
  const intro = el("p", { class: "muted pairing-intro" });
  const box = el("div", { class: "pairing-box stack" },
                 intro, code,
                 el("p", { class: "row wrap" }, el("span", {}, "Expires in ", timer), tries),
                 el("div", { class: "row wrap" }, cancel, cancelStatus));
  box.hidden = true;
  // The one place that speaks: a state change, never a tick.
  const said = el("p", { class: "pairing-state", role: "status", "aria-live": "polite" });
  // SPEC §16: what the other computer pins when the code is proved (GET /health, no secret).
  const identity = el("p", { class: "muted small identity" });
  app.api.get("/health").then((doc) => {
    if (!doc.identity) return;
    identity.append("This computer's identity (its certificate, pinned by the other one when " +
                    "it pairs): ", el("span", { class: "mono", text: doc.identity }),
                    doc.nodePort ? ` — node port ${doc.nodePort}, TLS 1.3.`
                                 : " — no node port yet: turn external access on and restart.");
  }, () => {});

  const section = el("section", { class: "card stack pairing", "aria-labelledby": headingId },
                     el("h2", { id: headingId, text: "Let another computer connect" }),
                     el("p", { class: "muted" },
                        "Shows a code to type on the other computer (Nodes > Found on this network > " +
                        "Connect). It works once, for 5 minutes. The other computer reaches this one " +
                        "over the network, so this one needs external access on (",
                        el("a", { href: "#/api/general", text: "API > General" }), ")."),
                     identity,
                     el("div", { class: "row wrap" }, start, startStatus),
                     box, said);

  const say = (text, level = "") => {
    said.className = `pairing-state ${level ? `notice ${level}` : ""}`.trim();
    if (said.textContent !== text) said.textContent = text; // said once, not again
  };

  function stopTimers() {
    clearInterval(ticker);
    clearInterval(poller);
    ticker = poller = null;
  }

  function tick() {
    if (!shown) return;
    const left = (shown.expires - Date.now()) / 1000;
    timer.textContent = mmss(left);
    if (left <= 0) {
      end("The code expired. Show a new one to try again.", "warn", true);
      return;
    }
    if (left <= 60 && !warned) {
      warned = true;
      say("1 minute left on the pairing code.");
    }
  }

  // Shows a code (or, for one made elsewhere, that one is active) and starts counting.
  function showCode(next, announce) {
    shown = next;
    warned = (next.expires - Date.now()) / 1000 <= 60;
    if (next.code) {
      codeText.textContent = codeShown(next.code);
      codeSpoken.textContent = `Pairing code ${String(next.code).split("").join(" ")}`;
      intro.textContent = "Type this code on the other computer:";
      code.hidden = false;
    } else {
      codeText.textContent = "";
      codeSpoken.textContent = "";
      intro.textContent = "A pairing code is active (it is shown where it was made).";
      code.hidden = true;
    }
    drawTries(next.triesLeft);
    cancelStatus.textContent = "";
    box.hidden = false;
    start.textContent = "Show a new code";
    if (announce) say(announce);
    stopTimers();
    tick();
    ticker = setInterval(tick, 1000);
    poller = setInterval(poll, POLL_MS);
  }

  function drawTries(left) {
    tries.textContent = typeof left === "number" && left < 5
      ? `${left} ${left === 1 ? "try" : "tries"} left` : "";
  }

  // No code any more: `text` says why; the button then offers a new one.
  function end(text, level, again = false) {
    stopTimers();
    shown = null;
    box.hidden = true;
    codeText.textContent = "";
    codeSpoken.textContent = "";
    start.textContent = again ? "Show a new code" : "Show a pairing code";
    say(text, level);
  }

  function claimed(name) {
    if (!shown) return;
    end(name ? `${name} connected` : "The code was used: the other computer connected.", "ok");
  }

  // What the server says of the code (the GET body, or a `pairing` event: {active, state,
  // expiresAt, triesLeft, name}), applied to what is shown.
  async function apply(now) {
    if (!alive || !now) return;
    const expires = local(now.expiresAt);
    if (now.active) {
      if (making) return; // our own new code: its answer shows it
      if (!shown || (expires && Math.abs(expires - shown.expires) > 1000)) {
        // Made (or replaced) elsewhere: another console, or `sluice pair`.
        showCode({ code: null, expires, triesLeft: now.triesLeft },
                 shown ? "The code was replaced elsewhere." : null);
      }
      drawTries(now.triesLeft);
      return;
    }
    if (!shown) return;
    if (now.state === "claimed") claimed(now.name ?? await claimer());
    else if (now.state === "void") {
      end("The code is void after too many wrong tries. Show a new one to try again.", "bad", true);
    } else if (now.state === "expired" || shown.expires - Date.now() <= 0) {
      end("The code expired. Show a new one to try again.", "warn", true);
    } else if (now.state === "cancelled" || now.state === "none") end("Pairing code cancelled.");
  }

  // Who claimed the code, from the gateway's notification, when nothing else says.
  async function claimer() {
    try {
      const notes = await app.api.get("/api/v1/notifications");
      const note = (notes?.notifications ?? []).filter((n) => CLAIMED.test(n.message ?? "")).pop();
      return note ? note.message.replace(CLAIMED, "") : null;
    } catch {
      return null;
    }
  }

  async function poll() {
    if (!shown) return;
    try {
      await apply(await app.api.get(PAIRING));
    } catch {
      /* the gateway restarting, say: the next poll or the feed tells */
    }
  }

  async function make() {
    if (app.readOnly) return;
    start.disabled = true;
    making = true;
    startStatus.className = "form-status";
    startStatus.textContent = "Making a code…";
    try {
      const made = await app.api.post(PAIRING, {});
      if (!alive) return;
      startStatus.textContent = "";
      // A new code lives LIFETIME_MS from now: a larger difference is the clocks'.
      const offset = expiryMs(made.expiresAt) - (Date.now() + LIFETIME_MS);
      skew = Math.abs(offset) > SKEW_MS ? offset : 0;
      const expires = local(made.expiresAt);
      const minutes = Math.max(1, Math.round((expires - Date.now()) / 60000));
      showCode({ code: made.code, expires, triesLeft: 5 },
               `Pairing code shown. It expires in ${minutes} minute${minutes === 1 ? "" : "s"}.`);
    } catch (err) {
      startStatus.className = "form-status bad";
      startStatus.textContent = err.message;
    } finally {
      making = false;
      start.disabled = app.readOnly;
      if (document.activeElement === document.body) start.focus(); // disabled, it lost focus
    }
  }

  async function stop() {
    if (app.readOnly) return;
    cancel.disabled = true;
    try {
      await app.api.del(PAIRING);
      if (!alive) return;
      end("Pairing code cancelled."); // (the `pairing` event may have said it already)
      start.focus();
    } catch (err) {
      cancelStatus.className = "form-status bad";
      cancelStatus.textContent = err.message;
    } finally {
      cancel.disabled = app.readOnly;
    }
  }

  async function reload() {
    try {
      await apply(await app.api.get(PAIRING));
    } catch {
      /* a gateway without pairing, or read-only: the button says what it can */
    }
  }

  start.addEventListener("click", make);
  cancel.addEventListener("click", stop);

  const off = [
    app.feed.on("pairing", (event) => { apply(event); }),
    app.feed.on("notification", (entry) => {
      if (shown && !entry?.cleared && CLAIMED.test(entry?.message ?? "")) {
        claimed(entry.message.replace(CLAIMED, ""));
      }
    }),
    app.feed.on("refresh", () => { reload(); }),
  ];
  reload();

  section.close = () => {
    alive = false;
    stopTimers();
    for (const unsubscribe of off) unsubscribe();
  };
  return section;
}
