// API > Access keys: create one, with its limits (the models it may use, requests a minute,
// an expiry date; the key is shown this once, with a copy button), list them (name, limits,
// created, last used), change a key's limits where they are shown (saved when the field
// loses focus or on Enter, the server's refusal beside the field: PATCH
// /api/v1/access-keys/{id}) and revoke one after an in-page confirmation (a modal
// <dialog>: focus moves into it, Escape cancels, focus returns to the button after).

import { field, showError } from '../components/field.js';
import { el, errorText, fill, guard, readOnlyNote, screen, when } from './common.js';

const KEYS = '/api/v1/access-keys';
const QUIET_MS = 2000; // at most one re-read of "last used" per this, while requests finish

/** "small, qwen*" as the API takes it: a list, or null (every model) when empty. */
export function modelsValue(text) {
  const names = String(text).split(',').map((n) => n.trim()).filter(Boolean);
  return names.length ? names : null;
}

/** A requests-a-minute field as the API takes it: null when empty, a number when it is
 * digits, else the text as it is (so the server's own message names the problem). */
export function rpmValue(text) {
  const trimmed = String(text).trim();
  if (trimmed === '') return null;
  return /^-?\d+$/.test(trimmed) ? Number(trimmed) : trimmed;
}

/** A date input's "YYYY-MM-DD" as the API takes it: the end of that day here (local
 * time), in UTC; null when empty. */
