// An on/off switch: a <button role="switch" aria-checked> named by `label`, saved at once
// when flipped (save(checked), async), with "Saved" or the error shown right after it.

import { el, runSave } from "./field.js";

export function toggle({ label, checked = false, save, disabled = false, text }) {
  const button = el("button", { type: "button", class: "switch", role: "switch",
                                "aria-label": label, disabled });
  const track = el("span", { class: "track", "aria-hidden": "true" }, el("span", { class: "thumb" }));
  const state = el("span", { class: "state", "aria-hidden": "true" });
  button.append(track);
  if (text) button.append(el("span", { class: "switch-text", text }));
  button.append(state);
  let value = Boolean(checked);
  let busy = false;
  const draw = (on) => {
    button.setAttribute("aria-checked", on ? "true" : "false");
    state.textContent = on ? "On" : "Off";
  };
  draw(value);
  button.addEventListener("click", async () => {
    if (busy || !save) return;
    busy = true;
    button.setAttribute("aria-busy", "true");
    const next = !value;
    draw(next);
    const result = await runSave(button, save, next);
    if (result.ok) value = typeof result.answer === "boolean" ? result.answer : next;
    draw(value);
    button.removeAttribute("aria-busy");
    busy = false;
  });
  button.set = (on) => {
    value = Boolean(on);
    if (!busy) draw(value);
  };
  Object.defineProperty(button, "checked", { get: () => value });
  return button;
}
