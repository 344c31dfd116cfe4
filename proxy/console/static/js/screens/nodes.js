// Nodes > Connect other computers: the switch "Find computers on this network" and the
// computers found on it, each connected with the code it shows (js/discovery.js); add a
// computer by its address (URL, API key, name); the list of connected computers (each
// removable); "Let another computer connect" (a pairing code, js/pairing.js); and, once at
// least one computer is connected, the load-balancing section (js/lb-section.js).

import { el, showError, showSaved, showSaving, uid } from "../components/field.js";
import { discovery } from "../discovery.js";
import { lbSection } from "../lb-section.js";
import { pairing } from "../pairing.js";
import { poolState } from "../pool-state.js";

function input(label, name, type, help, disabled) {
  const id = uid(name);
  const control = el("input", { id, name, type, autocomplete: "off", spellcheck: "false", disabled });
  const parts = [el("label", { for: id, text: label }), control];
  if (help) {
    const note = el("span", { class: "help muted", id: uid("help"), text: help });
    control.setAttribute("aria-describedby", note.id);
    parts.push(note);
  }
  const wrapper = el("div", { class: "field" }, ...parts);
  wrapper.input = control;
  return wrapper;
}

function addForm(app, state) {
  const off = app.readOnly;
  const url = input("URL", "baseUrl", "url", "The other computer's sluice address, e.g. http://192.168.1.50:39080", off);
  const key = input("API key", "apiKey", "password", "Optional: an access key made on that computer", off);
  const name = input("Name", "name", "text", "Optional: how this console and the logs call it", off);
  const add = el("button", { type: "submit", class: "primary", disabled: app.readOnly, text: "Add computer" });
  const form = el("form", { class: "stack", "aria-label": "Add a computer" },
                  el("div", { class: "grid3" }, url, key, name), el("div", { class: "row" }, add));
  const result = el("div", { class: "form-status" });
  form.append(result);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (app.readOnly) return;
    const body = { baseUrl: url.input.value.trim() };
    if (key.input.value) body.apiKey = key.input.value;
    if (name.input.value.trim()) body.name = name.input.value.trim();
    showSaving(result);
    add.disabled = true;
    try {
      const node = await app.api.post("/api/v1/nodes", body);
      showSaved(result, `Added ${node.name}: last in the order`);
      for (const part of [url, key, name]) part.input.value = "";
      state.reload();
    } catch (err) {
      showError(result, err.message);
      const wrong = { baseUrl: url, apiKey: key, name }[err.param];
      wrong?.input.setAttribute("aria-invalid", "true");
      wrong?.input.focus();
    } finally {
      add.disabled = false;
    }
  });
  return form;
}

// SPEC §16: how this gateway reaches the computer. "pinned": TLS 1.3 to its node port, its
// certificate checked against the one pinned at pairing; "plain": HTTP anyone on the network
// can read (fine on this machine; a warning elsewhere, until it is paired with a code).
function linkBadge(node) {
  if (node.link === "pinned") {
    return el("span", { class: "badge ok", text: "Pinned TLS link", title: node.pin ?? "" });
  }
  const local = /^https?:\/\/(127\.|localhost[:/]|\[::1\])/.test(node.baseUrl);
  return el("span", { class: local ? "badge" : "badge warn",
                      text: local ? "Plain link (this machine)" : "Plain link: readable on the network" });
}

function connectedList(app, state) {
  const list = el("ul", { class: "stack plain", "aria-label": "Connected computers" });
  const confirming = new Set();
  const draw = (nodes) => {
    list.replaceChildren(...nodes.map((node) => {
      const remove = el("button", { type: "button", class: "danger small", disabled: app.readOnly });
      const status = el("span", { class: "form-status" });
      const li = el("li", { class: "row wrap connected" },
                    el("strong", { text: node.name }),
                    el("span", { class: "muted mono", text: node.baseUrl }),
                    el("span", { class: "muted mono small", text: node.fingerprint }),
                    el("span", { class: "badge", text: node.hasApiKey ? "API key set" : "no API key" }),
                    linkBadge(node),
                    el("span", { class: "spacer" }), remove, status);
      const sure = confirming.has(node.fingerprint);
      remove.textContent = sure ? `Confirm: remove ${node.name}` : `Remove ${node.name}`;
      remove.addEventListener("click", async () => {
        if (!confirming.has(node.fingerprint)) {
          confirming.add(node.fingerprint);
          draw(state.data.nodes ?? []);
          list.querySelector(`[data-fp="${CSS.escape(node.fingerprint)}"] button.danger`)?.focus();
          return;
        }
        confirming.delete(node.fingerprint);
        showSaving(status);
        try {
          await app.api.del(`/api/v1/nodes/${encodeURIComponent(node.fingerprint)}`);
          app.notify(`Removed ${node.name}`);
          state.reload();
        } catch (err) {
          showError(status, err.message);
        }
      });
      li.dataset.fp = node.fingerprint;
      return li;
    }));
    if (!nodes.length) list.append(el("li", { class: "muted", text: "No other computer is connected yet." }));
  };
  let drawn = null;
  list.update = (data) => {
    const signature = JSON.stringify(data.nodes ?? []);
    if (signature !== drawn) draw(data.nodes ?? []);
    drawn = signature;
  };
  return list;
}

export function mount(root, app) {
  const state = poolState(app);
  const connected = connectedList(app, state);
  const lan = discovery(app, state);
  const pair = pairing(app);
  const connect = el("section", { class: "card stack", "aria-labelledby": "connect-heading" },
                     el("h2", { id: "connect-heading", text: "Connect other computers" }),
                     lan.controls,
                     el("h3", { text: "Found on this network" }),
                     lan.found,
                     el("h3", { text: "Add a computer by its address" }),
                     el("p", { class: "muted", text: "If it is not found on this network: its address " +
                                                     "and an access key made on it." }),
                     addForm(app, state),
                     el("h3", { text: "Connected computers" }),
                     connected);
  const lbHolder = el("div");
  root.append(el("h1", { text: "Nodes" }), connect, pair, lbHolder);
  let section = null;
  const draw = (data) => {
    if (data.nodes === null) return;
    connected.update(data);
    lan.update(data);
    if (data.nodes.length && !section) {
      section = lbSection(app, state);
      lbHolder.replaceChildren(section);
    } else if (!data.nodes.length && section) {
      section = null;
      lbHolder.replaceChildren();
    }
    section?.update(data);
  };
  const off = state.onChange(draw);
  draw(state.data);
  return () => {
    off();
    lan.close();
    pair.close();
    state.close();
  };
}
