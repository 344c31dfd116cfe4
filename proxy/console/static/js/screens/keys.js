// API > Access keys: create one (the key is shown this once, with a copy button), list
// them (name, created, last used) and revoke one after an in-page confirmation (a modal
// <dialog>: focus moves into it, Escape cancels, focus returns to the button after).

import { el, errorText, fill, guard, readOnlyNote, screen, when } from './common.js';

const KEYS = '/api/v1/access-keys';
const QUIET_MS = 2000; // at most one re-read of "last used" per this, while requests finish

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
  const createButton = el('button', { type: 'submit', class: 'primary', text: 'Create key' });
  const createError = el('p', { class: 'form-status bad', id: 'keys-create-error', role: 'alert' });
  const fresh = el('div', { class: 'card stack', role: 'region', 'aria-label': 'New access key', tabindex: '-1' });
  const body = el('tbody');
  const table = el('table', { class: 'table' },
    el('caption', { class: 'sr-only', text: 'Access keys' }),
    el('thead', {}, el('tr', {}, ['Name', 'Created', 'Last used']
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
      el('p', { class: 'help muted', id: 'keys-name-hint', text: 'Optional: who or what will use it, e.g. laptop.' }),
      createError),
    el('div', { class: 'row wrap' }, createButton));
  guard(app, nameInput);
  guard(app, createButton);

  screen(root, 'Access keys',
    readOnlyNote(app, 'creating or revoking keys'),
    el('p', {}, 'Clients on other machines, and loopback TCP clients when "Require auth" is '
      + 'on, send one as "Authorization: Bearer <key>". Only a hash of each key is kept.'),
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
    nameInput.removeAttribute('aria-invalid');
    try {
      const made = await app.api.post(KEYS, { name: nameInput.value.trim() });
      if (!alive) return;
      nameInput.value = '';
      showFresh(made);
      await reload();
    } catch (err) {
      if (!alive) return;
      createError.textContent = errorText(err);
      createError.hidden = false;
      nameInput.setAttribute('aria-invalid', 'true');
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

  function draw() {
    fill(body, keys.map((key) => {
      const label = key.name || key.id;
      const revoke = el('button', {
        type: 'button', class: 'danger small', text: 'Revoke', 'aria-label': `Revoke ${label}`,
      });
      revoke.addEventListener('click', () => askRevoke(key, revoke));
      guard(app, revoke);
      return el('tr', {},
        el('th', { scope: 'row' }, key.name || el('span', { class: 'muted', text: `(no name) ${key.id}` })),
        el('td', { title: key.createdAt, text: when(key.createdAt) }),
        el('td', { title: key.lastUsedAt, text: when(key.lastUsedAt) }),
        el('td', {}, revoke));
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
