// Aliases (SPEC §12): names clients send, mapped to models that exist. Add one (a name or a
// pattern with *, and its target), change a name or a target where it is shown (saved when
// the field loses focus or on Enter), remove one, and put the patterns in the order they
// are tried (the order of the file; exact names are always tried before patterns). Every
// change saves the whole table (PUT /api/v1/settings/aliases); a refused one shows the
// server's message beside the field it names (error.param = "aliases.<name>") and the
// server keeps what it had. Each target says whether it is available now (/v1/models).
// The live feed is authoritative: a save's answer that comes after a newer table's event
// is not drawn over it.

import { field, showError } from '../components/field.js';
import { orderedList } from '../components/ordered-list.js';
import { el, errorText, feedOrder, fill, guard, readOnlyNote, screen, uid } from './common.js';

const SETTINGS = '/api/v1/settings/aliases';
const MODELS = '/v1/models';
const MODELS_QUIET_MS = 500; // at most one re-read of the model list per this

const isPattern = (name) => name.includes('*');

/** The server's table as entries, keeping the ids (and so the rows) of names still there
 * (a name listed twice in `previous` takes its last id; an id goes to one entry only). */
export function entriesOf(table, previous = []) {
  const known = new Map(previous.map((e) => [e.name, e.id]));
  const used = new Set();
  return Object.entries(table ?? {}).map(([name, target]) => {
    const old = known.get(name);
    const id = old !== undefined && !used.has(old) ? old : uid('alias');
    used.add(id);
    return { id, name, target };
  });
}

/** The table to PUT: entries in their order (the file's). */
export function tableOf(entries) {
  return Object.fromEntries(entries.map((e) => [e.name, e.target]));
}

/** `entries` with the patterns in `ids`' order, each exact name where it was. */
export function withPatternOrder(entries, ids) {
  const byId = new Map(entries.map((e) => [e.id, e]));
  const patterns = ids.map((id) => byId.get(id)).filter(Boolean);
  let next = 0;
  return entries.map((e) => (isPattern(e.name) ? patterns[next++] ?? e : e));
}

