"""The contents of secrets.yaml (SPEC §2, §5): parsed and written as text (pure).

Admin token, node and backend API keys, and access keys as stored (their hashes, never the
keys). Values never reach ``repr()``, ``str()`` or an error message: errors name keys and
positions only.
"""

from __future__ import annotations

from typing import Any

import attrs
import yaml

from protocol.access import check_secret_maps
from protocol.errors import ConfigError
from protocol.key_limits import check_stored
from protocol.yaml_loader import load_yaml

__all__ = ["SECRETS_HEADER", "Secrets", "dump_secrets_yaml"]

SECRETS_HEADER = "# sluice secrets: keep this file private (mode 0600).\n"
_KEYS = ("admin_token", "node_keys", "backend_keys", "access_keys")


@attrs.define(repr=False)
class Secrets:
    """The contents of secrets.yaml. ``repr()`` shows counts only, never a value."""

    admin_token: str
    node_keys: dict[str, str] = attrs.field(factory=dict)  # fingerprint -> API key
    backend_keys: dict[str, str] = attrs.field(factory=dict)  # backend name -> API key
    # Access keys as stored (id, name, hash, timestamps, limits: protocol.key_limits);
    # never the key itself.
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
            data = load_yaml(text)
        except ConfigError as exc:
            raise ConfigError("", f"{where}: {exc.message}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError("", f"{where}: the top level must be a mapping")
        unknown = [k for k in data if k not in _KEYS]
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
        for i, entry in enumerate(access):
            try:
                check_stored(entry, f"access_keys[{i}]")
            except ConfigError as exc:  # limits are no secret: the message may say why
                raise ConfigError(exc.path, f"{where}: {exc.message}") from None
        try:
            check_secret_maps(maps)
        except ConfigError as exc:
            raise ConfigError(exc.path, f"{where}: {exc.path}: bad key format "
                                        "(visible ASCII only, no spaces)") from None
        return cls(token, maps["node_keys"], maps["backend_keys"], [dict(k) for k in access])


def dump_secrets_yaml(secrets: Secrets) -> str:
    """secrets.yaml as written: a header line, then the four keys in their order."""
    text = yaml.safe_dump(secrets.to_dict(), sort_keys=False, allow_unicode=True)
    return SECRETS_HEADER + text
