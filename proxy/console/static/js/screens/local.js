// Local models (SPEC §10, §11): the managed models on demand — the memory the loaded ones
// take against the budget (and the count against max_loaded), then each model with its
// state, its memory (measured once loaded, else "~" its estimate), a live "unloads in …",
// and Load / Unload — then the local backends (kind, online, models, last error); each
// model and backend with its APIs (SPEC §17.1: Messages, Responses relayed or translated). Above
// the budget: which compute backends the bundled llama.cpp has (SPEC §11.1: CPU, CUDA, …).
// Read from GET /api/v1/models/local and /api/v1/inference/status (or the feed's hello),
// kept current by the feed's `model` events. A managed model's idle clock moves without an
// event (a request ends), and an event may reach the page after the answer of a later GET
// or load: so the list is read again shortly after each managed model's event, each of its
// finished requests and each Load / Unload (once per REREAD_MS at most).

import { action } from '../components/action.js';
import { meter } from '../components/meter.js';
import { breakable, el, errorText, fact, fill, readOnlyNote, screen, uid, wide } from './common.js';

const LOCAL = '/api/v1/models/local';
const STATE_BADGE = { loaded: 'ok', loading: 'warn', unloading: 'warn', failed: 'bad', unloaded: '' };
const REREAD_MS = 300; // the wait before reading the list again (see above)
const NBSP = '\u00a0';
// llama.cpp's compute backends as their makers write them (others: as the API names them).
const BACKEND_NAMES = { cpu: 'CPU', cuda: 'CUDA', metal: 'Metal', vulkan: 'Vulkan', rocm: 'ROCm',
  blas: 'BLAS', sycl: 'SYCL', opencl: 'OpenCL', cann: 'CANN', musa: 'MUSA' };

/** `llamaBackends` of GET /api/v1/models/local as words: "CUDA, CPU"; null: not installed. */
export function llamaBackends(list) {
  if (!Array.isArray(list)) return null;
  return list.map((name) => BACKEND_NAMES[name] ?? name).join(', ');
}

/** Bytes for people, binary units: "512 B", "98.4 MiB", "1.20 GiB". */
export function bytes(n) {
  if (!Number.isFinite(n) || n < 0) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  const digits = unit === 0 ? 0 : value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)}${NBSP}${units[unit]}`;
}

/** A keep_alive in seconds as config.yaml would say it: "5m", "90s", "1h"; null: forever. */
export function keepAlive(seconds) {
  if (seconds === null || seconds === undefined) return 'forever';
  if (seconds >= 3600 && seconds % 3600 === 0) return `${seconds / 3600}h`;
  if (seconds >= 60 && seconds % 60 === 0) return `${seconds / 60}m`;
  return `${Number(seconds.toFixed(3))}s`;
}

/** Time left, whole seconds rounded up: "42s", "4m 12s", "1h 5m". */
export function left(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  if (s >= 3600) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  if (s >= 60) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${s}s`;
}

/** What a model's idle clock says at `now` (ms since the epoch), or '' for nothing. */
export function idle(entry, now) {
  if (entry.state !== 'loaded') return '';
  if (entry.activeRequests > 0) {
    return entry.activeRequests === 1 ? 'in use (1 request)' : `in use (${entry.activeRequests} requests)`;
  }
  if (entry.keepAlive === null || entry.keepAlive === undefined) return 'kept loaded';
  const at = entry.unloadsAt ? Date.parse(entry.unloadsAt) : NaN;
  if (Number.isNaN(at)) return '';
  return at - now <= 0 ? 'unloads now' : `unloads in ${left(at - now)}`;
}

/** Replace (or add) the entry named `entry.name` in `list`. */
export function upsert(list, entry) {
  const i = list.findIndex((e) => e.name === entry.name);
  const copy = [...list];
  if (i < 0) copy.push(entry); else copy[i] = entry;
  return copy;
}

/** SPEC §17.1: Messages and Responses relayed (native) or translated to Chat Completions. */
function apisText(apis) {
  const word = (mode) => mode ?? 'not known yet';
  return `Messages ${word(apis.messages)}, Responses ${word(apis.responses)}`;
}

function badge(text, kind) {
  return el('span', { class: `badge ${kind ?? ''}`.trim(), text });
}

function models(list) {
  if (!list?.length) return el('span', { class: 'muted', text: 'none' });
  return el('ul', { class: 'plain' }, list.map((m) => el('li', {}, el('code', { text: m }))));
}

