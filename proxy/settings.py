"""The single owner of config.yaml, secrets.yaml and node.id (SPEC §2).

:class:`Settings` loads and validates the config, writes every change atomically (temp file
in the same folder, fsync, rename, fsync of the folder) and hands the new immutable
:class:`Config` to its subscribers. Secret values never reach config.yaml, exceptions,
logs or ``repr()``.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
import yaml

from protocol.access import check_secret_maps
from protocol.config import (
    Config,
    default_config,
    dump_config_yaml,
    parse_config_text,
    rebuild_health_check,
    validate_config,
)
from protocol.errors import ConfigError

__all__ = ["Secrets", "Settings", "check_config", "now_iso", "resolve_data_dir"]

log = logging.getLogger("sluice.settings")

CONFIG_FILE = "config.yaml"
SECRETS_FILE = "secrets.yaml"
NODE_ID_FILE = "node.id"
_NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def now_iso() -> str:
    """The timestamp format of every file and answer: UTC, to the second (``...Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def resolve_data_dir(arg: str | None) -> Path:
    """``--data-dir``, else ``$SLUICE_DATA_DIR``, else ``$XDG_DATA_HOME/sluice``, else
    ``~/.local/share/sluice``."""
    if arg:
        return Path(arg).expanduser().absolute()
    env = os.environ.get("SLUICE_DATA_DIR")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore relative paths
        return Path(xdg) / "sluice"
    return Path.home() / ".local" / "share" / "sluice"


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data``: temp file in the same folder, fsync, rename, fsync."""
    folder = path.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_text(path: Path) -> str:
    """A config-ish file as text; problems become ConfigError (never with the content)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path}: not valid UTF-8 text") from None
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot read ({exc.strerror})") from None


# --------------------------------------------------------------------------------- secrets


@attrs.define(repr=False)
class Secrets:
    """The contents of secrets.yaml. ``repr()`` shows counts only, never a value."""

    admin_token: str
    node_keys: dict[str, str] = attrs.field(factory=dict)  # fingerprint -> API key
    backend_keys: dict[str, str] = attrs.field(factory=dict)  # backend name -> API key
    # Access keys as stored (id, name, hash, timestamps); never the key itself.
    access_keys: list[dict[str, Any]] = attrs.field(factory=list)

    def __repr__(self) -> str:
        return (
            f"Secrets(admin_token={'<set>' if self.admin_token else '<unset>'}, "
            f"node_keys={len(self.node_keys)}, backend_keys={len(self.backend_keys)}, "
            f"access_keys={len(self.access_keys)})"
        )

    __str__ = __repr__

    def to_dict(self) -> dict[str, Any]:
        return {
            "admin_token": self.admin_token,
            "node_keys": dict(self.node_keys),
            "backend_keys": dict(self.backend_keys),
            "access_keys": [dict(k) for k in self.access_keys],
        }

    @classmethod
    def from_text(cls, text: str, where: str) -> Secrets:
        """Parse secrets.yaml; error messages name keys and positions, never values."""
        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            pos = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError("", f"{where}: malformed YAML{pos}") from None
        except yaml.YAMLError:
            raise ConfigError("", f"{where}: malformed YAML") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError("", f"{where}: the top level must be a mapping")
        unknown = [k for k in data if k not in ("admin_token", "node_keys", "backend_keys",
                                                "access_keys")]
        if unknown:
            raise ConfigError("", f"{where}: unknown key {str(unknown[0])!r}")
        token = data.get("admin_token") or ""
        if not isinstance(token, str):
            raise ConfigError("", f"{where}: admin_token must be a string")
        maps: dict[str, dict[str, str]] = {}
        for name in ("node_keys", "backend_keys"):
            value = data.get(name) or {}
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ConfigError("", f"{where}: {name} must map names to strings")
            maps[name] = dict(value)
        access = data.get("access_keys") or []
        if not isinstance(access, list) or not all(isinstance(k, dict) for k in access):
            raise ConfigError("", f"{where}: access_keys must be a list of mappings")
        try:
            check_secret_maps(maps)
        except ConfigError as exc:
            raise ConfigError(exc.path, f"{where}: {exc.path}: bad key format "
                                        "(visible ASCII only, no spaces)") from None
        return cls(token, maps["node_keys"], maps["backend_keys"], [dict(k) for k in access])


# -------------------------------------------------------------------------------- settings


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
        if not data_dir.exists():
            data_dir.mkdir(mode=0o700, parents=True)
            os.chmod(data_dir, 0o700)  # whatever the umask says
        if config_path is None:
            config_path = data_dir / CONFIG_FILE
            if not config_path.exists():
                _atomic_write(config_path, dump_config_yaml(default_config()).encode(), 0o600)
        config = parse_config_text(_read_text(config_path))
        secrets_file = data_dir / SECRETS_FILE
        if secrets_file.exists():
            loaded = Secrets.from_text(_read_text(secrets_file), str(secrets_file))
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
        _atomic_write(self._config_target(), dump_config_yaml(cfg).encode(), self._config_mode())
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
        text = yaml.safe_dump(self.secrets.to_dict(), sort_keys=False, allow_unicode=True)
        header = "# sluice secrets: keep this file private (mode 0600).\n"
        _atomic_write(self.secrets_path, (header + text).encode(), 0o600)

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
        node_id = _read_text(path).strip()
        if not _NODE_ID_RE.fullmatch(node_id):
            raise ConfigError("", f"{path}: not a valid node id (letters, digits, . _ -)")
        return node_id
    node_id = "node-" + secrets.token_hex(8)
    _atomic_write(path, (node_id + "\n").encode(), 0o644)
    return node_id


def check_config(config_path: Path) -> int:
    """``sluice check-config``: print ``ok: <path>`` and return 0, or the error and 2."""
    try:
        text = _read_text(Path(config_path))  # its errors already name the file
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    try:
        parse_config_text(text)
    except ConfigError as exc:
        print(f"error: {config_path}: {exc.message}", file=sys.stderr)
        return 2
    print(f"ok: {config_path}")
    return 0
