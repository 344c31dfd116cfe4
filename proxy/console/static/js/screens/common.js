// Small helpers shared by the screen modules: building elements, formatting figures, the
// read-only note. No state lives here.

/**
 * Make an element. `props`: attributes (strings; `true` for a bare attribute, `false` or
 * null to leave it out), `class`, `text` (textContent) and `on` ({event: handler}).
 * Children are nodes or strings; null and false are skipped.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key === 'on') {
      for (const [type, handler] of Object.entries(value)) node.addEventListener(type, handler);
    } else if (key === 'class') node.className = value;
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

let counter = 0;

/** A fresh element id ("help-3"). */
export function uid(prefix = 'id') {
  counter += 1;
  return `${prefix}-s${counter}`;
}

/** Draw a screen: its <h1>, then `children` spaced as a stack. */
export function screen(root, title, ...children) {
  return fill(root, el('h1', { text: title }), el('div', { class: 'stack' }, ...children));
}

/** Replace every child of `node` with `children`. */
export function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

/** One term of a `dl.facts`: `<div><dt>term</dt><dd>…</dd></div>`. */
export function fact(term, ...value) {
  return el('div', {}, el('dt', { text: term }), el('dd', {}, ...value));
}

/** A fact that takes the whole line of its `dl.facts`. */
export function wide(node) {
  node.classList.add('wide');
  return node;
}

/** Append `text` to `node`, each newline as a <br> (the console's CSS has no pre-wrap). */
export function appendText(node, text) {
  const lines = String(text).split('\n');
  lines.forEach((line, i) => {
    if (i > 0) node.append(el('br'));
    if (line) node.append(line);
  });
}

/** `text` as nodes that may wrap after each "/" or ":" (long paths and addresses would
 * otherwise push a narrow screen sideways). */
export function breakable(text) {
  const out = [];
  for (const part of String(text).split(/(?<=[/:])/)) {
    if (out.length) out.push(el('wbr'));
    out.push(part);
  }
  return out;
}

/** A duration in milliseconds for people: "850 ms", "2.31 s", "3 min 5 s". */
export function ms(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return '—';
  // No-break spaces: a figure never wraps away from its unit.
  if (value < 1) return `${value.toFixed(2)}\u00a0ms`;
  if (value < 1000) return `${Math.round(value)}\u00a0ms`;
  if (value < 60000) return `${(value / 1000).toFixed(2)}\u00a0s`;
  const minutes = Math.floor(value / 60000);
  return `${minutes}\u00a0min ${Math.round((value % 60000) / 1000)}\u00a0s`;
}

/** Tokens per second, or "—". */
export function rate(tokens, seconds) {
  if (!Number.isFinite(tokens) || !Number.isFinite(seconds) || seconds <= 0 || tokens <= 0) {
    return '—';
  }
  const r = tokens / seconds;
  return `${r >= 100 ? Math.round(r) : r.toFixed(1)}\u00a0tok/s`;
}

/** An ISO timestamp as local date and time, or "never". */
export function when(iso, never = 'never') {
  if (!iso) return never;
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit',
  });
}

/** An ISO timestamp as local time of day with milliseconds ("14:03:07.120"). */
export function clock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso ?? '');
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** The paragraph a screen shows above controls it disabled for lack of the admin token. */
export function readOnlyNote(app, what) {
  if (!app.readOnly) return null;
  return el('p', { class: 'notice info banner', role: 'note' },
    `Read-only: ${what} needs the admin token. Open the console with the link `
    + 'that "sluice console" prints.');
}

/** The error text of anything thrown by the API client (never more than its message). */
export function errorText(err) {
  if (err && typeof err.message === 'string' && err.message) return err.message;
  return 'the request failed';
}

/** Disable a control (and say why in its description) when the console is read-only. */
export function guard(app, control) {
  if (app.readOnly && control) {
    const input = control.input ?? control;
    input.disabled = true;
  }
  return control;
}

/** The live feed is authoritative for a settings section a screen saves: `heard()` on each
 * of its events, `mark()` when a save is sent, and `since(mark)` when the answer comes says
 * an event came in between; its table is at least as new as the answer's (the save's own
 * event comes in any case), so the answer is not drawn over it. */
export function feedOrder() {
  let events = 0;
  return {
    heard() { events += 1; },
    mark() { return events; },
    since(mark) { return events !== mark; },
  };
}