export function expiryValue(text) {
  const match = /^(\d{4})-(\d{2})-(\d{2})$/.exec(String(text).trim());
  if (!match) return String(text).trim() === '' ? null : String(text);
  const [, y, m, d] = match.map(Number);
  return new Date(y, m - 1, d, 23, 59, 59).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** The local date ("YYYY-MM-DD") of an expiry, for a date input; "" for none. */
export function expiryDate(iso) {
  if (!iso) return '';
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}`;
}

const modelsText = (key) => (key.models ?? []).join(', ');

async function copy(text) {
  if (navigator.clipboard?.writeText) {
    await navigator.clipboard.writeText(text);
    return;
  }
  throw new Error('the clipboard is not available here: select the key and copy it');
}

export function mount(root, app) {
  let alive = true;
  let keys = [];
  let reread = null; // the timer of a pending "last used" re-read

  const nameInput = el('input', {
    id: 'keys-name', name: 'name', type: 'text', autocomplete: 'off',
    'aria-describedby': 'keys-name-hint keys-create-error',
  });
  const modelsInput = el('input', {
    id: 'keys-models', name: 'models', type: 'text', autocomplete: 'off', placeholder: 'all models',
    spellcheck: 'false', 'aria-describedby': 'keys-models-hint',
  });
  const rpmInput = el('input', {
    id: 'keys-rpm', name: 'rpm', type: 'text', inputmode: 'numeric', autocomplete: 'off',
    placeholder: 'no limit', 'aria-describedby': 'keys-rpm-hint',
  });
  const expiresInput = el('input', {
    id: 'keys-expires', name: 'expiresAt', type: 'date', 'aria-describedby': 'keys-expires-hint',
  });
  // SPEC §18: a batch key's requests wait for the interactive ones in the queue.
  const priorityInput = el('select', { id: 'keys-priority', name: 'priority', 'aria-describedby': 'keys-priority-hint' },
    el('option', { value: 'interactive', text: 'Interactive' }), el('option', { value: 'batch', text: 'Batch' }));
  const createInputs = {
    name: nameInput, models: modelsInput, rpm: rpmInput, expiresAt: expiresInput, priority: priorityInput,
  };
  const createButton = el('button', { type: 'submit', class: 'primary', text: 'Create key' });
  const createError = el('p', { class: 'form-status bad', id: 'keys-create-error', role: 'alert' });
  const fresh = el('div', { class: 'card stack', role: 'region', 'aria-label': 'New access key', tabindex: '-1' });
  const body = el('tbody');
  const table = el('table', { class: 'table' },
    el('caption', { class: 'sr-only', text: 'Access keys' }),
    el('thead', {}, el('tr', {}, ['Name', 'Created', 'Last used', 'Models', 'Requests a minute', 'Expires', 'Priority']
      .map((h) => el('th', { scope: 'col', text: h })),
    el('th', { scope: 'col' }, el('span', { class: 'sr-only', text: 'Actions' })))),
    body);
  const empty = el('p', { class: 'muted', text: 'No access key yet.' });
  const live = el('p', { class: 'sr-only', role: 'status' });

  const confirmText = el('p', { id: 'keys-confirm-text' });
  const confirmYes = el('button', { type: 'button', class: 'danger', text: 'Revoke' });
  const confirmNo = el('button', { type: 'button', text: 'Cancel' });
  const dialog = el('dialog', { 'aria-labelledby': 'keys-confirm-title', 'aria-describedby': 'keys-confirm-text' },
    el('h2', { id: 'keys-confirm-title', text: 'Revoke this access key?' }), confirmText,
    el('div', { class: 'row wrap' }, confirmYes, confirmNo));

  const form = el('form', { class: 'card stack', on: { submit: create } },
    el('h2', { text: 'Create a key' }),
    el('div', { class: 'field' },
      el('label', { for: 'keys-name', text: 'Key name' }), nameInput,
      el('p', { class: 'help muted', id: 'keys-name-hint', text: 'Optional: who or what will use it, e.g. laptop.' })),
    el('div', { class: 'grid3' },
      el('div', { class: 'field' },
        el('label', { for: 'keys-models', text: 'Models' }), modelsInput,
        el('p', { class: 'help muted', id: 'keys-models-hint', text: 'Comma separated ids or patterns with *, e.g. smollm2-135m, qwen*. Empty: every model.' })),
      el('div', { class: 'field' },
        el('label', { for: 'keys-rpm', text: 'Requests a minute' }), rpmInput,
        el('p', { class: 'help muted', id: 'keys-rpm-hint', text: 'Empty: no limit.' })),
      el('div', { class: 'field' },
        el('label', { for: 'keys-expires', text: 'Expires' }), expiresInput,
        el('p', { class: 'help muted', id: 'keys-expires-hint', text: 'Works until the end of that day. Empty: never.' }))),
    el('div', { class: 'field' },
      el('label', { for: 'keys-priority', text: 'Priority' }), priorityInput,
      el('p', { class: 'help muted', id: 'keys-priority-hint', text: 'Batch: its requests wait while interactive ones are waiting for the same model.' })),
    createError,
    el('div', { class: 'row wrap' }, createButton));
  for (const input of Object.values(createInputs)) guard(app, input);
  guard(app, createButton);

  screen(root, 'Access keys',
    readOnlyNote(app, 'creating or revoking keys'),
    el('p', {}, 'Clients on other machines, and loopback TCP clients when "Require auth" is '
      + 'on, send one as "Authorization: Bearer <key>". Only a hash of each key is kept. '
      + 'A key\'s limits hold wherever it is sent, also where no key is needed.'),
    form, fresh,
    el('section', { class: 'card stack', 'aria-labelledby': 'keys-list' },
      el('h2', { id: 'keys-list', text: 'Keys' }),
      el('div', { class: 'table-wrap', role: 'region', 'aria-label': 'Access key list', tabindex: '0' }, table),
      empty),
    live, dialog);
  fresh.hidden = true;
  createError.hidden = true;

  async function create(e) {
    e.preventDefault();
    if (app.readOnly) return;
    createButton.disabled = true;
    createError.hidden = true;
    for (const input of Object.values(createInputs)) {
      input.removeAttribute('aria-invalid');
      if (input.saveStatus) input.saveStatus.textContent = '';
    }
    const body = { name: nameInput.value.trim() };
    const models = modelsValue(modelsInput.value);
    const rpm = rpmValue(rpmInput.value);
    const expiresAt = expiryValue(expiresInput.value);
    if (models !== null) body.models = models;
    if (rpm !== null) body.rpm = rpm;
    if (expiresAt !== null) body.expiresAt = expiresAt;
    if (priorityInput.value === 'batch') body.priority = 'batch';
    try {
      const made = await app.api.post(KEYS, body);
      if (!alive) return;
      for (const input of Object.values(createInputs)) input.value = '';
      priorityInput.value = 'interactive';
      showFresh(made);
      await reload();
    } catch (err) {
      if (!alive) return;
      // Beside the field the server names (models[2] is the models field), else below.
      const named = createInputs[String(err?.param ?? '').replace(/\[\d+\]$/, '')];
      if (named) {
        showError(named, errorText(err));
        named.focus();
      } else {
        createError.textContent = errorText(err);
        createError.hidden = false;
      }
    } finally {
      createButton.disabled = false;
    }
  }

  function showFresh(made) {
    const keyBox = el('input', {
      id: 'keys-new-value', type: 'text', readonly: true, value: made.key,
      class: 'mono', spellcheck: 'false', autocomplete: 'off',
    });
    const copied = el('span', { class: 'save-status ok', role: 'status' });
    const copyButton = el('button', {
      type: 'button', text: 'Copy key',
      on: {
        click: async () => {
          try {
            await copy(made.key);
            copied.textContent = 'Copied';
          } catch (err) {
            keyBox.select();
            copied.textContent = errorText(err);
          }
        },
      },
    });
    const done = el('button', {
      type: 'button', text: 'Done', on: { click: () => { fill(fresh); fresh.hidden = true; nameInput.focus(); } },
    });
    fill(fresh,
      el('h2', { text: `Key "${made.name || made.id}" created` }),
      el('p', { class: 'notice warn', text: 'Copy it now: it is shown this once and cannot be read again.' }),
      el('div', { class: 'field' }, el('label', { for: 'keys-new-value', text: 'New key' }), keyBox),
      el('div', { class: 'row wrap' }, copyButton, copied, done));
    fresh.hidden = false;
    fresh.focus();
    keyBox.select();
  }

  function askRevoke(key, button) {
    const label = key.name || key.id;
    confirmText.textContent = `Clients using "${label}" will be refused from now on. This cannot be undone.`;
    const close = () => {
      dialog.close();
      confirmYes.onclick = null;
    };
    confirmNo.onclick = () => close();
    confirmYes.onclick = async () => {
      confirmYes.disabled = true;
      try {
        await app.api.del(`${KEYS}/${encodeURIComponent(key.id)}`);
        close();
        live.textContent = `Key "${label}" revoked.`;
        await reload();
        (body.querySelector('button') ?? nameInput).focus();
      } catch (err) {
        close();
        app.notify(`Could not revoke "${label}": ${errorText(err)}`, 'error');
        button.focus();
      } finally {
        confirmYes.disabled = false;
      }
    };
    dialog.onclose = () => { if (document.activeElement === document.body && button.isConnected) button.focus(); };
    dialog.showModal();
    confirmNo.focus();
  }

  /** Save one of a key's fields; the key as the server keeps it comes back. */
  async function patch(key, change) {
    const saved = await app.api.patch(`${KEYS}/${encodeURIComponent(key.id)}`, change);
    if (alive && saved) {
      keys = keys.map((k) => (k.id === saved.id ? saved : k));
      rows.get(saved.id)?.update(saved);
    }
    return saved;
  }

  /** A field in a table cell: its visible label is the column's header, its accessible
   * name says whose it is. */
  function cellField(key, options) {
    const wrapper = field({ ...options, disabled: app.readOnly });
    wrapper.querySelector('label').classList.add('sr-only');
    return wrapper;
  }

  const rows = new Map(); // key id -> its row (kept across redraws: focus and errors stay)

  function row(key) {
    let r = rows.get(key.id);
    if (r) return r;
    const current = () => keys.find((k) => k.id === key.id) ?? key;
    const models = cellField(key, {
      label: 'Models', name: 'models', value: modelsText(key), placeholder: 'all models',
      save: async (v) => modelsText(await patch(current(), { models: modelsValue(v) })),
    });
    const rpm = cellField(key, {
      label: 'Requests a minute', name: 'rpm', value: String(key.rpm ?? ''), placeholder: 'no limit',
      save: async (v) => String((await patch(current(), { rpm: rpmValue(v) })).rpm ?? ''),
    });
    rpm.input.setAttribute('inputmode', 'numeric');
    const expires = cellField(key, {
      label: 'Expires', name: 'expiresAt', type: 'date', value: expiryDate(key.expiresAt),
      save: async (v) => expiryDate((await patch(current(), { expiresAt: expiryValue(v) })).expiresAt),
    });
    const priority = el('select', { name: 'priority' },
      el('option', { value: 'interactive', text: 'Interactive' }), el('option', { value: 'batch', text: 'Batch' }));
    priority.addEventListener('change', async () => {
      const asked = priority.value;
      try {
        const saved = await patch(current(), { priority: asked });
        live.textContent = `Priority of "${saved.name || saved.id}" saved: ${saved.priority}.`;
      } catch (err) {
        priority.value = current().priority ?? 'interactive';
        app.notify(`Could not change the priority: ${errorText(err)}`, 'error');
      }
    });
    guard(app, priority);
    const expired = el('span', { class: 'badge warn', text: 'expired' });
    const revoke = el('button', { type: 'button', class: 'danger small', text: 'Revoke' });
    revoke.addEventListener('click', () => askRevoke(current(), revoke));
    guard(app, revoke);
    const name = el('th', { scope: 'row' });
    const created = el('td');
    const used = el('td');
    r = el('tr', {}, name, created, used, el('td', { class: 'key-models' }, models), el('td', {}, rpm),
      el('td', {}, expires, expired), el('td', {}, priority), el('td', {}, revoke));
    r.update = (k) => {
      const label = k.name || k.id;
      fill(name, k.name || el('span', { class: 'muted', text: `(no name) ${k.id}` }));
      created.title = k.createdAt ?? '';
      created.textContent = when(k.createdAt);
      used.title = k.lastUsedAt ?? '';
      used.textContent = when(k.lastUsedAt);
      models.set(modelsText(k));
      rpm.set(String(k.rpm ?? ''));
      expires.set(expiryDate(k.expiresAt));
      models.input.setAttribute('aria-label', `Models ${label} may use`);
      rpm.input.setAttribute('aria-label', `Requests a minute for ${label}`);
      expires.input.setAttribute('aria-label', `Expiry date of ${label}`);
      expires.input.title = k.expiresAt ? `until ${when(k.expiresAt)}` : 'never expires';
      expired.hidden = !k.expired;
      priority.value = k.priority ?? 'interactive';
      priority.setAttribute('aria-label', `Priority of ${label}`);
      revoke.setAttribute('aria-label', `Revoke ${label}`);
    };
    rows.set(key.id, r);
    return r;
  }

  function draw() {
    for (const id of [...rows.keys()]) if (!keys.some((k) => k.id === id)) rows.delete(id);
    fill(body, keys.map((key) => {
      const r = row(key);
      r.update(key);
      return r;
    }));
    table.hidden = keys.length === 0;
    empty.hidden = keys.length > 0;
  }

  async function reload() {
    try {
      const list = await app.api.get(KEYS);
      if (!alive) return;
      keys = Array.isArray(list) ? list : [];
      draw();
    } catch (err) {
      if (alive) app.notify(`Could not read the access keys: ${errorText(err)}`, 'error');
    }
  }

  const off = [
    // A finished request may have used a key: read "last used" again, at most every QUIET_MS.
    app.feed.on('request', () => {
      if (reread === null) reread = setTimeout(() => { reread = null; reload(); }, QUIET_MS);
    }),
    app.feed.on('refresh', () => { reload(); }),
  ];
  draw();
  reload();
  return () => {
    alive = false;
    clearTimeout(reread);
    if (dialog.open) dialog.close();
    for (const unsubscribe of off) unsubscribe();
  };
}
