"""``/api/v1/access-keys`` (SPEC §5): make, list and revoke the keys remote clients send.

A key is shown once, in the answer to its creation; secrets.yaml keeps only its hash. The
settings make each change and write it (:meth:`Settings.add_access_key`,
:meth:`Settings.revoke_access_key`); a failed write answers 500 and changes nothing.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import bad_request, no_such_item
from protocol.names import LABEL_RULE, is_label
from proxy.api.call import Call, saving


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {"id": entry.get("id"), "name": entry.get("name"),
            "createdAt": entry.get("created_at"), "lastUsedAt": entry.get("last_used_at")}


def list_keys(call: Call) -> tuple[int, Any]:
    return 200, [_public(e) for e in call.ctx.settings.secrets.access_keys]


async def create_key(call: Call) -> tuple[int, Any]:
    doc = call.json_object(empty_ok=True)
    unknown = sorted(set(doc) - {"name"})
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", param=unknown[0])
    name = doc.get("name")
    if name is None:
        name = ""
    if not is_label(name):
        raise bad_request(f"name {LABEL_RULE}", param="name")
    with saving("the access key"):
        entry, key = await call.ctx.settings.add_access_key(name)
    call.ctx.notifications.clear("external_access_without_keys")
    return 201, {"id": entry["id"], "name": name, "key": key, "createdAt": entry["created_at"]}


async def revoke_key(call: Call) -> tuple[int, Any]:
    key_id = call.path.rsplit("/", 1)[1]
    with saving("the access keys"):
        if not await call.ctx.settings.revoke_access_key(key_id):
            raise no_such_item("access key", "id", key_id)
    return 200, {"id": key_id, "deleted": True}
