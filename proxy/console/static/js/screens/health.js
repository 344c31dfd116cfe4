// API > Health: the timeouts and the health checks (PUT /api/v1/settings/timeouts), each
// saved when it is changed. A refused value shows the server's message beside the field
// its error.param names, and the server keeps what it had. The two first_byte values that
// do nothing (whole answers use only their total, SPEC §3.2) are marked as such. The live
// feed is authoritative: a save's answer that comes after a newer event is not drawn over it.

import { field, showError } from '../components/field.js';
import { el, errorText, feedOrder, readOnlyNote, screen } from './common.js';

const SETTINGS = '/api/v1/settings/timeouts';
const IDLE = 'Kept in the file; does nothing: whole answers use only their total.';

// The fields, by group: [label, path inside `timeouts`, hint].
export const GROUPS = [
  ['Upstream connection', [
    ['Connection timeout', 'connection', 'Connecting to a model server or node; at most 15s.'],
  ]],
  ['Streaming requests', [
    ['Streaming first byte', 'request.streaming.first_byte', 'The wait for the first event with data (keep-alive comments during a long prompt do not end it); at most 8m.'],
    ['Chunk interval', 'request.streaming.chunk_interval', 'The longest gap between two chunks after the first event with data; 1s to 60s.'],
    ['Streaming total', 'request.streaming.total', 'The whole stream; at most 20m.'],
  ]],
  ['Whole answers', [
    ['Standard total', 'request.standard.total', 'The whole answer; at most 9m.'],
    ['Standard first byte', 'request.standard.first_byte', IDLE],
  ]],
  ['Image generation', [
    ['Image generation total', 'request.image_generation.total', 'The whole answer of /v1/images/*.'],
    ['Image generation first byte', 'request.image_generation.first_byte', IDLE],
  ]],
  ['Health checks', [
    ['Health-check interval', 'health_check.interval', 'How often each node and local backend is asked for its models.'],
    ['Health-check timeout', 'health_check.timeout', 'Each check\'s limit; kept below the interval (else it becomes interval − 1s).'],
  ]],
];

/** The value at a dotted path of a tree, or undefined. */
export function at(tree, path) {
  return path.split('.').reduce((node, key) => (node == null ? undefined : node[key]), tree);
}

/** `{a: {b: value}}` for path "a.b". */
export function nest(path, value) {
  return path.split('.').reduceRight((inner, key) => ({ [key]: inner }), value);
}

/** A duration as the API takes it: a bare number is seconds, anything else goes as typed. */
export function durationValue(text) {
  const trimmed = String(text).trim();
  return /^\d+(\.\d+)?$/.test(trimmed) ? Number(trimmed) : trimmed;
}

export function mount(root, app) {
  let alive = true;
  const fields = new Map(); // dotted YAML path -> field element
  let latest = null; // the tree the feed brought last
  const fed = feedOrder();

  async function save(path, text) {
    const mark = fed.mark();
    try {
      const saved = await app.api.put(SETTINGS, nest(path, durationValue(text)));
      const stale = fed.since(mark); // the feed brought a tree as new or newer since
      if (alive && saved && !stale) show(saved, path);
      return String(at(stale ? latest : saved, path) ?? text); // as the server keeps it
    } catch (err) {
      // The server names the field it refused; that is where its message belongs.
      const named = fields.get(err?.param);
      const own = fields.get(`timeouts.${path}`);
      if (named && named !== own) showError(named, errorText(err));
      throw err;
    }
  }

  const sections = GROUPS.map(([title, entries], i) => {
    const id = `health-group-${i}`;
    const items = entries.map(([label, path, hint]) => {
      const f = field({
        label, name: path, type: 'text', value: '', help: hint,
        hint: hint === IDLE ? 'does nothing' : undefined,
        save: (value) => save(path, value), disabled: app.readOnly,
      });
      fields.set(`timeouts.${path}`, f);
      return f;
    });
    return el('section', { class: 'card stack', 'aria-labelledby': id },
      el('h2', { id, text: title }), el('div', { class: 'grid3' }, items));
  });

  screen(root, 'Health',
    readOnlyNote(app, 'changing timeouts'),
    el('p', {}, 'Durations: 500ms, 30s, 5m, 1h, or a number of seconds. Each is saved when '
      + 'the field loses focus or on Enter and applies to the next request.'),
    sections);

  /** Show the server's values; `except` is the field being saved (it takes its own). */
  function show(tree, except = null) {
    for (const [dotted, f] of fields) {
      const path = dotted.slice('timeouts.'.length);
      const value = at(tree, path);
      if (value !== undefined && path !== except) f.set(String(value));
    }
  }

  function heard(tree) {
    fed.heard();
    latest = tree;
    show(tree);
  }

  async function reload(hello) {
    try {
      const mark = fed.mark();
      const snapshot = hello?.settings?.timeouts;
      const tree = snapshot ?? await app.api.get(SETTINGS);
      if (alive && snapshot) heard(snapshot); // the feed's own snapshot
      else if (alive && tree && !fed.since(mark)) show(tree);
    } catch (err) {
      if (alive) app.notify(`Could not read the timeouts: ${errorText(err)}`, 'error');
    }
  }

  const off = [
    app.feed.on('settings', (data) => {
      if (data?.section === 'timeouts' && data.value) heard(data.value);
    }),
    app.feed.on('refresh', (hello) => { reload(hello); }),
  ];
  reload(null);
  return () => {
    alive = false;
    for (const unsubscribe of off) unsubscribe();
  };
}
