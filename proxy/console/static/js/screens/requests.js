// Requests: the live request log (SPEC §9.1), newest first, filtered by model and by who
// served it. The log is read once with GET /api/v1/requests, then each finished request
// arrives as a `request` event of the feed; a `refresh` (a reconnect or a resync) reads it
// again. Nothing polls.

import { clock, el, errorText, fill, ms, rate } from './common.js';

const KEEP = 500; // entries held by the screen (the server keeps its own number)
const ALL = '';

/** Tokens per second of one entry, from the upstream's own usage, or null. */
export function tokensPerSecond(entry) {
  const tokens = entry.usage?.completion_tokens;
  if (!Number.isFinite(tokens) || tokens <= 0) return null;
  // A stream generates between its first byte and its end; a whole answer over all of it.
  const spanMs = entry.stream && Number.isFinite(entry.ttfbMs)
    ? entry.durationMs - entry.ttfbMs : entry.durationMs;
  if (!Number.isFinite(spanMs) || spanMs <= 0) return null;
  return tokens / (spanMs / 1000);
}

function filterSelect(label, id, onChange) {
  const select = el('select', { id, name: id, on: { change: onChange } },
    el('option', { value: ALL, text: 'All' }));
  return { select, wrap: el('div', { class: 'field' }, el('label', { for: id, text: label }), select) };
}

/** Keep a select's options equal to `values` (plus "All"), keeping its choice. */
function syncOptions(select, values) {
  const chosen = select.value;
  const wanted = [ALL, ...[...values].sort()];
  if (chosen !== ALL && !wanted.includes(chosen)) wanted.push(chosen);
  const have = [...select.options].map((o) => o.value);
  if (have.length === wanted.length && have.every((v, i) => v === wanted[i])) return;
  fill(select, wanted.map((v) => el('option', { value: v, text: v === ALL ? 'All' : v })));
  select.value = chosen;
}

function outcomeBadge(entry) {
  const kind = { success: 'ok', failure: 'bad', aborted: 'warn', refused: 'warn' }[entry.outcome] ?? '';
  return el('span', { class: `badge ${kind}`.trim(), text: entry.outcome });
}

function row(entry) {
  const tps = tokensPerSecond(entry);
  const served = el('td', {}, entry.servedBy ?? el('span', { class: 'muted', text: 'none' }));
  if (entry.failover) {
    served.append(' ', el('span', {
      class: 'badge warn', title: `failed over from ${entry.failover}`,
      text: `failover from ${entry.failover}`,
    }));
  }
  const status = el('td', {}, String(entry.status), ' ', outcomeBadge(entry));
  if (entry.error) status.append(' ', el('span', { class: 'muted', text: entry.error }));
  const tokens = entry.usage?.completion_tokens;
  return el('tr', { 'data-id': entry.id },
    el('td', { title: entry.startedAt }, clock(entry.startedAt)),
    el('td', {}, el('code', { text: `${entry.method} ${entry.path}` }),
      entry.stream ? el('span', { class: 'muted', text: ' stream' }) : null),
    el('td', { text: entry.model ?? '—' }),
    served,
    status,
    el('td', { class: 'num', text: ms(entry.ttfbMs) }),
    el('td', { class: 'num', text: ms(entry.durationMs) }),
    el('td', { class: 'num', title: Number.isFinite(tokens) ? `${tokens} completion tokens` : null },
      tps === null ? '—' : rate(tps, 1)),
  );
}

export function mount(root, app) {
  let entries = []; // newest first
  let loading = null; // the ids that arrived live while a read was under way
  let alive = true;

  const model = filterSelect('Model', 'requests-model', render);
  const servedBy = filterSelect('Served by', 'requests-served-by', render);
  const summary = el('p', { class: 'muted' });
  const body = el('tbody');
  const table = el('table', { class: 'table' },
    el('caption', { class: 'sr-only', text: 'Finished requests, newest first' }),
    el('thead', {}, el('tr', {},
      ['Time', 'Request', 'Model', 'Served by', 'Status', 'TTFB', 'Duration', 'Tokens/s']
        .map((h) => el('th', { scope: 'col', text: h })))),
    body);
  const empty = el('p', { class: 'muted', text: 'No requests yet: each one shows here when it finishes.' });

  fill(root,
    el('h1', { text: 'Requests' }),
    el('p', {}, 'Finished requests to the OpenAI API, newest first, as they happen.'),
    el('div', { class: 'filters', role: 'group', 'aria-label': 'Filter requests' }, model.wrap, servedBy.wrap),
    summary,
    el('div', { class: 'table-wrap', role: 'region', 'aria-label': 'Request log', tabindex: '0' }, table),
    empty);

  function matches(entry) {
    return (model.select.value === ALL || entry.model === model.select.value)
      && (servedBy.select.value === ALL || entry.servedBy === servedBy.select.value);
  }

  function updateChrome() {
    syncOptions(model.select, new Set(entries.map((e) => e.model).filter(Boolean)));
    syncOptions(servedBy.select, new Set(entries.map((e) => e.servedBy).filter(Boolean)));
    const shown = body.rows.length;
    summary.textContent = entries.length === shown
      ? `${shown} request${shown === 1 ? '' : 's'}`
      : `${shown} of ${entries.length} requests match the filters`;
    empty.hidden = entries.length > 0;
    table.hidden = entries.length === 0;
  }

  function render() {
    fill(body, entries.filter(matches).map(row));
    updateChrome();
  }

  function add(entry) {
    if (!entry || typeof entry.id !== 'string') return;
    if (loading) { loading.push(entry); return; }
    if (entries.some((e) => e.id === entry.id)) return;
    entries.unshift(entry);
    if (entries.length > KEEP) {
      const gone = entries.splice(KEEP);
      for (const old of gone) body.querySelector(`tr[data-id="${CSS.escape(old.id)}"]`)?.remove();
    }
    if (matches(entry)) body.prepend(row(entry));
    updateChrome();
  }

  async function reload() {
    const pending = [];
    loading = pending;
    try {
      const answer = await app.api.get(`/api/v1/requests?limit=${KEEP}`);
      if (!alive) return;
      const fresh = answer?.requests ?? [];
      const known = new Set(fresh.map((e) => e.id));
      // What finished during the read and is not in it yet is newer than all of it.
      entries = [...pending.filter((e) => !known.has(e.id)).reverse(), ...fresh].slice(0, KEEP);
    } catch (err) {
      if (alive) app.notify(`Could not read the request log: ${errorText(err)}`, 'error');
    } finally {
      if (loading === pending) loading = null;
    }
    if (alive) render();
  }

  const off = [
    app.feed.on('request', (data) => add(data)),
    app.feed.on('refresh', () => { reload(); }),
  ];
  render();
  reload();
  return () => {
    alive = false;
    for (const unsubscribe of off) unsubscribe();
  };
}
