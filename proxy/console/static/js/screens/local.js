// Local models: the managed llama.cpp models on demand (state, pid, address, restarts, last
// error)
// and the local backends (kind, online, models, last error), from /api/v1/inference/status
// (or the feed's hello), kept current by the feed's `model` events.

import { breakable, el, errorText, fact, fill, screen, wide } from './common.js';

const STATE_BADGE = { loaded: 'ok', loading: 'warn', unloading: 'warn', failed: 'bad', unloaded: 'muted' };

function badge(text, kind) {
  return el('span', { class: `badge ${kind ?? ''}`.trim(), text });
}

function models(list) {
  if (!list?.length) return el('span', { class: 'muted', text: 'none' });
  return el('ul', { class: 'plain' }, list.map((m) => el('li', {}, el('code', { text: m }))));
}

function lastError(text) {
  return text ? el('span', { class: 'small' }, breakable(text)) : el('span', { class: 'muted', text: '—' });
}

/** One server as a card: its name and state, then its facts. */
function card(name, state, facts) {
  return el('li', { class: 'card stack', 'data-name': name },
    el('h3', { class: 'row wrap' }, el('span', { text: name }), state),
    el('dl', { class: 'facts' }, facts));
}

/** Replace (or add) the entry named `entry.name` in `list`. */
export function upsert(list, entry) {
  const i = list.findIndex((e) => e.name === entry.name);
  const copy = [...list];
  if (i < 0) copy.push(entry); else copy[i] = entry;
  return copy;
}

export function mount(root, app) {
  let alive = true;
  let backends = [];
  let managed = [];

  const managedSection = el('section', { class: 'stack', 'aria-labelledby': 'local-managed' });
  const backendSection = el('section', { class: 'stack', 'aria-labelledby': 'local-backends' });
  screen(root, 'Local models',
    el('p', {}, 'The model servers on this machine. A request is served here first when a '
      + 'local one has its model. They are set in config.yaml (models: and backends:).'),
    managedSection, backendSection);

  function draw() {
    const byName = new Map(backends.map((b) => [b.name, b]));
    const managedNames = new Set(managed.map((m) => m.name));
    fill(managedSection,
      el('h2', { id: 'local-managed', text: 'Managed model servers' }),
      managed.length === 0
        ? el('p', { class: 'muted', text: 'None: no models: entries in config.yaml.' })
        : el('ul', { class: 'plain', 'aria-labelledby': 'local-managed' }, managed.map((m) => card(
          m.name, badge(m.state, STATE_BADGE[m.state]), [
            wide(fact('Address', m.address ? el('code', {}, breakable(m.address)) : el('span', { class: 'muted', text: 'none' }),
              m.transport ? el('span', { class: 'muted', text: ` (${m.transport})` }) : null)),
            fact('Models', models(byName.get(m.name)?.models)),
            fact('Restarts', String(m.restarts ?? 0)),
            fact('PID', m.pid ? String(m.pid) : '—'),
            wide(fact('Last error', lastError(m.lastError))),
          ]))));
    const own = backends.filter((b) => !managedNames.has(b.name));
    fill(backendSection,
      el('h2', { id: 'local-backends', text: 'Local backends' }),
      own.length === 0
        ? el('p', { class: 'muted', text: 'None: no backends: entries in config.yaml.' })
        : el('ul', { class: 'plain', 'aria-labelledby': 'local-backends' }, own.map((b) => card(
          b.name, b.online ? badge('online', 'ok') : badge('offline', 'bad'), [
            fact('Kind', b.kind),
            wide(fact('Address', b.address ? el('code', {}, breakable(b.address)) : el('span', { class: 'muted', text: 'none' }))),
            fact('Models', models(b.models)),
            wide(fact('Last error', lastError(b.lastError))),
          ]))));
  }

  function showStatus(status) {
    backends = Array.isArray(status?.backends) ? status.backends : [];
    managed = Array.isArray(status?.managedModels) ? status.managedModels : [];
    draw();
  }

  async function reload(hello) {
    try {
      const status = hello?.status ?? await app.api.get('/api/v1/inference/status');
      if (alive) showStatus(status);
    } catch (err) {
      if (alive) app.notify(`Could not read the local models: ${errorText(err)}`, 'error');
    }
  }

  const off = [
    app.feed.on('model', (data) => {
      if (!data?.name) return;
      const { source, ...entry } = data;
      if (source === 'managed') managed = upsert(managed, entry);
      else backends = upsert(backends, entry);
      draw();
    }),
    app.feed.on('refresh', (hello) => { reload(hello); }),
  ];
  draw();
  reload(null);
  return () => {
    alive = false;
    for (const unsubscribe of off) unsubscribe();
  };
}
