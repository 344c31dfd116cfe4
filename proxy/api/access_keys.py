"""``/api/v1/access-keys`` (SPEC §5): make, list and revoke the keys remote clients send.

A key is shown once, in the answer to its creation; secrets.yaml keeps only its hash.
"""

from __future__ import annotations

from typing import Any

from protocol.access import hash_key, new_access_key
from protocol.errors import SluiceError, bad_request
from protocol.names import LABEL_RULE, is_label
from proxy.api.call import Call
from proxy.timestamps import now_iso


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {"id": entry.get("id"), "name": entry.get("name"),
            "createdAt": entry.get("created_at"), "lastUsedAt": entry.get("last_used_at")}


def list_keys(call: Call) -> tuple[int, Any]:
    return 200, [_public(e) for e in call.ctx.settings.secrets.access_keys]


def create_key(call: Call) -> tuple[int, Any]:
    doc = call.json_object(empty_ok=True)
    unknown = sorted(set(doc) - {"name"})
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", param=unknown[0])
    name = doc.get("name")
    if name is None:
        name = ""
    if not is_label(name):
        raise bad_request(f"name {LABEL_RULE}", param="name")
    settings = call.ctx.settings
    stored = settings.secrets.access_keys
    taken = {e.get("id") for e in stored}
    key_id, key = new_access_key()
    while key_id in taken:  # pragma: no cover - 48 random bits
        key_id, key = new_access_key()
    entry = {"id": key_id, "name": name, "hash": hash_key(key), "created_at": now_iso(),
             "last_used_at": None}
    stored.append(entry)
    try:
        settings.save_secrets()
    except OSError as exc:
        stored.remove(entry)
        raise SluiceError(500, f"cannot write secrets.yaml: {exc.strerror}",
                          type="server_error", code="internal_error") from None
    call.ctx.notifications.clear("external_access_without_keys")
    return 201, {"id": key_id, "name": name, "key": key, "createdAt": entry["created_at"]}


def revoke_key(call: Call) -> tuple[int, Any]:
    key_id = call.path.rsplit("/", 1)[1]
    settings = call.ctx.settings
    stored = settings.secrets.access_keys
    for entry in stored:
        if entry.get("id") == key_id:
            break
    else:
        raise SluiceError(404, f"no access key with id {key_id!r}",
                          type="invalid_request_error", code="not_found", param="id")
    index = stored.index(entry)
    stored.remove(entry)
    try:
        settings.save_secrets()
    except OSError as exc:
        stored.insert(index, entry)
        raise SluiceError(500, f"cannot write secrets.yaml: {exc.strerror}",
                          type="server_error", code="internal_error") from None
    return 200, {"id": key_id, "deleted": True}
