"""``GET|PUT /api/v1/settings/api`` (SPEC §8): the API server and local socket settings.

``requireAuth`` applies at once; ``enabled``, ``port``, ``allowExternalAccess`` and
``socketDir`` take effect at the next start, so an answer that changed one of them says
``restartRequired: true`` (and a notification says so until the gateway restarts).
"""

from __future__ import annotations

from typing import Any

import attrs

from protocol.config import Config
from protocol.config.changes import restart_changes
from protocol.errors import ConfigError
from proxy.api.call import Call, saving
from proxy.notifications import Notifications

# JSON field -> (YAML section, YAML key, type check, needs a restart)
FIELDS: dict[str, tuple[str, str, str, bool]] = {
    "enabled": ("api", "enabled", "bool", True),
    "port": ("api", "port", "int", True),
    "allowExternalAccess": ("api", "allow_external_access", "bool", True),
    "requireAuth": ("api", "require_auth", "bool", False),
    "socketDir": ("local", "socket_dir", "path", True),
}
RESTART_CODE = "restart_required"
READ_ONLY = frozenset({"restartRequired"})  # computed by the server: ignored in a PUT


def api_view(cfg: Config, restart: bool) -> dict[str, Any]:
    """The GET body (also the ``settings`` event of section ``api``)."""
    out = {field: getattr(getattr(cfg, section), key)
           for field, (section, key, _, _) in FIELDS.items()}
    out["restartRequired"] = restart
    return out


def restart_pending(notifications: Notifications) -> bool:
    """A change that needs a restart was saved since this gateway started."""
    return any(n["code"] == RESTART_CODE for n in notifications.all())


def notify_restart(notifications: Notifications, fields: list[str] | tuple[str, ...]) -> None:
    """Saved changes of fields that apply at the next start (none: nothing to say)."""
    if fields:
        notifications.raise_(
            RESTART_CODE, f"settings changed that apply at the next start ({', '.join(fields)})"
                          ": restart sluice to apply them", level="info")


def get_api(call: Call) -> tuple[int, Any]:
    return 200, api_view(call.ctx.config, restart_pending(call.ctx.notifications))


def _checked(field: str, path: str, kind: str, value: object) -> object:
    if kind == "bool" and not isinstance(value, bool):
        raise ConfigError(path, "expected true or false")
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(path, "expected a whole number")
    if kind == "path":
        if value == "":
            return None
        if value is not None and not isinstance(value, str):
            raise ConfigError(path, "expected a folder path or null")
    return value


async def put_api(call: Call) -> tuple[int, Any]:
    """Validate every field, then save them all at once, or change nothing (422 naming the
    dotted YAML path; 500 when the file cannot be written)."""
    doc = call.json_object()
    ctx = call.ctx
    changes: dict[str, dict[str, Any]] = {"api": {}, "local": {}}
    for field, value in doc.items():
        if field in READ_ONLY:  # the GET's own shape is always accepted back (SPEC §8)
            continue
        spec = FIELDS.get(field)
        if spec is None:
            raise ConfigError(field, f"unknown field; expected one of {', '.join(FIELDS)}")
        section, key, kind, _ = spec
        changes[section][key] = _checked(field, f"{section}.{key}", kind, value)
    changed: list[str] = []

    def change(old: Config) -> Config:
        new = attrs.evolve(old, api=attrs.evolve(old.api, **changes["api"]),
                           local=attrs.evolve(old.local, **changes["local"]))
        changed[:] = restart_changes(old, new)
        return new

    with saving("the settings"):
        stored = await ctx.settings.edit(change)  # ConfigError (422) changes nothing
    notify_restart(ctx.notifications, changed)
    return 200, api_view(stored, bool(changed) or restart_pending(ctx.notifications))
