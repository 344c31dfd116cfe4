// A list the user puts in order three ways: dragging an item's handle with the pointer; the
// keyboard on the handle (Space lifts, arrow keys move, Space drops, Escape cancels), each
// step announced in an aria-live region; and Move up / Move down buttons (one pointer, no
// drag: WCAG 2.2 SC 2.5.7). Each drop (or button press) calls save(keys) with the new
// order; the list then shows what save() resolved to (the server's answer), or puts the
// old order back and shows the error.
//
// orderedList({ label, items, key, name, render, save, readOnly }) -> element with
//   .update(items): new items (kept until a lift or drag in progress ends);
//   render(item) -> the item's element, whose optional .update(item, position, count)
//   is called on every layout (position counts from 1).

import { el, showError, showSaved, showSaving, uid } from "./field.js";

export function orderedList({ label, items, key, name, render, save, readOnly = false }) {
  const helpId = uid("order-help");
  const root = el("div", { class: "ordered-list" });
  const help = el("p", { id: helpId, class: "muted small",
                         text: "To reorder with the keyboard, focus a handle, press Space to " +
                               "lift, the arrow keys to move, Space to drop or Escape to cancel." });
  const live = el("div", { class: "sr-only", "aria-live": "assertive", "aria-atomic": "true" });
  const list = el("ol", { class: "order", "aria-label": label });
  const status = el("div", { class: "order-status" });
  root.append(help, list, status, live);
  root.live = live;

  let current = [...items];
  const rows = new Map(); // key -> { li, handle, up, down, body }
  let lifted = null; // { key, before: [keys], pointer: id | null }
  let waiting = null; // items that came while an item was lifted
  let latest = 0; // the number of the last save started
  let inFlight = 0; // saves not answered yet: until then the list keeps the user's order

  const keys = () => current.map(key);
  const itemOf = (k) => current.find((item) => key(item) === k);
  const say = (text) => {
    live.textContent = text;
  };
  const where = (k) => `position ${keys().indexOf(k) + 1} of ${current.length}`;

  function row(item) {
    const k = key(item);
    let entry = rows.get(k);
    if (entry) return entry;
    const handle = el("button", { type: "button", class: "handle", "aria-describedby": helpId,
                                  "aria-disabled": readOnly ? "true" : undefined },
                      el("span", { "aria-hidden": "true", text: "⠿" }));
    const up = el("button", { type: "button", class: "small", "aria-disabled": readOnly ? "true" : undefined });
    const down = el("button", { type: "button", class: "small", "aria-disabled": readOnly ? "true" : undefined });
    up.append(el("span", { "aria-hidden": "true", text: "↑ " }), "Up");
    down.append(el("span", { "aria-hidden": "true", text: "↓ " }), "Down");
    const body = render(item);
    const li = el("li", { class: "order-item" }, handle,
                  el("div", { class: "order-body" }, body),
                  el("div", { class: "order-moves" }, up, down));
    li.dataset.key = k;
    entry = { li, handle, up, down, body };
    rows.set(k, entry);
    handle.addEventListener("keydown", (event) => onKey(k, event));
    handle.addEventListener("pointerdown", (event) => onPointerDown(k, event));
    handle.addEventListener("blur", () => lifted && lifted.pointer == null && !moving && cancel());
    up.addEventListener("click", () => step(k, -1));
    down.addEventListener("click", () => step(k, +1));
    return entry;
  }

  let moving = false;
  function layout() {
    const focused = document.activeElement;
    moving = true;
    const count = current.length;
    current.forEach((item, index) => {
      const entry = row(item);
      const itemName = name(item);
      entry.handle.setAttribute("aria-label", `Reorder ${itemName}`);
      entry.up.setAttribute("aria-label", `Move ${itemName} up`);
      entry.down.setAttribute("aria-label", `Move ${itemName} down`);
      const edge = (end) => (readOnly || end ? "true" : null);
      setOrRemove(entry.up, "aria-disabled", edge(index === 0));
      setOrRemove(entry.down, "aria-disabled", edge(index === count - 1));
      entry.li.classList.toggle("lifted", lifted?.key === key(item));
      entry.handle.setAttribute("aria-pressed", lifted?.key === key(item) ? "true" : "false");
      entry.body.update?.(item, index + 1, count);
      if (list.children[index] !== entry.li) list.insertBefore(entry.li, list.children[index] ?? null);
    });
    for (const [k, entry] of rows) {
      if (!current.some((item) => key(item) === k)) {
        entry.li.remove();
        rows.delete(k);
      }
    }
    if (focused && focused !== document.activeElement && focused.isConnected) focused.focus();
    moving = false;
  }

  function setOrRemove(node, attr, value) {
    if (value === null) node.removeAttribute(attr);
    else node.setAttribute(attr, value);
  }

  function moveTo(k, index) {
    const from = keys().indexOf(k);
    const to = Math.max(0, Math.min(current.length - 1, index));
    if (from < 0 || from === to) return false;
    const [item] = current.splice(from, 1);
    current.splice(to, 0, item);
    layout();
    return true;
  }

  async function commit(before) {
    const order = keys();
    if (order.join("\n") === before.join("\n")) return;
    const mine = ++latest;
    showSaving(status);
    inFlight += 1;
    try {
      const answer = await save(order);
      inFlight -= 1;
      if (mine !== latest) return;
      showSaved(status, "Order saved");
      if (Array.isArray(answer)) update(answer);
    } catch (err) {
      inFlight -= 1;
      if (mine !== latest) return;
      const message = (err && err.message) || String(err);
      showError(status, `Order not saved: ${message}`);
      say(`Order not saved: ${message}`);
      current = before.map(itemOf).filter(Boolean);
      layout();
    }
  }

  function lift(k, pointer = null) {
    lifted = { key: k, before: keys(), pointer };
    layout();
    say(`${name(itemOf(k))} lifted, ${where(k)}`);
  }

  function drop() {
    const { key: k, before } = lifted;
    lifted = null;
    layout();
    say(`${name(itemOf(k))} dropped, ${where(k)}`);
    commit(before);
    flushWaiting();
  }

  function cancel() {
    const { key: k, before } = lifted;
    lifted = null;
    current = before.map(itemOf).filter(Boolean);
    layout();
    say(`${name(itemOf(k))} reorder cancelled, back at ${where(k)}`);
    flushWaiting();
  }

  function onKey(k, event) {
    if (readOnly) return;
    if (event.key === " " || event.key === "Spacebar") {
      event.preventDefault();
      if (lifted && lifted.key === k) drop();
      else if (!lifted) lift(k);
      return;
    }
    if (!lifted || lifted.key !== k) return;
    const delta = { ArrowUp: -1, ArrowLeft: -1, ArrowDown: 1, ArrowRight: 1 }[event.key];
    if (delta) {
      event.preventDefault();
      moveTo(k, keys().indexOf(k) + delta);
      say(`${name(itemOf(k))} moved, ${where(k)}`);
    } else if (event.key === "Escape") {
      event.preventDefault();
      cancel();
    } else if (event.key === "Tab") {
      cancel();
    }
  }

  // A drag follows the pointer on the whole window (moving the item in the list would end
  // a pointer capture on its handle).
  const dragEvents = {
    pointermove: (event) => onPointerMove(event),
    pointerup: (event) => event.pointerId === lifted?.pointer && endDrag(drop),
    pointercancel: (event) => event.pointerId === lifted?.pointer && endDrag(cancel),
  };

  function endDrag(finish) {
    for (const [type, listener] of Object.entries(dragEvents)) window.removeEventListener(type, listener);
    finish();
  }

  function onPointerDown(k, event) {
    if (readOnly || lifted || event.button !== 0) return;
    event.preventDefault();
    event.currentTarget.focus();
    for (const [type, listener] of Object.entries(dragEvents)) window.addEventListener(type, listener);
    lift(k, event.pointerId);
  }

  function onPointerMove(event) {
    if (!lifted || lifted.pointer !== event.pointerId) return;
    const k = lifted.key;
    for (const [other, entry] of rows) {
      if (other === k) continue;
      const box = entry.li.getBoundingClientRect();
      if (event.clientY >= box.top && event.clientY <= box.bottom) {
        if (moveTo(k, keys().indexOf(other))) say(`${name(itemOf(k))} moved, ${where(k)}`);
        return;
      }
    }
  }

  function step(k, delta) {
    if (readOnly || lifted) return;
    const before = keys();
    if (!moveTo(k, before.indexOf(k) + delta)) return;
    say(`${name(itemOf(k))} moved, ${where(k)}`);
    commit(before);
  }

  function flushWaiting() {
    if (waiting) {
      const next = waiting;
      waiting = null;
      update(next);
    }
  }

  function update(next) {
    if (lifted) {
      waiting = next;
      return;
    }
    if (inFlight) {
      // The items' news, in the order being saved (its answer then puts the server's).
      const order = keys();
      const rank = (item) => {
        const at = order.indexOf(key(item));
        return at < 0 ? order.length : at;
      };
      current = [...next].sort((a, b) => rank(a) - rank(b));
    } else {
      current = [...next];
    }
    layout();
  }

  root.update = update;
  layout();
  return root;
}
