"""``/api/v1/access-keys`` (SPEC §5, §13): make, list, limit and revoke the keys clients
send.

A key is shown once, in the answer to its creation; secrets.yaml keeps only its hash and
its limits (``models``, ``rpm``, ``expires_at``, ``priority``: :mod:`protocol.key_limits`).
The key store makes each change and writes it (:meth:`KeyStore.add`, :meth:`KeyStore.update`,
:meth:`KeyStore.revoke`: :mod:`proxy.access.key_store`); a failed write answers 500 and changes
nothing. A field the body should not have, or a bad value, answers
422 naming it in ``error.param``.
"""

from __future__ import annotations

from typing import Any

from protocol.config.fields import unknown_field
from protocol.errors import ConfigError, no_such_item
from protocol.key_limits import parse_expiry, parse_models, parse_priority, parse_rpm
from protocol.names import LABEL_RULE, is_label
from proxy.access.key_store import AccessKey
from proxy.api.call import Call, saving

FIELDS = ("name", "models", "rpm", "expiresAt", "priority")  # what a POST or PATCH body may hold
PREFIX = "/api/v1/access-keys/"


def _public(key: AccessKey, now: float) -> dict[str, Any]:
    limits = key.limits
    return {"id": key.get("id"), "name": key.get("name"),
            "createdAt": key.get("created_at"), "lastUsedAt": key.get("last_used_at"),
            "models": None if limits.models is None else list(limits.models),
            "rpm": limits.rpm, "expiresAt": limits.expires_at,
            "priority": limits.priority or "interactive", "expired": limits.expired(now)}


def _fields(call: Call, *, empty_ok: bool) -> dict[str, Any]:
    """The body's fields, checked, in the stored (snake_case) names; only those given."""
    doc = call.json_object(empty_ok=empty_ok)
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise unknown_field(unknown[0], FIELDS)
    out: dict[str, Any] = {}
    if "name" in doc:
        name = "" if doc["name"] is None else doc["name"]
        if not is_label(name):
            raise ConfigError("name", LABEL_RULE)
        out["name"] = name
    if "models" in doc:
        out["models"] = parse_models(doc["models"], "models")
    if "rpm" in doc:
        out["rpm"] = parse_rpm(doc["rpm"], "rpm")
    if "expiresAt" in doc:
        out["expires_at"] = parse_expiry(doc["expiresAt"], "expiresAt")
    if "priority" in doc:  # SPEC §18: its requests' class in the queue
        out["priority"] = parse_priority(doc["priority"], "priority")
    return out


def list_keys(call: Call) -> tuple[int, Any]:
    now = call.ctx.key_grants.wall()
    return 200, [_public(key, now) for key in call.ctx.settings.keys.all]


async def create_key(call: Call) -> tuple[int, Any]:
    fields = _fields(call, empty_ok=True)
    name = fields.pop("name", "")
    with saving("the access key"):
        entry, key = await call.ctx.settings.keys.add(name, fields)
    call.ctx.notifications.clear("external_access_without_keys")
    shown = _public(entry, call.ctx.key_grants.wall())
    del shown["lastUsedAt"], shown["expired"]
    return 201, {**shown, "key": key}


async def update_key(call: Call) -> tuple[int, Any]:
    key_id = call.path[len(PREFIX):]
    fields = _fields(call, empty_ok=False)
    with saving("the access key"):
        entry = await call.ctx.settings.keys.update(key_id, fields)
    if entry is None:
        raise no_such_item("access key", "id", key_id)
    return 200, _public(entry, call.ctx.key_grants.wall())


async def revoke_key(call: Call) -> tuple[int, Any]:
    key_id = call.path[len(PREFIX):]
    with saving("the access keys"):
        if not await call.ctx.settings.keys.revoke(key_id):
            raise no_such_item("access key", "id", key_id)
    call.ctx.key_grants.forget(key_id)
    return 200, {"id": key_id, "deleted": True}
