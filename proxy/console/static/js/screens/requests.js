// Requests: the live request log (SPEC §9.1), newest first, filtered by model and by who
// served it. The log is read once with GET /api/v1/requests, then each finished request
// arrives as a `request` event of the feed; a `refresh` (a reconnect or a resync) reads it
// again. Nothing polls.

import { clock, el, errorText, fact, fill, ms, rate, screen, wide } from './common.js';

const KEEP = 500; // entries held by the screen (the server keeps its own number)
const ALL = '';
const NARROW = '(max-width: 600px)'; // below this, cards instead of a table

/** Tokens per second of one entry, from the upstream's own usage (Chat Completions'
 * completion_tokens, or the Responses and Anthropic APIs' output_tokens), or null. */
export function tokensPerSecond(entry) {
  const usage = entry.usage;
  const tokens = usage?.completion_tokens ?? usage?.output_tokens;
  if (!Number.isFinite(tokens) || tokens <= 0) return null;
  // A stream generates between its first token (its first event with data: keep-alive
  // comments before it are no progress) and its end; a whole answer over all of it.
  const first = Number.isFinite(entry.ttftMs) ? entry.ttftMs : entry.ttfbMs;
  const spanMs = entry.stream && Number.isFinite(first)
    ? entry.durationMs - first : entry.durationMs;
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

function servedCell(entry) {
  const parts = [entry.servedBy ?? el('span', { class: 'muted', text: 'none' })];
  if (entry.failover) {
    parts.push(' ', el('span', { class: 'badge warn', text: `failover from ${entry.failover}` }));
  }
  if (entry.affinity) {  // cache-aware routing's reason (SPEC §15), and what the cache served
    const cached = entry.cachedTokens === null || entry.cachedTokens === undefined
      ? '' : `, ${entry.cachedTokens} prompt tokens cached`;
    parts.push(' ', el('span', { class: 'badge', text: `${entry.affinity}${cached}` }));
  }
  return parts;
}

function statusCell(entry) {
  return [String(entry.status), ' ', outcomeBadge(entry),
    entry.error ? el('span', { class: 'muted', text: ` ${entry.error}` }) : null];
}

function requestCell(entry) {
  // Nearly everything is a POST: the method shows only when it is not.
  return [el('code', { text: entry.method === 'POST' ? entry.path : `${entry.method} ${entry.path}` }),
    entry.stream ? el('span', { class: 'muted', text: ' stream' }) : null];
}

function tokensCell(entry) {
  const tps = tokensPerSecond(entry);
  return tps === null ? '—' : rate(tps, 1);
}

/** One entry as a table row (wide screens). */
function row(entry) {
  return el('tr', { 'data-id': entry.id },
    el('td', { title: entry.startedAt }, clock(entry.startedAt)),
    el('td', {}, requestCell(entry)),
    el('td', { text: entry.model ?? '—' }),
    el('td', {}, servedCell(entry)),
    el('td', {}, statusCell(entry)),
    el('td', { text: ms(entry.ttfbMs) }),
    el('td', { text: ms(entry.ttftMs) }),
    el('td', { text: ms(entry.durationMs) }),
    el('td', {}, tokensCell(entry)));
}

/** One entry as a small card (narrow screens: a table would need sideways scrolling). */
function item(entry) {
  return el('li', { class: 'card', 'data-id': entry.id },
    el('p', {}, el('strong', { text: entry.model ?? '—' }), ' ', statusCell(entry)),
    el('dl', { class: 'facts' },
      wide(fact('Served by', servedCell(entry))),
      fact('Time', clock(entry.startedAt)),
      fact('TTFB', ms(entry.ttfbMs)),
      fact('TTFT', ms(entry.ttftMs)),
      fact('Duration', ms(entry.durationMs)),
      fact('Tokens/s', tokensCell(entry)),
      wide(fact('Request', requestCell(entry)))));
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
      ['Time', 'Request', 'Model', 'Served by', 'Status', 'TTFB', 'TTFT', 'Duration', 'Tokens/s']
        .map((h) => el('th', { scope: 'col', text: h })))),
    body);
  const list = el('ul', { class: 'plain', 'aria-label': 'Finished requests, newest first' });
  const narrow = window.matchMedia(NARROW);
  const empty = el('p', { class: 'muted', text: 'No requests yet: each one shows here when it finishes.' });

  screen(root, 'Requests',
    el('p', {}, 'Finished requests to the OpenAI API, newest first, as they happen.'),
    el('div', { class: 'row wrap', role: 'group', 'aria-label': 'Filter requests' }, model.wrap, servedBy.wrap),
    summary,
    el('div', { class: 'table-wrap', role: 'region', 'aria-label': 'Request log', tabindex: '0' }, table),
    list, empty);

  function matches(entry) {
    return (model.select.value === ALL || entry.model === model.select.value)
      && (servedBy.select.value === ALL || entry.servedBy === servedBy.select.value);
  }

  function updateChrome() {
    syncOptions(model.select, new Set(entries.map((e) => e.model).filter(Boolean)));
    syncOptions(servedBy.select, new Set(entries.map((e) => e.servedBy).filter(Boolean)));
    const shown = (narrow.matches ? list : body).children.length;
    summary.textContent = entries.length === shown
      ? `${shown} request${shown === 1 ? '' : 's'}`
      : `${shown} of ${entries.length} requests match the filters`;
    empty.hidden = entries.length > 0;
    table.parentElement.hidden = entries.length === 0 || narrow.matches;
    list.hidden = entries.length === 0 || !narrow.matches;
  }

  function render() {
    const shown = entries.filter(matches);
    fill(body, narrow.matches ? [] : shown.map(row));
    fill(list, narrow.matches ? shown.map(item) : []);
    updateChrome();
  }

  function add(entry) {
    if (!entry || typeof entry.id !== 'string') return;
    if (loading) { loading.push(entry); return; }
    if (entries.some((e) => e.id === entry.id)) return;
    entries.unshift(entry);
    if (entries.length > KEEP) {
      const gone = entries.splice(KEEP);
      for (const old of gone) root.querySelector(`[data-id="${CSS.escape(old.id)}"]`)?.remove();
    }
    if (matches(entry)) {
      if (narrow.matches) list.prepend(item(entry)); else body.prepend(row(entry));
    }
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
  narrow.addEventListener('change', render);
  render();
  reload();
  return () => {
    alive = false;
    narrow.removeEventListener('change', render);
    for (const unsubscribe of off) unsubscribe();
  };
}
