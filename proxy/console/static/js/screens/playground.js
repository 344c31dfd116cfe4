// Playground: chat with a model of /v1/models, streamed (POST /v1/chat/completions with
// "stream": true), each token shown as it arrives; then who served it, the time to the
// first token and tokens per second. Stop aborts the stream (the gateway then cancels the
// upstream request at once).

import { appendText, el, errorText, fact, fill, ms, rate, screen } from './common.js';

/** What one SSE event of a chat stream brings: text, usage, an error, or the end. */
export function readEvent(event) {
  if (event === '[DONE]') return { done: true };
  if (!event || typeof event !== 'object') return {};
  if (event.error) return { error: event.error.message ?? String(event.error) };
  const out = {};
  const delta = event.choices?.[0]?.delta;
  if (delta && typeof delta.content === 'string' && delta.content !== '') out.text = delta.content;
  if (event.usage && typeof event.usage === 'object') out.usage = event.usage;
  return out;
}

function modelOptions(list) {
  return list.map((m) => el('option', {
    value: m.id,
    text: m.owned_by && m.owned_by !== m.id ? `${m.id} (${m.owned_by})` : m.id,
  }));
}

export function mount(root, app) {
  const history = []; // {role, content} of the conversation so far
  let running = null; // the AbortController of the stream in flight
  let alive = true;

  const modelSelect = el('select', { id: 'playground-model', name: 'model', required: true });
  const modelNote = el('p', { class: 'muted', id: 'playground-model-note' });
  const message = el('textarea', {
    id: 'playground-message', name: 'message', rows: '3',
    'aria-describedby': 'playground-message-hint',
  });
  const send = el('button', { type: 'submit', class: 'primary', text: 'Send' });
  const stop = el('button', { type: 'button', text: 'Stop', disabled: true });
  const clear = el('button', { type: 'button', text: 'New chat' });
  const log = el('div', {
    class: 'stack', role: 'log', 'aria-live': 'polite', 'aria-label': 'Conversation',
  });
  const status = el('p', { role: 'status', class: 'muted' });
  const figure = (label) => {
    const node = fact(label, '—');
    return { dd: node.querySelector('dd'), nodes: node };
  };
  const servedBy = figure('Served by');
  const ttft = figure('Time to first token');
  const tps = figure('Tokens per second');
  const tokens = figure('Completion tokens');
  const requestId = figure('Request id');

  const form = el('form', { class: 'card stack', on: { submit: onSubmit } },
    el('div', { class: 'field' },
      el('label', { for: 'playground-model', text: 'Model' }), modelSelect, modelNote),
    el('div', { class: 'field' },
      el('label', { for: 'playground-message', text: 'Message' }), message,
      el('p', { class: 'help muted', id: 'playground-message-hint', text: 'Ctrl+Enter sends.' })),
    el('div', { class: 'row wrap' }, send, stop, clear));

  screen(root, 'Playground',
    el('p', {}, 'Chat with a model the gateway serves; the answer streams in as it is made.'),
    form,
    el('section', { class: 'card stack', 'aria-labelledby': 'playground-reply' },
      el('h2', { id: 'playground-reply', text: 'Conversation' }), log, status,
      el('dl', { class: 'facts' },
        servedBy.nodes, ttft.nodes, tps.nodes, tokens.nodes, requestId.nodes)));

  message.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  stop.addEventListener('click', () => running?.abort());
  clear.addEventListener('click', () => {
    running?.abort();
    history.length = 0;
    fill(log);
    status.textContent = '';
    for (const f of [servedBy, ttft, tps, tokens, requestId]) f.dd.textContent = '—';
    message.focus();
  });

  function bubble(role, text) {
    const body = el('p');
    appendText(body, text);
    log.append(el('div', { class: `message ${role}`, 'data-role': role },
      el('h3', { class: 'small', text: role === 'user' ? 'You' : 'Assistant' }), body));
    return body;
  }

  function setRunning(on) {
    send.disabled = on || modelSelect.options.length === 0;
    stop.disabled = !on;
    log.setAttribute('aria-busy', on ? 'true' : 'false');
  }

  async function loadModels() {
    try {
      const answer = await app.api.get('/v1/models');
      if (!alive) return;
      const list = Array.isArray(answer?.data) ? answer.data : [];
      const chosen = modelSelect.value;
      fill(modelSelect, modelOptions(list));
      if (list.some((m) => m.id === chosen)) modelSelect.value = chosen;
      modelNote.textContent = list.length ? '' : 'No model is available right now.';
      modelNote.hidden = list.length > 0;
    } catch (err) {
      if (alive) modelNote.textContent = `Could not read the models: ${errorText(err)}`;
    }
    if (alive) setRunning(running !== null);
  }

  async function onSubmit(e) {
    e.preventDefault();
    const text = message.value.trim();
    const model = modelSelect.value;
    if (!text || !model || running) return;
    message.value = '';
    history.push({ role: 'user', content: text });
    bubble('user', text);
    const reply = bubble('assistant', '');
    const controller = new AbortController();
    running = controller;
    setRunning(true);
    for (const f of [servedBy, ttft, tps, tokens, requestId]) f.dd.textContent = '—';
    status.textContent = `Waiting for ${model}…`;

    const started = performance.now();
    let first = null;
    let last = null;
    let chunks = 0;
    let usage = null;
    let failed = null;
    let answer = '';
    let headers = null;
    const onEvent = (event, responseHeaders) => {
      if (headers === null && responseHeaders) { headers = responseHeaders; showServer(headers); }
      const got = readEvent(event);
      if (got.text) {
        const now = performance.now();
        if (first === null) {
          first = now;
          ttft.dd.textContent = ms(now - started);
          status.textContent = 'Streaming…';
        }
        last = now;
        chunks += 1;
        answer += got.text;
        appendText(reply, got.text);
      }
      if (got.usage) usage = got.usage;
      if (got.error) failed = got.error;
    };
    try {
      headers = await app.api.stream('/v1/chat/completions', {
        model, stream: true, stream_options: { include_usage: true }, messages: [...history],
      }, onEvent, controller.signal);
    } catch (err) {
      if (controller.signal.aborted) failed = 'stopped';
      else failed = errorText(err);
    }
    if (!alive) return;
    running = null;
    setRunning(false);
    showServer(headers);
    // From the first token to the last: the pace the model produced them at (with one
    // token in all, there is no pace to tell).
    const end = last ?? performance.now();
    const generated = usage?.completion_tokens;
    if (Number.isFinite(generated)) {
      tokens.dd.textContent = String(generated);
      tps.dd.textContent = first === null ? '—' : rate(Math.max(generated - 1, 0), (end - first) / 1000);
    } else if (chunks > 1) {
      // No usage from the server (or stopped before it came): chunks stand in for tokens.
      tokens.dd.textContent = `≈ ${chunks} (chunks)`;
      tps.dd.textContent = `≈ ${rate(chunks - 1, (end - first) / 1000)}`;
    }
    if (answer) history.push({ role: 'assistant', content: answer });
    if (failed === 'stopped') {
      status.textContent = 'Stopped.';
      reply.append(el('span', { class: 'muted', text: answer ? ' [stopped]' : '[stopped]' }));
    } else if (failed) {
      status.textContent = `Error: ${failed}`;
      reply.append(el('span', { class: 'form-status bad', text: answer ? ` [${failed}]` : failed }));
    } else {
      status.textContent = `Done in ${ms(performance.now() - started)}.`;
    }
    message.focus();
  }

  function showServer(headers) {
    if (!headers || typeof headers.get !== 'function') return;
    servedBy.dd.textContent = headers.get('x-sluice-served-by') ?? '—';
    requestId.dd.textContent = headers.get('x-sluice-request-id') ?? '—';
  }

  const off = [
    app.feed.on('model', () => { loadModels(); }),
    app.feed.on('refresh', () => { loadModels(); }),
  ];
  setRunning(false);
  loadModels();
  return () => {
    alive = false;
    running?.abort();
    for (const unsubscribe of off) unsubscribe();
  };
}