/** The fact that says what the bundled llama.cpp runs on (hidden until known). */
function llamaFact(node, list) {
  const words = llamaBackends(list);
  node.hidden = list === undefined;
  fill(node, fact('llama.cpp backends', words
    ? el('span', { class: 'llama-backends', text: words })
    : el('span', { class: 'muted', text: 'none: llama.cpp is not installed (or could not say '
      + 'which backends it has: see the gateway\'s log)' })));
}

function lastError(text) {
  return text ? el('span', { class: 'small' }, breakable(text)) : el('span', { class: 'muted', text: '—' });
}

/** The memory a model takes: measured once loaded, else its estimate. */
function memory(entry) {
  if (entry.state === 'loaded' && entry.memoryBytes > 0) return bytes(entry.memoryBytes);
  if (!(entry.estimatedBytes > 0)) return el('span', { class: 'muted', text: 'unknown' });
  return [`~${bytes(entry.estimatedBytes)}`, el('span', { class: 'muted', text: ' estimate' })];
}

/** The context one request can use (SPEC §17.2): its server's once loaded, else planned. */
export function context(entry) {
  if (!(entry.contextLength > 0)) return el('span', { class: 'muted', text: 'unknown' });
  const tokens = `${entry.contextLength.toLocaleString('en-US')} tokens`;
  if (entry.state === 'loaded') return tokens;
  return [tokens, el('span', { class: 'muted', text: ' planned' })];
}

/** One managed model's card: kept across updates, so its button keeps focus and status. */
function modelCard(app, name, changed) {
  let entry = { name, state: 'unloaded' };
  const heading = el('h3', { class: 'model-name', text: name });
  const state = el('span', { class: 'badge' });
  const clock = el('span', { class: 'countdown muted' });
  const call = (verb) => async () => {
    const answer = await app.api.post(`${LOCAL}/${encodeURIComponent(name)}/${verb}`);
    if (answer?.name === name) changed(answer);
  };
  const button = action({ text: 'Load', object: name, busyText: 'Loading…', run: call('load'),
    disabled: app.readOnly });
  const facts = el('dl', { class: 'facts' });
  const node = el('li', { class: 'card stack model', 'data-name': name },
    el('div', { class: 'row wrap model-head' }, heading, state, clock, el('span', { class: 'spacer' }), button),
    button.status, facts);

  function tick(now) {
    const text = idle(entry, now);
    if (clock.textContent !== text) clock.textContent = text;
  }

  function update(next) {
    // A past call's error no longer applies once the model is loaded or unloaded since.
    if (next.state !== entry.state && (next.state === 'loaded' || next.state === 'unloaded')) button.clear();
    entry = next;
    state.className = `badge ${STATE_BADGE[entry.state] ?? ''}`.trim();
    state.textContent = entry.state;
    const loadedish = entry.state === 'loaded' || entry.state === 'unloading';
    button.set(loadedish
      ? { text: 'Unload', busyText: 'Unloading…', run: call('unload'), busy: entry.state === 'unloading' }
      : { text: 'Load', busyText: 'Loading…', run: call('load'), busy: entry.state === 'loading' });
    node.setAttribute('aria-busy', entry.state === 'loading' || entry.state === 'unloading' ? 'true' : 'false');
    fill(facts,
      fact('Memory', memory(entry)),
      fact('Context', context(entry)),
      fact('Keep alive', keepAlive(entry.keepAlive), entry.preload ? el('span', { class: 'muted', text: ', preloaded' }) : null),
      fact('In flight', String(entry.activeRequests ?? 0)),
      fact('Waiting', String(entry.waiting ?? 0)),
      fact('PID', entry.pid ? String(entry.pid) : '—'),
      fact('Restarts', String(entry.restarts ?? 0)),
      fact('From', entry.source === 'config' ? 'config.yaml' : 'models folder'),
      fact('Engine', entry.engine === 'command' ? 'your command' : 'bundled llama.cpp',
        entry.kind && entry.kind !== 'llm' ? el('span', { class: 'muted', text: `, ${entry.kind}` }) : null),
      entry.apis ? fact('APIs', apisText(entry.apis)) : null,
      entry.path ? wide(fact('File', el('code', {}, breakable(entry.path)))) : null,
      entry.address ? wide(fact('Address', el('code', {}, breakable(entry.address)),
        entry.transport ? el('span', { class: 'muted', text: ` (${entry.transport})` }) : null)) : null,
      entry.lastError ? wide(fact('Last error', lastError(entry.lastError))) : null,
      entry.lastError && entry.log ? wide(fact('Log', el('code', {}, breakable(entry.log)))) : null);
    tick(Date.now());
  }

  return { node, update, tick };
}

