// A labelled field saved when it loses focus or on Enter (no save button), with "Saved" or
// the server's error shown beside it; select() is the same for a choice; showSaved() and
// showError() give any other control the same status line.

let counter = 0;

export function uid(prefix = "c") {
  counter += 1;
  return `${prefix}-${counter}`;
}

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// The status line of a control: right after a form control, else inside the element.
function statusOf(control) {
  if (control.saveStatus) return control.saveStatus;
  const status = el("span", { class: "save-status", role: "status", "aria-live": "polite",
                              id: uid("status") });
  control.saveStatus = status;
  if (control.matches("input, select, textarea, button")) control.after(status);
  else control.append(status);
  return status;
}

function inputOf(control) {
  return control.input ?? (control.matches("input, select, textarea, button") ? control : null);
}

export function showSaving(control) {
  const status = statusOf(control);
  status.className = "save-status muted";
  status.textContent = "Saving…";
}

export function showSaved(control, text = "Saved") {
  const status = statusOf(control);
  status.className = "save-status ok";
  status.textContent = text;
  inputOf(control)?.removeAttribute("aria-invalid");
}

export function showError(control, message) {
  const status = statusOf(control);
  status.className = "save-status bad";
  status.textContent = message;
  const input = inputOf(control);
  if (input) {
    input.setAttribute("aria-invalid", "true");
    const described = new Set((input.getAttribute("aria-describedby") || "").split(" "));
    described.add(status.id);
    input.setAttribute("aria-describedby", [...described].filter(Boolean).join(" "));
  }
}

export function clearStatus(control) {
  if (!control.saveStatus) return;
  control.saveStatus.textContent = "";
  inputOf(control)?.removeAttribute("aria-invalid");
}

// Runs save(value) with the status shown; resolves true when it was saved.
export async function runSave(control, save, value) {
  showSaving(control);
  try {
    const answer = await save(value);
    showSaved(control);
    return { ok: true, answer };
  } catch (err) {
    showError(control, (err && err.message) || String(err));
    return { ok: false };
  }
}

function described(input, texts) {
  const ids = [];
  const nodes = [];
  for (const [cls, text] of texts) {
    if (!text) continue;
    const note = el("span", { class: cls, id: uid("note"), text });
    ids.push(note.id);
    nodes.push(note);
  }
  if (ids.length) input.setAttribute("aria-describedby", ids.join(" "));
  return nodes;
}

export function field({ label, name, value = "", type = "text", hint, help, save,
                        disabled = false, placeholder, autocomplete = "off" }) {
  const id = uid(name || "field");
  const input = el("input", { id, name, type, placeholder, autocomplete, disabled,
                              readonly: save ? undefined : true });
  input.value = value ?? "";
  const wrapper = el("div", { class: "field" });
  const labelEl = el("label", { for: id, text: label });
  const notes = described(input, [["hint badge", hint], ["help muted", help]]);
  wrapper.append(labelEl, ...notes.filter((n) => n.classList.contains("hint")), input,
                 ...notes.filter((n) => n.classList.contains("help")));
  let saved = input.value;
  let busy = false;
  const commit = async () => {
    if (!save || busy || input.value === saved) return;
    busy = true;
    const value = input.value;
    const result = await runSave(wrapper, save, value);
    busy = false;
    if (result.ok) {
      saved = typeof result.answer === "string" ? result.answer : value;
      if (input.value === value) input.value = saved;
    }
  };
  input.addEventListener("blur", commit);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      commit();
    }
  });
  wrapper.input = input;
  wrapper.set = (next) => {
    const text = next ?? "";
    const dirty = input.value !== saved;
    saved = String(text);
    if (!(dirty && document.activeElement === input)) input.value = saved;
  };
  return wrapper;
}

export function select({ label, name, options, value, save, help, disabled = false }) {
  const id = uid(name || "select");
  const input = el("select", { id, name, disabled });
  for (const option of options) {
    const item = typeof option === "string" ? { value: option, label: option } : option;
    input.append(el("option", { value: item.value, text: item.label }));
  }
  input.value = value;
  const wrapper = el("div", { class: "field" });
  const notes = described(input, [["help muted", help]]);
  wrapper.append(el("label", { for: id, text: label }), input, ...notes);
  let saved = value;
  input.addEventListener("change", async () => {
    const chosen = input.value;
    const result = await runSave(wrapper, save, chosen);
    if (result.ok) saved = typeof result.answer === "string" ? result.answer : chosen;
    else input.value = saved;
  });
  wrapper.input = input;
  wrapper.set = (next) => {
    saved = next;
    input.value = next;
  };
  return wrapper;
}
