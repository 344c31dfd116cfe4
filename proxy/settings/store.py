"""The single owner of config.yaml, secrets.yaml and node.id (SPEC §2).

:class:`Settings` loads and validates the config, makes every change to the config and to the
node keys itself, writes it atomically (temp file in the same folder, fsync, rename, fsync of
the folder) and then hands the new immutable :class:`Config` to its subscribers. The access
keys have their own owner (:mod:`proxy.access.key_store`), which changes them under the same one
writer and has secrets.yaml written here.

Writes happen in a worker thread, one at a time (a slow disk never stalls the event loop),
and each change is computed from the current state under that one writer, so concurrent
changes never undo each other. A failed write raises ``OSError`` and changes nothing in
memory. Secret values never reach config.yaml, exceptions, logs or ``repr()``.

config.yaml may also change by hand (SPEC §13): :meth:`Settings.reload_file` reads it (the
watcher, :mod:`proxy.settings.config_watch`, calls it), and every write first takes in a hand edit
it has not seen yet, so a settings change never silently undoes one. The settings remember
the text and the signature (device, inode, size, mtime) of the file as they last read or
wrote it: their own writes are never read back as an edit. Every applied change keeps the
file it replaced in ``config-history/`` (:mod:`proxy.settings.config_history`).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from protocol.config import (
    Config,
    default_config,
    dump_config_yaml,
    parse_config_text,
    rebuild_health_check,
    validate_config,
)
from protocol.config.changes import changed_sections
from protocol.errors import ConfigError
from protocol.names import is_fingerprint
from protocol.secrets import Secrets, dump_secrets_yaml
from proxy.access.key_store import AccessKey, KeyStore
from proxy.datadir import CONFIG_FILE, NODE_ID_FILE, SECRETS_FILE, make_data_dir
from proxy.files import atomic_write, read_text
from proxy.publish import Subscribers
from proxy.settings.config_file import ConfigFile, Reload
from proxy.settings.config_history import HISTORY_DIR, ConfigHistory
from proxy.settings.model_files import check_files, unsized

__all__ = ["NodesChange", "Reload", "Settings"]

log = logging.getLogger("sluice.settings")

NodesChange = Callable[[Config, dict[str, str]], tuple[Config, Mapping[str, str]]]
"""A change of the node registry: (current config, a copy of the node keys) -> (the new
config, the new node keys)."""


class Settings:
    """config.yaml + secrets.yaml + node.id of one data dir. Create it with :meth:`open`.

    ``secrets`` holds the admin token and the node and backend keys (its ``access_keys``
    stays empty); the access keys are ``keys``, their own store (:mod:`proxy.access.key_store`),
    which shares the one writer and has secrets.yaml written here, whole."""

    def __init__(self, data_dir: Path, config_path: Path, config: Config, secrets: Secrets,
                 node_id: str, *, text: str | None = None) -> None:
        self.data_dir = data_dir
        self.config_path = config_path
        self.config = config
        self.secrets = attrs.evolve(secrets, access_keys=[])
        self.node_id = node_id
        self._subscribers: Subscribers[Config] = Subscribers()
        self._writer = trio.Lock()  # one write at a time, each in a worker thread
        self.keys = KeyStore(secrets.access_keys, writer=self._writer, save=self._save_keys)
        # how file work leaves the loop (tests on a MockClock run it inline instead)
        self.in_thread: Callable[..., Awaitable[Any]] = trio.to_thread.run_sync
        self.file = ConfigFile(config_path, dump_config_yaml(config) if text is None else text,
                               ConfigHistory(data_dir / HISTORY_DIR))
        self.on_reload: Callable[[Reload], None] | None = None  # the watcher's report

    def __repr__(self) -> str:
        return (
            f"Settings(data_dir={str(self.data_dir)!r}, config_path={str(self.config_path)!r}, "
            f"node_id={self.node_id!r}, secrets={self.secrets!r}, keys={self.keys!r}, "
            f"subscribers={len(self._subscribers)})"
        )

    @property
    def secrets_path(self) -> Path:
        return self.data_dir / SECRETS_FILE

    @classmethod
    def open(cls, data_dir: Path, config_path: Path | None = None) -> Settings:
        """Load (and on first start create) the data dir's files. Synchronous: it runs once,
        before the gateway starts.

        Raises :class:`ConfigError` for an invalid config (the caller exits 2). A config
        file named explicitly must exist; the default one is written on first start.
        """
        data_dir = Path(data_dir)
        make_data_dir(data_dir)
        if config_path is None:
            config_path = data_dir / CONFIG_FILE
            if not config_path.exists():
                atomic_write(config_path, dump_config_yaml(default_config()).encode(), 0o600)
        text = read_text(config_path)
        config = parse_config_text(text)
        check_files(config, data_dir)
        secrets_file = data_dir / SECRETS_FILE
        if secrets_file.exists():
            loaded = Secrets.from_text(read_text(secrets_file), str(secrets_file))
            if stat.S_IMODE(secrets_file.stat().st_mode) & 0o077:
                os.chmod(secrets_file, 0o600)  # ours, and it must not be readable by others
        else:
            loaded = Secrets(admin_token="")
        self = cls(data_dir, config_path, config, loaded, _load_node_id(data_dir), text=text)
        if not self.secrets.admin_token:
            self.secrets.admin_token = secrets.token_urlsafe(32)
            self._write_secrets_text(dump_secrets_yaml(self._secrets_file()))
        return self

    def subscribe(self, callback: Callable[[Config], None]) -> Callable[[], None]:
        """Call ``callback(new_config)`` after every config change; returns an unsubscriber."""
        return self._subscribers.subscribe(callback)

    # ------------------------------------------------------------------------ the config

    async def update(self, new: Config, *, source: str = "api") -> Config:
        """Replace the config with ``new``: see :meth:`edit`."""
        return await self.edit(lambda _: new, source=source)

    async def edit(self, change: Callable[[Config], Config], *, source: str = "api") -> Config:
        """Apply ``change`` to the current config, derive the health_check block, validate,
        save, then publish. Returns the config as stored.

        ``change`` runs under the one writer, on the config as it is then (a hand edit of
        the file not yet applied is applied first). An invalid result raises
        :class:`ConfigError` (as does ``change`` itself) and a failed write OSError; either
        way nothing changes (neither the file nor ``.config``).
        """
        async with self._writer:
            await self._take_in_hand_edit()
            cfg = await self._checked(change(self.config))
            await self.in_thread(self._write_config, cfg, source,
                                          changed_sections(self.config, cfg))
            self._publish(cfg)
            return cfg

    async def edit_nodes(self, change: NodesChange) -> Config:
        """Change the config and the node keys together (the node registry), as :meth:`edit`
        does. secrets.yaml is written first (when a key changed), then config.yaml; when the
        second write fails the first is undone, so the two files always agree."""
        async with self._writer:
            await self._take_in_hand_edit()
            new, keys = change(self.config, dict(self.secrets.node_keys))
            cfg = await self._checked(new)
            keys = dict(keys)
            sections = changed_sections(self.config, cfg)
            if keys == self.secrets.node_keys:
                await self.in_thread(self._write_config, cfg, "api", sections)
            else:
                before = dump_secrets_yaml(self._secrets_file())
                after = dump_secrets_yaml(attrs.evolve(self._secrets_file(), node_keys=keys))
                await self.in_thread(self._write_both, after, cfg, before, sections)
                self.secrets.node_keys = keys
            self._publish(cfg)
            return cfg

    # ------------------------------------------------------------ hand edits, history

    async def reload_file(self) -> Reload:
        """Read config.yaml and apply it when it changed (a hand edit, SPEC §13): parsed and
        validated as at start, or not applied at all."""
        async with self._writer:
            return await self._reload()

    async def restore(self, version: str) -> Config | None:
        """Apply a kept version of config.yaml (validated, written, live); None when there
        is no such version. ConfigError when it is not valid today, OSError when it cannot
        be written; either way nothing changes."""
        async with self._writer:
            await self._take_in_hand_edit()
            text = await self.in_thread(self.file.history.read, version)
            if text is None:
                return None
            cfg = parse_config_text(text)
            await self._check_files(cfg)
            await self.in_thread(self.file.write, text, "restore",
                                          changed_sections(self.config, cfg))
            self._publish(cfg)
            return cfg

    async def _reload(self) -> Reload:
        file = self.file
        found: Reload = await self.in_thread(file.read)
        if found.outcome == "read":
            found, cfg = file.parse(found, self.config)
            if cfg is not None and found.outcome == "applied":
                try:
                    await self._check_files(cfg)
                except ConfigError as exc:
                    found, cfg = attrs.evolve(found, outcome="invalid", error=exc), None
            if cfg is not None:
                await self.in_thread(file.adopt, found, "file")
                if found.outcome == "applied":  # the watcher's notification tells it
                    self._publish(cfg)
        if self.on_reload is not None and found.outcome != "unsettled":
            self.on_reload(found)
        return found

    async def _checked(self, new: Config) -> Config:
        """``new`` with its health_check block derived, validated, the files it names
        checked (ConfigError otherwise)."""
        cfg = _checked(new)
        await self._check_files(cfg)
        return cfg

    async def _check_files(self, cfg: Config) -> None:
        """The checks of SPEC §3.1 that read the files a config names (GGUF headers, in a
        worker thread, only when a command model has no ``memory``)."""
        if unsized(cfg):
            await self.in_thread(check_files, cfg, self.data_dir)

    async def _take_in_hand_edit(self) -> None:
        """Before a write: apply a hand edit of config.yaml not seen yet, so the write does
        not undo it. One that is not valid is replaced by the write, and kept in the history
        as the file the write replaced (:meth:`ConfigFile.write`)."""
        found = await self._reload()
        self.file.unseen = found.text if found.outcome == "invalid" else None

    # ----------------------------------------------------------------------- the secrets

    async def save_secrets(self) -> None:
        """Write secrets.yaml as it is in memory, for a caller that set ``secrets`` up by
        hand (a test); :meth:`edit_nodes` and the key store change and write in one step."""
        async with self._writer:
            await self._save(self._secrets_file())

    # ------------------------------------------------------------------------- writing

    def _secrets_file(self, keys: tuple[AccessKey, ...] | None = None) -> Secrets:
        """secrets.yaml's content: ``secrets`` with the access keys (``keys``, else the
        store's)."""
        held = self.keys.all if keys is None else keys
        return attrs.evolve(self.secrets, access_keys=[key.stored() for key in held])

    async def _save_keys(self, keys: tuple[AccessKey, ...]) -> None:
        """The key store's write: secrets.yaml with ``keys`` (the store holds the writer)."""
        await self._save(self._secrets_file(keys))

    async def _save(self, content: Secrets) -> None:
        """Write ``content`` as secrets.yaml (the caller holds the writer). The text is made
        here, on the loop, so the thread never reads state the loop may change."""
        await self.in_thread(self._write_secrets_text, dump_secrets_yaml(content))

    def _publish(self, cfg: Config) -> None:
        self.config = cfg
        self._subscribers.publish(cfg)

    def _write_secrets_text(self, text: str) -> None:
        atomic_write(self.secrets_path, text.encode(), 0o600)

    def _write_config(self, cfg: Config, source: str, sections: tuple[str, ...]) -> None:
        self.file.write(dump_config_yaml(cfg), source, sections)

    def _write_both(self, secrets_text: str, cfg: Config, secrets_before: str,
                    sections: tuple[str, ...]) -> None:
        """secrets.yaml, then config.yaml; if the second fails, secrets.yaml as it was."""
        self._write_secrets_text(secrets_text)
        try:
            self._write_config(cfg, "api", sections)
        except OSError:
            try:
                self._write_secrets_text(secrets_before)
            except OSError as exc:  # pragma: no cover - the disk is gone
                log.error("cannot restore secrets.yaml after a failed config write: %s",
                          exc.strerror)
            raise


def _checked(new: Config) -> Config:
    """``new`` with its health_check block derived, validated (ConfigError otherwise)."""
    cfg = rebuild_health_check(new)
    validate_config(cfg)
    return cfg


def _load_node_id(data_dir: Path) -> str:
    path = data_dir / NODE_ID_FILE
    if path.exists():
        node_id = read_text(path).strip()
        if not is_fingerprint(node_id):
            raise ConfigError("", f"{path}: not a valid node id (letters, digits, . _ -)")
        return node_id
    node_id = "node-" + secrets.token_hex(8)
    atomic_write(path, (node_id + "\n").encode(), 0o644)
    return node_id