export function mount(root, app) {
  let alive = true;
  let entries = [];
  let models = new Set(); // the ids /v1/models lists (aliases left out)
  let modelsTimer = null;
  let saving = Promise.resolve();
  let pending = null; // the entries the save in flight sent (their ids name their rows)
  const fed = feedOrder(); // the feed's aliases tables, newer than a save's answer after them

  const datalistId = uid('alias-models');
  const datalist = el('datalist', { id: datalistId });
  const live = el('p', { class: 'sr-only', role: 'status' });

  // -- saving ------------------------------------------------------------------------------

  /** PUT the table `next`; the server's answer becomes what is shown, unless the feed
   * brought a table since it was sent (that one is as new or newer). One save at a time. */
  function save(next) {
    const run = saving.then(async () => {
      const mark = fed.mark();
      pending = next;
      try {
        const answer = await app.api.put(SETTINGS, { aliases: tableOf(next) });
        if (alive && !fed.since(mark)) {
          entries = entriesOf(answer.aliases, next);
          draw();
        }
        return answer;
      } finally {
        pending = null;
      }
    });
    saving = run.catch(() => {});
    return run;
  }

  /** Show a refusal beside the field of the alias it names, when that is not `own`. */
  function placeError(err, own) {
    const name = typeof err?.param === 'string' && err.param.startsWith('aliases.')
      ? err.param.slice('aliases.'.length) : null;
    const named = entries.find((e) => e.name === name);
    const row = named ? rows.get(named.id) : null;
    if (row && row.name !== own && row.target !== own) showError(row.name, errorText(err));
  }

  async function change(entry, key, value, own) {
    const text = value.trim();
    if (key === 'name' && text !== entry.name && entries.some((e) => e.name === text)) {
      throw new Error(`an alias named "${text}" is already there`);
    }
    const next = entries.map((e) => (e.id === entry.id ? { ...e, [key]: text } : e));
    try {
      await save(next);
    } catch (err) {
      placeError(err, own);
      throw err;
    }
    return entries.find((e) => e.id === entry.id)?.[key] ?? text; // as shown now
  }

  async function remove(entry, button) {
    const next = entries.filter((e) => e.id !== entry.id);
    button.disabled = true;
    try {
      await save(next);
      live.textContent = `Alias ${entry.name} removed.`;
      nameInput.focus();
    } catch (err) {
      button.disabled = false;
      app.notify(`Could not remove ${entry.name}: ${errorText(err)}`, 'error');
    }
  }

  // -- one alias: its name, its target, whether the target is there, Remove ---------------

  const rows = new Map(); // entry id -> row element (with .name and .target fields)

  function row(entry) {
    let r = rows.get(entry.id);
    if (r) return r;
    const current = () => entries.find((e) => e.id === entry.id) ?? entry;
    const name = field({
      label: 'Name', name: 'alias-name', value: entry.name, disabled: app.readOnly,
      save: (v) => change(current(), 'name', v, name),
    });
    const target = field({
      label: 'Target', name: 'alias-target', value: entry.target, disabled: app.readOnly,
      save: (v) => change(current(), 'target', v, target),
    });
    target.input.setAttribute('list', datalistId);
    const state = el('span', { class: 'badge' });
    const removeButton = el('button', { type: 'button', class: 'danger small', text: 'Remove' });
    removeButton.addEventListener('click', () => remove(current(), removeButton));
    guard(app, removeButton);
    r = el('div', { class: 'alias-row' }, name, target,
      el('div', { class: 'alias-side' }, state, removeButton));
    r.name = name;
    r.target = target;
    r.update = (e = current()) => {
      name.set(e.name);
      target.set(e.target);
      name.input.setAttribute('aria-label', `Name of alias ${e.name}`);
      target.input.setAttribute('aria-label', `Target of ${e.name}`);
      removeButton.setAttribute('aria-label', `Remove ${e.name}`);
      const there = models.has(e.target);
      state.className = `badge ${there ? 'ok' : 'warn'}`;
      state.textContent = there ? 'available' : 'not available now';
      state.title = there ? `${e.target} is listed in /v1/models`
        : `${e.target} is not listed now: a request for ${e.name} gets a 503`;
    };
    rows.set(entry.id, r);
    return r;
  }

  // -- the screen ----------------------------------------------------------------------------

  const nameInput = el('input', {
    id: 'aliases-new-name', name: 'name', type: 'text', autocomplete: 'off',
    spellcheck: 'false', placeholder: 'gpt-4o or claude-*',
    'aria-describedby': 'aliases-new-name-help aliases-add-error',
  });
  const targetInput = el('input', {
    id: 'aliases-new-target', name: 'target', type: 'text', autocomplete: 'off',
    spellcheck: 'false', list: datalistId, placeholder: 'a model this gateway has',
    'aria-describedby': 'aliases-new-target-help aliases-add-error',
  });
  const addButton = el('button', { type: 'submit', class: 'primary', text: 'Add alias' });
  const addError = el('p', { class: 'form-status bad', id: 'aliases-add-error', role: 'alert' });
  addError.hidden = true;
  guard(app, nameInput);
  guard(app, targetInput);
  guard(app, addButton);
  const form = el('form', { class: 'card stack', on: { submit: add } },
    el('h2', { text: 'Add an alias' }),
    el('div', { class: 'grid2' },
      el('div', { class: 'field' },
        el('label', { for: 'aliases-new-name', text: 'Name or pattern' }), nameInput,
        el('p', { class: 'help muted', id: 'aliases-new-name-help',
          text: 'What clients send. * matches any characters: claude-* takes every Claude model name.' })),
      el('div', { class: 'field' },
        el('label', { for: 'aliases-new-target', text: 'Target model' }), targetInput,
        el('p', { class: 'help muted', id: 'aliases-new-target-help',
          text: 'The model that answers instead (local, managed or on another computer).' }))),
    addError,
    el('div', { class: 'row wrap' }, addButton));

  const exactList = el('div', { class: 'stack', role: 'list', 'aria-label': 'Exact names' });
  const exactEmpty = el('p', { class: 'muted', text: 'No exact name yet.' });
  const patternEmpty = el('p', { class: 'muted', text: 'No pattern yet.' });
  const order = orderedList({
    label: 'Patterns in the order they are tried',
    items: [],
    key: (e) => e.id,
    name: (e) => e.name,
    readOnly: app.readOnly,
    render: (e) => {
      const r = row(e);
      const body = el('div', {}, r);
      body.update = () => r.update();
      return body;
    },
    save: async (ids) => {
      await save(withPatternOrder(entries, ids));
      return entries.filter((e) => isPattern(e.name));
    },
  });

  screen(root, 'Aliases',
    readOnlyNote(app, 'changing aliases'),
    el('p', {}, 'A client that asks for a model this gateway does not have (Claude Code '
      + 'asks for claude-… names, many apps for gpt-4o) can be served by one it has. A model '
      + 'that exists is never aliased; otherwise an exact name is used, else the first '
      + 'pattern that matches, top first. Only "model" in the request is rewritten. Each change '
      + 'is saved at once and applies to the next request.'),
    form,
    el('section', { class: 'card stack', 'aria-labelledby': 'aliases-exact' },
      el('h2', { id: 'aliases-exact', text: 'Exact names' }),
      exactList, exactEmpty),
    el('section', { class: 'card stack', 'aria-labelledby': 'aliases-patterns' },
      el('h2', { id: 'aliases-patterns', text: 'Patterns' }),
      el('p', { class: 'muted', text: 'Tried after the exact names, top first; the first that matches is used.' }),
      order, patternEmpty),
    datalist, live);

  async function add(event) {
    event.preventDefault();
    if (app.readOnly) return;
    const name = nameInput.value.trim();
    const target = targetInput.value.trim();
    addError.hidden = true;
    nameInput.removeAttribute('aria-invalid');
    targetInput.removeAttribute('aria-invalid');
    const problem = !name ? [nameInput, 'Give the name clients send, or a pattern.']
      : !target ? [targetInput, 'Give the model that answers instead.']
        : entries.some((e) => e.name === name) ? [nameInput, `An alias named "${name}" is already there: change its target below.`]
          : null;
    if (problem) {
      fail(problem[0], problem[1]);
      return;
    }
    addButton.disabled = true;
    try {
      await save([...entries, { id: uid('alias'), name, target }]);
      nameInput.value = '';
      targetInput.value = '';
      live.textContent = `Alias ${name} added.`;
      nameInput.focus();
    } catch (err) {
      fail(/target/i.test(errorText(err)) ? targetInput : nameInput, errorText(err));
    } finally {
      addButton.disabled = app.readOnly;
    }
  }

  function fail(input, message) {
    addError.textContent = message;
    addError.hidden = false;
    input.setAttribute('aria-invalid', 'true');
    input.focus();
  }

  function draw() {
    const exact = entries.filter((e) => !isPattern(e.name));
    const patterns = entries.filter((e) => isPattern(e.name));
    fill(exactList, exact.map((e) => {
      const r = row(e);
      r.setAttribute('role', 'listitem');
      r.update(e);
      return r;
    }));
    exactEmpty.hidden = exact.length > 0;
    for (const e of patterns) rows.get(e.id)?.removeAttribute('role');
    order.update(patterns);
    patternEmpty.hidden = patterns.length > 0;
    order.hidden = patterns.length === 0;
    for (const id of [...rows.keys()]) {
      if (!entries.some((e) => e.id === id)) rows.delete(id);
    }
  }

  function showModels(list) {
    const ids = list.filter((m) => !m?.sluice?.aliasOf).map((m) => m.id);
    models = new Set(ids);
    fill(datalist, ids.map((id) => el('option', { value: id })));
    for (const e of entries) rows.get(e.id)?.update(e);
  }

  async function readModels() {
    try {
      const doc = await app.api.get(MODELS);
      if (alive) showModels(Array.isArray(doc?.data) ? doc.data : []);
    } catch (err) {
      if (alive) app.notify(`Could not read the model list: ${errorText(err)}`, 'error');
    }
  }

  function soonModels() {
    if (modelsTimer === null) {
      modelsTimer = setTimeout(() => { modelsTimer = null; readModels(); }, MODELS_QUIET_MS);
    }
  }

  async function reload(hello) {
    try {
      const mark = fed.mark();
      const snapshot = hello?.settings?.aliases;
      const table = snapshot ?? await app.api.get(SETTINGS);
      if (!alive || !table || (!snapshot && fed.since(mark))) return;
      if (snapshot) fed.heard(); // the feed's own snapshot: newer than any answer in flight
      entries = entriesOf(table.aliases, entries);
      draw();
    } catch (err) {
      if (alive) app.notify(`Could not read the aliases: ${errorText(err)}`, 'error');
    }
    readModels();
  }

  const off = [
    app.feed.on('settings', (data) => {
      if (data?.section === 'aliases' && data.value) {
        fed.heard();
        entries = entriesOf(data.value.aliases, pending ? [...entries, ...pending] : entries);
        draw();
        soonModels();
      }
    }),
    app.feed.on('model', soonModels),
    app.feed.on('node', soonModels),
    app.feed.on('refresh', (hello) => { reload(hello); }),
  ];
  draw();
  reload(null);
  return () => {
    alive = false;
    clearTimeout(modelsTimer);
    for (const unsubscribe of off) unsubscribe();
  };
}
