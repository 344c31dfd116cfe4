// API > General: where the gateway listens (the local socket, or the loopback TCP port it
// fell back to and why), the API port, the API server on or off, external access and
// require auth. Each is saved when changed (PUT /api/v1/settings/api); a field that only
// applies at the next start says so (once one is saved, the gateway's own notification,
// shown by the shell on every screen, says to restart). The live feed is authoritative: a
// save's answer that comes after a newer event is not drawn over it.

import { field } from '../components/field.js';
import { toggle } from '../components/switch.js';
import {
  el, errorText, fact, feedOrder, fill, readOnlyNote, screen, uid, wide,
} from './common.js';

const SETTINGS = '/api/v1/settings/api';
const FALLBACK = 'local_socket_unavailable';
const AT_RESTART = 'needs a restart';

/** What a port field holds, as the API takes it (a text that is no number goes as it is,
 * so the server's own message names the problem). */
export function portValue(text) {
  const trimmed = String(text).trim();
  return /^\d+$/.test(trimmed) ? Number(trimmed) : trimmed;
}

/** A switch with its visible name, a badge (e.g. "needs a restart") and a description. */
function switchRow(app, label, badge, help, save) {
  const button = toggle({ label, text: label, checked: false, save, disabled: app.readOnly });
  const note = el('p', { class: 'help muted', id: uid('help'), text: help });
  button.setAttribute('aria-describedby', note.id);
  // In a row, so the switch keeps its own width and its "Saved" line sits beside it.
  const row = el('div', { class: 'field' },
    el('div', { class: 'row wrap' }, button, badge ? el('span', { class: 'badge', text: badge }) : null),
    note);
  row.set = (on) => button.set(on);
  row.input = button;
  return row;
}

export function mount(root, app) {
  let alive = true;
  let notifications = [];
  let status = null;
  let latest = null; // the settings the feed brought last
  const fed = feedOrder();

  /** Save one change; the answer shows everywhere (unless the feed brought newer settings
   * since it was sent), and `key`'s value as shown now goes back to its control. */
  async function put(change, key, as = (value) => String(value ?? '')) {
    const mark = fed.mark();
    const saved = await app.api.put(SETTINGS, change);
    const stale = fed.since(mark);
    if (alive && saved && !stale) show(saved);
    return as((stale ? latest : saved)?.[key]);
  }

  const enabled = switchRow(app, 'API server', AT_RESTART, 'The OpenAI API on TCP; off: the '
    + 'Unix socket only.', (on) => put({ enabled: on }, 'enabled', Boolean));
  const port = field({
    label: 'API port', name: 'port', type: 'text', value: '', hint: AT_RESTART,
    help: 'The TCP port of the API (OpenAI base URL http://localhost:<port>/v1).',
    save: (v) => put({ port: portValue(v) }, 'port'), disabled: app.readOnly,
  });
  port.input.setAttribute('inputmode', 'numeric');
  const external = switchRow(app, 'External access', AT_RESTART, 'Listen on every network '
    + 'interface; clients on other machines must send an access key.',
  (on) => put({ allowExternalAccess: on }, 'allowExternalAccess', Boolean));
  const nodePort = field({
    label: 'Node port', name: 'nodePort', type: 'text', value: '', hint: AT_RESTART,
    help: 'TLS 1.3 for the computers paired with this one, opened with external access; '
      + '0: none.',
    save: (v) => put({ nodePort: portValue(v) }, 'nodePort'), disabled: app.readOnly,
  });
  nodePort.input.setAttribute('inputmode', 'numeric');
  const requireAuth = switchRow(app, 'Require auth', null, 'Loopback TCP clients need an '
    + 'access key too (the Unix socket never does). Applies at once.',
  (on) => put({ requireAuth: on }, 'requireAuth', Boolean));
  const socketDir = field({
    label: 'Socket folder', name: 'socketDir', type: 'text', value: '', hint: AT_RESTART,
    help: 'A private folder for the local socket, at most 62 bytes; empty: the default places.',
    save: (v) => put({ socketDir: v.trim() === '' ? null : v.trim() }, 'socketDir'),
    disabled: app.readOnly,
  });

  const listening = el('dl', { class: 'facts' });

  screen(root, 'General',
    readOnlyNote(app, 'changing these settings'),
    el('section', { class: 'card stack', 'aria-labelledby': 'general-local' },
      el('h2', { id: 'general-local', text: 'Local socket' }),
      listening, socketDir),
    el('section', { class: 'card stack', 'aria-labelledby': 'general-api' },
      el('h2', { id: 'general-api', text: 'API server' }),
      enabled, port, external, nodePort, requireAuth));

  function drawListening() {
    const facts = [];
    if (status?.socketPath) {
      facts.push(wide(fact('Socket path', el('code', { text: status.socketPath }))));
    } else if (status?.localTcp) {
      const why = notifications.find((n) => n.code === FALLBACK);
      facts.push(fact('Fallback TCP port', el('code', { text: status.localTcp })));
      facts.push(wide(fact('Why', why?.message ?? 'no folder works for the local socket')));
    }
    if (status) {
      facts.push(fact('API listening on',
        status.routerPort ? `TCP port ${status.routerPort}` : 'off (Unix socket only)'));
      if (status.identity) { // SPEC §16: what paired computers pin
        facts.push(wide(fact('Identity', el('code', { text: status.identity }))));
        facts.push(fact('Node port (TLS 1.3)', status.nodePort ? String(status.nodePort)
          : 'closed (needs external access)'));
      }
    }
    fill(listening, facts);
  }

  function show(settings) {
    enabled.set(Boolean(settings.enabled));
    port.set(String(settings.port ?? ''));
    external.set(Boolean(settings.allowExternalAccess));
    nodePort.set(String(settings.nodePort ?? ''));
    requireAuth.set(Boolean(settings.requireAuth));
    socketDir.set(settings.socketDir ?? '');
  }

  function heard(settings) {
    fed.heard();
    latest = settings;
    show(settings);
  }

  async function reload(hello) {
    try {
      const mark = fed.mark();
      const [settings, state, notes] = hello
        ? [hello.settings?.api, hello.status, hello.notifications]
        : await Promise.all([app.api.get(SETTINGS), app.api.get('/api/v1/inference/status'),
          app.api.get('/api/v1/notifications').then((n) => n?.notifications)]);
      if (!alive) return;
      status = state ?? status;
      notifications = Array.isArray(notes) ? notes : notifications;
      if (settings && hello) heard(settings); // the feed's own snapshot
      else if (settings && !fed.since(mark)) show(settings);
      drawListening();
    } catch (err) {
      if (alive) app.notify(`Could not read the API settings: ${errorText(err)}`, 'error');
    }
  }

  const off = [
    app.feed.on('settings', (data) => {
      if (data?.section === 'api' && data.value) heard(data.value);
    }),
    app.feed.on('notification', (data) => {
      if (!data?.code) return;
      notifications = notifications.filter((n) => n.code !== data.code);
      if (!data.cleared) notifications.push(data);
      drawListening();
    }),
    app.feed.on('refresh', (hello) => { reload(hello); }),
  ];
  reload(null);
  return () => {
    alive = false;
    for (const unsubscribe of off) unsubscribe();
  };
}
