// Nodes > Connect other computers, the LAN part (SPEC §14): the switch "Find computers on
// this network" (PUT /api/v1/settings/discovery sets browse and announce together), a line
// saying what is in effect and what is missing (browsing needs load balancing, announcing
// needs external access), and "Found on this network": the computers the gateway sees
// (GET /api/v1/nodes/discovered, then its `discovered` events), each with Connect, which
// asks for the code the other computer shows and adds it (POST /api/v1/nodes
// {baseUrl, pairingCode, name}).
//
// discovery(app, state) -> { controls, found, update(data), close() }
//   controls: the switch and its line; found: the list; update(data) takes the pool-state.js
//   data (its nodes mark the computers already added, also before the next `discovered`).
// What is in effect is the server's to say (`browsing`, `announcing`): the settings are read
// again when load balancing or the API settings change. The live feed is authoritative
// (screens/common.js feedOrder): a save's answer, or a GET's, that comes after a newer
// `discovery` event is not drawn over it.

import { clearStatus, el, showError, uid } from "./components/field.js";
import { toggle } from "./components/switch.js";
import { feedOrder } from "./screens/common.js";

const SETTINGS = "/api/v1/settings/discovery";
const FOUND = "/api/v1/nodes/discovered";
const API = "/api/v1/settings/api";

// What the pairing field sends: its digits ("123 456" is typed as it is shown).
export function codeDigits(text) {
  return String(text).replace(/[\s-]/g, "");
}

function link(href, text) {
  return el("a", { href, text });
}

// The line beside the switch: what is on, and what is missing for the rest (the server
// says what is in effect: `browsing` needs load balancing, `announcing` external access).
function effect(settings, api) {
  if (!settings) return ["Reading…"];
  const { browse, announce } = settings;
  if (!browse && !announce) {
    return ["Off: this computer does not look for other computers, and they do not see it."];
  }
  const parts = [];
  if (browse && settings.browsing) parts.push("On: looking for other computers.");
  else if (browse) {
    parts.push("Not looking for other computers: that needs load balancing on (",
               link("#/pool", "Distributed pool"), ").");
  } else parts.push("Not looking for other computers.");
  if (announce && settings.announcing) parts.push(" Other computers can find this one.");
  else if (announce && api?.allowExternalAccess) {
    parts.push(" Other computers can find this one once the gateway restarts with external " +
               "access on (", link("#/api/general", "API > General"), ").");
  } else if (announce) {
    parts.push(" Other computers cannot find this one: that needs external access on (",
               link("#/api/general", "API > General"), ").");
  } else parts.push(" Other computers do not see this one.");
  return parts;
}

