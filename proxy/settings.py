"""The single owner of config.yaml, secrets.yaml and node.id (SPEC §2).

:class:`Settings` loads and validates the config, writes every change atomically (temp file
in the same folder, fsync, rename, fsync of the folder) and hands the new immutable
:class:`Config` to its subscribers. Secret values never reach config.yaml, exceptions,
logs or ``repr()``.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import trio

from protocol.config import (
    Config,
    default_config,
    dump_config_yaml,
    parse_config_text,
    rebuild_health_check,
    validate_config,
)
from protocol.errors import ConfigError
from protocol.names import is_fingerprint
from protocol.secrets import Secrets, dump_secrets_yaml
from proxy.datadir import CONFIG_FILE, NODE_ID_FILE, SECRETS_FILE, make_data_dir
from proxy.files import atomic_write, read_text
from proxy.timestamps import now_iso

__all__ = ["Secrets", "Settings"]

log = logging.getLogger("sluice.settings")


class Settings:
    """config.yaml + secrets.yaml + node.id of one data dir. Create it with :meth:`open`."""

    def __init__(self, data_dir: Path, config_path: Path, config: Config, secrets: Secrets,
                 node_id: str) -> None:
        self.data_dir = data_dir
        self.config_path = config_path
        self.config = config
        self.secrets = secrets
        self.node_id = node_id
        self._subscribers: list[Callable[[Config], None]] = []
        self._writer = trio.Lock()  # one write at a time, each in a worker thread

    def __repr__(self) -> str:
        return (
            f"Settings(data_dir={str(self.data_dir)!r}, config_path={str(self.config_path)!r}, "
            f"node_id={self.node_id!r}, secrets={self.secrets!r}, "
            f"subscribers={len(self._subscribers)})"
        )

    @property
    def secrets_path(self) -> Path:
        return self.data_dir / SECRETS_FILE

    @classmethod
    def open(cls, data_dir: Path, config_path: Path | None = None) -> Settings:
        """Load (and on first start create) the data dir's files.

        Raises :class:`ConfigError` for an invalid config (the caller exits 2). A config
        file named explicitly must exist; the default one is written on first start.
        """
        data_dir = Path(data_dir)
        make_data_dir(data_dir)
        if config_path is None:
            config_path = data_dir / CONFIG_FILE
            if not config_path.exists():
                atomic_write(config_path, dump_config_yaml(default_config()).encode(), 0o600)
        config = parse_config_text(read_text(config_path))
        secrets_file = data_dir / SECRETS_FILE
        if secrets_file.exists():
            loaded = Secrets.from_text(read_text(secrets_file), str(secrets_file))
            if stat.S_IMODE(secrets_file.stat().st_mode) & 0o077:
                os.chmod(secrets_file, 0o600)  # ours, and it must not be readable by others
        else:
            loaded = Secrets(admin_token="")
        self = cls(data_dir, config_path, config, loaded, _load_node_id(data_dir))
        if not self.secrets.admin_token:
            self.secrets.admin_token = secrets.token_urlsafe(32)
            self.save_secrets()
        return self

    def subscribe(self, callback: Callable[[Config], None]) -> Callable[[], None]:
        """Call ``callback(new_config)`` after every :meth:`update`; returns an unsubscriber."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def update(self, new: Config) -> Config:
        """Validate ``new``, derive its health_check block, save it, then publish it.

        An invalid config raises :class:`ConfigError` and changes nothing (neither the file
        nor ``.config``). Returns the config as stored.
        """
        cfg = rebuild_health_check(new)
        validate_config(cfg)
        atomic_write(self._config_target(), dump_config_yaml(cfg).encode(), self._config_mode())
        self.config = cfg
        for callback in list(self._subscribers):
            callback(cfg)
        return cfg

    async def key_used(self, key_id: str) -> None:
        """Record that an access key was used now. secrets.yaml is written on the key's first
        use in each minute only, in a worker thread (a slow disk never stalls the loop);
        a failed write is logged, never the request's problem."""
        now = now_iso()
        for entry in self.secrets.access_keys:
            if entry.get("id") == key_id:
                break
        else:
            return
        last = entry.get("last_used_at")
        if isinstance(last, str) and last[:16] == now[:16]:
            return
        entry["last_used_at"] = now
        try:
            async with self._writer:
                await trio.to_thread.run_sync(self.save_secrets)
        except OSError as exc:
            log.warning("cannot record an access key's use in secrets.yaml: %s", exc.strerror)

    def save_secrets(self) -> None:
        """Write secrets.yaml atomically with mode 0600."""
        atomic_write(self.secrets_path, dump_secrets_yaml(self.secrets).encode(), 0o600)

    def _config_target(self) -> Path:
        # Write through a symlinked config.yaml (e.g. kept in a dotfiles repo).
        return Path(os.path.realpath(self.config_path))

    def _config_mode(self) -> int:
        try:
            return stat.S_IMODE(self._config_target().stat().st_mode)
        except FileNotFoundError:
            return 0o600


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