export function mount(root, app) {
  let alive = true;
  let backends = [];
  let managed = []; // the entries of GET /api/v1/models/local, in its order
  let budget = { memoryBudget: null, maxLoaded: 0 };
  let reread = null; // the timer of a pending re-read (readSoon)
  let known = false; // read once: until then "None" would be a guess
  const cards = new Map(); // name -> modelCard
  let queue = { models: [], longestMs: 0 }; // the last queue event (SPEC §18)
  const queueText = el('p', { class: 'queue-line', role: 'status' });

  const memoryLabel = el('span', { id: uid('local-memory'), class: 'budget-label', text: 'Memory in use' });
  const memoryText = el('span', { class: 'budget-text' });
  const countText = el('span', { class: 'muted' });
  const pendingText = el('p', { class: 'muted small' });
  const bar = meter({ labelledBy: memoryLabel.id });
  const budgetBox = el('div', { class: 'card stack budget', role: 'group', 'aria-label': 'Memory budget' },
    el('div', { class: 'row wrap' }, memoryLabel, memoryText, countText), bar, pendingText);
  const llamaFacts = el('dl', { class: 'facts llama', hidden: true });
  const list = el('ul', { class: 'plain models', 'aria-labelledby': 'local-managed' });
  const empty = el('p', { class: 'muted', text: 'None: no models: entries in config.yaml and no '
    + '.gguf file in the models folders (model_loading.dirs).' });
  const rescan = action({
    text: 'Rescan folders', busyText: 'Rescanning…', disabled: app.readOnly,
    run: async () => {
      const answer = await app.api.post(`${LOCAL}/rescan`);
      if (alive) showLocal(answer);
      const found = [...(answer?.added ?? []).map((n) => `found ${n}`),
        ...(answer?.removed ?? []).map((n) => `${n} is gone`)];
      return found.length ? `Rescanned: ${found.join(', ')}` : 'Rescanned: nothing new';
    },
  });
  const managedSection = el('section', { class: 'stack', 'aria-labelledby': 'local-managed' },
    el('div', { class: 'row wrap heading-row' },
      el('h2', { id: 'local-managed', text: 'Managed models' }), el('span', { class: 'spacer' }), rescan),
    rescan.status,
    el('p', { class: 'muted' }, 'Each runs in its own llama.cpp server, started when a request '
      + 'needs it and stopped once idle for its keep alive; the loaded ones must fit the memory budget.'),
    llamaFacts, budgetBox, queueText, list, empty);
  const backendSection = el('section', { class: 'stack', 'aria-labelledby': 'local-backends' });
  screen(root, 'Local models',
    readOnlyNote(app, 'loading or unloading a model'),
    el('p', {}, 'The model servers on this machine. A request is served here first when a '
      + 'local one has its model. They are set in config.yaml (models:, model_loading: and backends:).'),
    managedSection, backendSection);

  function drawBudget() {
    const loaded = managed.filter((m) => m.state === 'loaded');
    const inUse = loaded.reduce((sum, m) => sum + (m.memoryBytes || 0), 0);
    const loading = managed.filter((m) => m.state === 'loading');
    const reserved = loading.reduce((sum, m) => sum + (m.estimatedBytes || 0), 0);
    const max = budget.memoryBudget;
    const text = Number.isFinite(max) ? `${bytes(inUse)} of ${bytes(max)} budget` : bytes(inUse);
    memoryText.textContent = text;
    countText.textContent = budget.maxLoaded > 0
      ? `${loaded.length} of at most ${budget.maxLoaded} loaded`
      : `${loaded.length} loaded`;
    bar.set({ value: inUse, pending: reserved, max: max ?? 0, text });
    pendingText.textContent = loading.length
      ? `Loading ${loading.map((m) => m.name).join(', ')}: ~${bytes(reserved)} more once loaded`
      : '';
    pendingText.hidden = loading.length === 0;
  }

  function drawManaged() {
    const names = managed.map((m) => m.name);
    for (const [name, card] of cards) {
      if (!names.includes(name)) { card.node.remove(); cards.delete(name); }
    }
    for (const entry of managed) {
      let card = cards.get(entry.name);
      if (!card) {
        card = modelCard(app, entry.name, (answer) => { if (alive) changed(answer); });
        cards.set(entry.name, card);
      }
      card.update(entry);
    }
    // Moved only when the order differs: moving a card would take the focus off its button.
    const shown = [...list.children].map((li) => li.dataset.name);
    if (shown.join('\n') !== names.join('\n')) fill(list, names.map((n) => cards.get(n).node));
    list.hidden = managed.length === 0;
    empty.hidden = managed.length > 0 || !known;
    budgetBox.hidden = managed.length === 0;
    drawBudget();
  }

  function drawBackends() {
    const managedNames = new Set(managed.map((m) => m.name));
    const own = backends.filter((b) => !managedNames.has(b.name));
    fill(backendSection,
      el('h2', { id: 'local-backends', text: 'Local backends' }),
      own.length === 0
        ? el('p', { class: 'muted', text: 'None: no backends: entries in config.yaml.' })
        : el('ul', { class: 'plain', 'aria-labelledby': 'local-backends' }, own.map((b) => el('li',
          { class: 'card stack', 'data-name': b.name },
          el('div', { class: 'row wrap model-head' }, el('h3', { text: b.name }),
            b.online ? badge('online', 'ok') : badge('offline', 'bad')),
          el('dl', { class: 'facts' },
            fact('Kind', b.kind),
            b.apis ? fact('APIs', apisText(b.apis)) : null,
            wide(fact('Address', b.address ? el('code', {}, breakable(b.address)) : el('span', { class: 'muted', text: 'none' }))),
            fact('Models', models(b.models)),
            wide(fact('Last error', lastError(b.lastError))))))));
  }

  /** Each model's waiting requests and the longest wait (SPEC §18), from queue events. */
  function drawQueue() {
    const waiting = (queue.models ?? []).filter((m) => m.waiting.interactive + m.waiting.batch > 0);
    queueText.textContent = waiting.length === 0
      ? 'Queue: no request is waiting for a slot.'
      : `Queue: ${waiting.map((m) => `${m.model} ${m.waiting.interactive + m.waiting.batch} waiting`
        + (m.waiting.batch ? ` (${m.waiting.batch} batch)` : '')).join(', ')}; `
        + `longest wait ${Math.round((queue.longestMs ?? 0) / 1000)} s`;
  }

  /** A managed model's newer entry (an event, or a load's or unload's answer). */
  function changed(entry) {
    if (entry.state === 'removed') managed = managed.filter((m) => m.name !== entry.name);
    else managed = upsert(managed, entry);
    drawManaged();
    drawBackends();
    readSoon();
  }

  function readSoon() {
    if (reread === null) reread = setTimeout(() => { reread = null; readLocal(); }, REREAD_MS);
  }

  function showLocal(doc) {
    managed = Array.isArray(doc?.models) ? doc.models : [];
    known = true;
    budget = { memoryBudget: doc?.memoryBudget ?? null, maxLoaded: doc?.maxLoaded ?? 0 };
    llamaFact(llamaFacts, doc?.llamaBackends);
    drawManaged();
    drawBackends();
  }

  async function readLocal() {
    try {
      const doc = await app.api.get(LOCAL);
      if (alive) showLocal(doc);
    } catch (err) {
      if (alive) app.notify(`Could not read the managed models: ${errorText(err)}`, 'error');
    }
  }

  async function reload(hello) {
    try {
      const [doc, status] = await Promise.all([
        hello?.localModels ?? app.api.get(LOCAL),
        hello?.status ?? app.api.get('/api/v1/inference/status'),
      ]);
      if (!alive) return;
      backends = Array.isArray(status?.backends) ? status.backends : [];
      showLocal(doc);
    } catch (err) {
      if (alive) app.notify(`Could not read the local models: ${errorText(err)}`, 'error');
    }
  }

  const off = [
    app.feed.on('model', (data) => {
      if (!data?.name) return;
      const { source, origin, ...entry } = data;
      if (source === 'managed') {
        changed(origin ? { ...entry, source: origin } : entry);
      } else {
        backends = upsert(backends, entry);
        drawBackends();
      }
    }),
    // A request for a managed model ended: its idle clock starts again (no state changes).
    app.feed.on('request', (data) => {
      if (managed.some((m) => m.name === data?.model)) readSoon();
    }),
    app.feed.on('queue', (data) => {
      queue = data ?? { models: [], longestMs: 0 };
      const counts = new Map((queue.models ?? []).map((m) => [m.model, m.waiting.interactive + m.waiting.batch]));
      managed = managed.map((m) => ({ ...m, waiting: counts.get(m.name) ?? 0 }));
      drawQueue();
      drawManaged();
    }),
    app.feed.on('refresh', (hello) => { reload(hello); }),
  ];
  const ticker = setInterval(() => {
    const now = Date.now();
    for (const card of cards.values()) card.tick(now);
  }, 1000);
  drawManaged();
  drawBackends();
  drawQueue();
  reload(null);
  return () => {
    alive = false;
    clearInterval(ticker);
    clearTimeout(reread);
    for (const unsubscribe of off) unsubscribe();
  };
}