export function discovery(app, state) {
  let alive = true;
  let settings = null;
  let api = null;
  let computers = [];
  let nodes = [];
  const fed = feedOrder(); // the feed's discovery settings, newer than an answer after them

  const lineId = uid("discovery-effect");
  const line = el("p", { id: lineId, class: "muted discovery-effect", "aria-live": "polite" });
  const onOff = toggle({
    label: "Find computers on this network",
    text: "Find computers on this network",
    checked: false,
    disabled: app.readOnly,
    save: async (on) => {
      const mark = fed.mark();
      const saved = await app.api.put(SETTINGS, { browse: on, announce: on });
      const stale = fed.since(mark);
      if (!stale) show(saved);
      const now = stale ? settings : saved; // as shown now
      return Boolean(now.browse || now.announce);
    },
  });
  onOff.setAttribute("aria-describedby", lineId);
  const controls = el("div", { class: "discovery-controls stack" },
                      el("div", { class: "row wrap" }, onOff), line);

  const list = el("ul", { class: "plain found", "aria-label": "Computers found on this network" });
  const empty = el("p", { class: "muted found-empty" });
  const found = el("div", { class: "stack" }, list, empty);
  const rows = new Map(); // fingerprint -> its <li> (kept: an open code field survives updates)

  const isAdded = (c) => Boolean(c.added) || nodes.some((n) => n.fingerprint === c.fingerprint);

  // Only a change is written (the line is a live region: the same words are not said twice).
  function drawLine() {
    const parts = effect(settings, api);
    const text = parts.map((p) => (typeof p === "string" ? p : p.textContent)).join("");
    if (text !== line.textContent) line.replaceChildren(...parts);
  }

  function show(next) {
    if (!next || !alive) return;
    settings = next;
    onOff.set(Boolean(next.browse || next.announce));
    drawLine();
    drawFound();
  }

  // The code field Connect opens (made then, gone when it closes: one "Pairing code" on the
  // page at a time). Enter sends it, Escape or Cancel closes it.
  function codeForm(computer, close, connected) {
    const codeId = uid("pairing-code");
    const helpId = uid("pairing-help");
    const code = el("input", { id: codeId, name: "pairingCode", type: "text", inputmode: "numeric",
                               autocomplete: "one-time-code", maxlength: "7", spellcheck: "false",
                               class: "code-input", "aria-describedby": helpId });
    const help = el("span", { id: helpId, class: "help muted",
                              text: `The 6 digits ${computer().name} shows under "Let another ` +
                                    "computer connect\". Enter connects, Escape cancels." });
    const submit = el("button", { type: "submit", class: "primary small" }, "Connect",
                      el("span", { class: "sr-only", text: ` ${computer().name}` }));
    const cancel = el("button", { type: "button", class: "small", text: "Cancel" });
    // The refusal goes under the field's line (the field wrapper is its status's place).
    const field = el("div", { class: "field" }, el("label", { for: codeId, text: "Pairing code" }),
                     el("div", { class: "row wrap" }, code, submit, cancel), help);
    field.input = code;
    const form = el("form", { class: "code-form" }, field);
    cancel.addEventListener("click", () => close(true));
    form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        close(true);
      }
    });
    let busy = false;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (busy) return;
      const { baseUrl, name } = computer();
      const digits = codeDigits(code.value);
      if (!/^\d{6}$/.test(digits)) {
        showError(field, `Type the 6 digits ${name} shows`);
        code.focus();
        return;
      }
      busy = true;
      submit.setAttribute("aria-disabled", "true");
      submit.classList.add("busy");
      clearStatus(field);
      try {
        const node = await app.api.post("/api/v1/nodes", { baseUrl, pairingCode: digits, name });
        if (alive) connected(node);
      } catch (err) {
        if (!alive) return;
        // "pairingCode: the code was not accepted…": the field it names is right here.
        const named = err.param && err.message.startsWith(`${err.param}: `);
        showError(field, named ? err.message.slice(err.param.length + 2) : err.message);
        code.focus();
        code.select();
      } finally {
        busy = false;
        submit.removeAttribute("aria-disabled");
        submit.classList.remove("busy");
      }
    });
    form.code = code;
    return form;
  }

  function row(computer) {
    let li = rows.get(computer.fingerprint);
    if (li) return li;
    let current = computer;
    let form = null;
    const name = el("strong", { class: "node-name" });
    const address = el("span", { class: "muted mono" });
    const version = el("span", { class: "muted small" });
    const badge = el("span", { class: "badge ok", text: "Connected" });
    const objectText = el("span", { class: "sr-only" });
    const connect = el("button", { type: "button", class: "small",
                                   "aria-disabled": app.readOnly ? "true" : undefined },
                       "Connect", objectText);
    const done = el("p", { class: "found-done ok-text small", role: "status" });
    li = el("li", { class: "found-item", tabindex: "-1" },
            el("div", { class: "row wrap" }, name, address, version, el("span", { class: "spacer" }),
               badge, connect),
            done);
    li.dataset.fp = computer.fingerprint;

    const close = (focus) => {
      form?.remove();
      form = null;
      connect.hidden = isAdded(current);
      if (focus && !connect.hidden) connect.focus();
    };
    const connected = (node) => {
      nodes = [...nodes.filter((n) => n.fingerprint !== node.fingerprint), node];
      current = { ...current, added: true };
      close(false);
      done.textContent = `Connected ${node.name}: last in the order`;
      update();
      li.focus();
      state.reload();
    };
    connect.addEventListener("click", () => {
      if (app.readOnly || isAdded(current) || form) return;
      for (const other of rows.values()) if (other !== li) other.closeForm();
      done.textContent = "";
      form = codeForm(() => current, close, connected);
      done.before(form);
      connect.hidden = true;
      form.code.focus();
    });

    const update = (next = current) => {
      current = next;
      const added = isAdded(next);
      name.textContent = next.name;
      address.textContent = next.baseUrl;
      version.textContent = next.version ? `sluice ${next.version}` : "";
      objectText.textContent = ` ${next.name}`;
      badge.hidden = !added;
      if (added && form) close(false);
      connect.hidden = added || Boolean(form);
    };
    li.update = update;
    li.closeForm = () => form && close(false);
    rows.set(computer.fingerprint, li);
    return li;
  }

  function drawFound() {
    for (const fp of [...rows.keys()]) if (!computers.some((c) => c.fingerprint === fp)) rows.delete(fp);
    const items = computers.map((c) => {
      const li = row(c);
      li.update(c);
      return li;
    });
    // Moving a focused item would lose its focus: append only what is not in place.
    items.forEach((li, i) => {
      if (list.children[i] !== li) list.insertBefore(li, list.children[i] ?? null);
    });
    while (list.children.length > items.length) list.lastElementChild.remove();
    list.hidden = computers.length === 0;
    empty.hidden = computers.length > 0;
    if (!settings?.browse) {
      empty.textContent = "None: turn on \"Find computers on this network\" here and on the other " +
                          "computer; the other computer also needs external access (API > General).";
    } else if (!settings.browsing) {
      empty.textContent = "None: this computer looks for others only while load balancing is on.";
    } else {
      empty.textContent = "None found yet. On the other computer, turn on \"Find computers on this " +
                          "network\" and external access (API > General).";
    }
  }

  async function reload() {
    const mark = fed.mark();
    const [mine, others, apiSettings] = await Promise.allSettled(
      [app.api.get(SETTINGS), app.api.get(FOUND), app.api.get(API)]);
    if (!alive) return;
    if (apiSettings.status === "fulfilled") api = apiSettings.value;
    if (others.status === "fulfilled" && Array.isArray(others.value)) computers = others.value;
    if (mine.status === "fulfilled") {
      if (!fed.since(mark)) show(mine.value);
      else drawFound();
    } else {
      line.replaceChildren(`Could not read the discovery settings: ${mine.reason.message}`);
      drawFound();
    }
  }

  // Load balancing or external access changed: what is in effect is the server's to say.
  let rereading = null;
  const reread = () => {
    if (rereading) return;
    rereading = setTimeout(() => {
      rereading = null;
      const mark = fed.mark();
      app.api.get(SETTINGS).then((next) => { if (!fed.since(mark)) show(next); }, () => {});
    }, 100);
  };

  const off = [
    app.feed.on("settings", (event) => {
      if (event?.section === "discovery" && event.value) {
        fed.heard();
        show(event.value);
      } else if (event?.section === "api") {
        if (event.value) api = event.value;
        reread();
      } else if (event?.section === "loadBalancing") reread();
    }),
    app.feed.on("discovered", (data) => {
      if (!Array.isArray(data?.computers)) return;
      computers = data.computers;
      drawFound();
    }),
    app.feed.on("refresh", () => { reload(); }),
  ];
  drawLine();
  drawFound();
  reload();

  return {
    controls,
    found,
    update(data) {
      nodes = data.nodes ?? nodes;
      drawFound();
    },
    close() {
      alive = false;
      clearTimeout(rereading);
      for (const unsubscribe of off) unsubscribe();
    },
  };
}
