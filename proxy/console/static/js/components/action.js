// A button that runs one call on the gateway (Load / Unload a model, Rescan): its visible
// text is a verb, its accessible name the verb and what it acts on ("Load smollm2", the
// object as screen-reader-only text). While the call runs the button is busy: the busy text
// with a spinner, aria-busy and aria-disabled (it keeps focus; a second press does nothing).
// A failed call's message shows in the action's status line (`.status`, placed by the
// caller; the button is described by it); the next press clears it.
//
// action({ text, object, busyText, run, disabled }) -> <button> with
//   .set({ text, object, busyText, run, disabled, busy })  what it shows and does next
//       (`busy`: shown busy though no call of its own runs, e.g. a load someone else began);
//       while its own call runs, the values are kept and shown once the call ends;
//   .status   the status line (a <div class="form-status">); .clear() empties it;
//   .running  true while its own call runs.
// run() may resolve a string: it is shown as the status line's success text.

import { clearStatus, el, showError, showSaved, uid } from "./field.js";

export function action({ text, object = "", busyText = "Working…", run, disabled = false,
                         className = "small" }) {
  const label = el("span", { class: "action-text" });
  const named = el("span", { class: "sr-only" });
  const button = el("button", { type: "button", class: `action ${className}`.trim() }, label, named);
  const status = el("div", { class: "form-status action-status", id: uid("action") });
  showSaved(status, "");  // the live region exists before it has anything to say
  clearStatus(status);
  button.setAttribute("aria-describedby", status.id);
  let shown = { text, object, busyText, run, disabled, busy: false };
  let running = false;

  const draw = () => {
    const busy = running || shown.busy;
    label.textContent = busy ? shown.busyText : shown.text;
    named.textContent = shown.object ? ` ${shown.object}` : "";
    button.classList.toggle("busy", busy);
    if (busy) button.setAttribute("aria-busy", "true");
    else button.removeAttribute("aria-busy");
    // aria-disabled, not disabled: a focused button keeps its focus while it is busy.
    if (busy || shown.disabled || !shown.run) button.setAttribute("aria-disabled", "true");
    else button.removeAttribute("aria-disabled");
  };

  button.addEventListener("click", async () => {
    if (running || shown.busy || shown.disabled || !shown.run) return;
    running = true;
    clearStatus(status);
    draw();
    try {
      const answer = await shown.run();
      if (typeof answer === "string" && answer) showSaved(status, answer);
    } catch (err) {
      showError(status, (err && err.message) || String(err));
    } finally {
      running = false;
      draw();
    }
  });

  button.set = (next) => {
    shown = { ...shown, busy: false, ...next };
    draw();
  };
  button.status = status;
  button.clear = () => clearStatus(status);
  Object.defineProperty(button, "running", { get: () => running });
  draw();
  return button;
}
