// Playground: chat with a model of /v1/models, streamed (POST /v1/chat/completions with
// "stream": true), each token shown as it arrives; then who served it, the time to the
// first token and tokens per second. Stop aborts the stream (the gateway then cancels the
// upstream request at once). A managed model that is not loaded (its state from
// /v1/models' "sluice" member and the feed's `model` events) is loaded by the request:
// "Loading <model>…" until its first token (SPEC §11).

import { appendText, el, errorText, fact, fill, ms, rate, screen } from './common.js';

// The states of a managed model (SPEC §11) in which a request waits for a load.
const COLD = new Set(['unloaded', 'loading', 'unloading', 'failed']);

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
  const states = new Map(); // managed model -> its state (SPEC §11)
  let waiting = null; // the model a request waits for, until its first token

  const modelSelect = el('select', {
    id: 'playground-model', name: 'model', required: true,
    'aria-describedby': 'playground-model-note playground-model-state',
  });
  const modelNote = el('p', { class: 'muted', id: 'playground-model-note' });
  const stateNote = el('p', { class: 'help muted', id: 'playground-model-state' });
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
  const status = el('p', { role: 'status', class: 'muted', id: 'playground-status' });
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
      el('label', { for: 'playground-model', text: 'Model' }), modelSelect, modelNote, stateNote),
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
  modelSelect.addEventListener('change', () => showState());
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
      states.clear();
      for (const m of list) if (m.sluice?.state) states.set(m.id, m.sluice.state);
      const chosen = modelSelect.value;
      fill(modelSelect, modelOptions(list));
      if (list.some((m) => m.id === chosen)) modelSelect.value = chosen;
      modelNote.textContent = list.length ? '' : 'No model is available right now.';
      modelNote.hidden = list.length > 0;
    } catch (err) {
      if (alive) modelNote.textContent = `Could not read the models: ${errorText(err)}`;
    }
    if (alive) {
      setRunning(running !== null);
      showState();
    }
  }

  /** The chosen model's note: a managed model that is not loaded is loaded by a request. */
  function showState() {
    const text = {
      loaded: 'Loaded.',
      unloaded: 'Not loaded: the first request loads it, which may take a while.',
      loading: 'Loading now.',
      unloading: 'Being unloaded: a request loads it again.',
      failed: 'Its last load failed: a request tries again.',
    }[states.get(modelSelect.value)] ?? '';
    stateNote.textContent = text;
    stateNote.hidden = !text;
  }

  /** What the status line says while the request has no token yet. */
  function waitingText(model) {
    return COLD.has(states.get(model)) ? `Loading ${model}…` : `Waiting for ${model}…`;
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
    waiting = model;
    status.textContent = waitingText(model);

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
          waiting = null;
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
    waiting = null;
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
    app.feed.on('model', (data) => {
      // A managed model's state, at once: a request waiting for it says what it waits for.
      if (data?.source === 'managed' && data.name) {
        if (data.state === 'removed') states.delete(data.name);
        else states.set(data.name, data.state);
        if (waiting === data.name) status.textContent = waitingText(data.name);
        if (modelSelect.value === data.name) showState();
      }
      loadModels();
    }),
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
