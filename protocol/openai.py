"""OpenAI shapes: model lists and their merge (SPEC §7.5)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parse_model_list(body: bytes) -> list[dict[str, Any]]:
    """The model entries of a ``GET /v1/models`` answer (OpenAI ``data`` list).

    Entries without a string ``id`` are skipped; raises ValueError when the body is not an
    OpenAI model list at all.
    """
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError("not an OpenAI model list (no \"data\" array)")
    entries: list[dict[str, Any]] = []
    for item in doc["data"]:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            entries.append(item)
    return entries


def model_entry(raw: dict[str, Any], default_owner: str) -> dict[str, Any]:
    """One entry of the unified list: id, object, created, owned_by, and every other field
    the upstream sent as it sent it (SPEC §17.2: ``max_model_len``, ``meta``...)."""
    created = raw.get("created")
    owner = raw.get("owned_by")
    return {
        **raw,
        "id": raw["id"],
        "object": "model",
        "created": created if type(created) is int else 0,
        "owned_by": owner if isinstance(owner, str) and owner else default_owner,
    }


def merge_model_lists(
    local: Iterable[tuple[str, Iterable[dict[str, Any]]]],
    remote: Iterable[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Local models first (owner as reported, else the backend name; a managed model with
    its ``sluice`` state), then remote ones marked ``owned_by: "remote"``; a duplicate id
    keeps its first (local) entry. Every entry keeps the other fields it came with
    (``context_length``, ``max_model_len``...), but for a remote one its node's ``sluice``
    facts, which describe the node's own servers."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for backend_name, entries in local:
        for raw in entries:
            if raw["id"] not in seen:
                seen.add(raw["id"])
                out.append(model_entry(raw, backend_name))
    for raw in remote:
        if raw["id"] not in seen:
            seen.add(raw["id"])
            entry = model_entry(raw, "remote")
            entry["owned_by"] = "remote"
            entry.pop("sluice", None)  # the node's facts of its own servers (state, slots)
            out.append(entry)
    return out


def model_list_body(entries: list[dict[str, Any]]) -> bytes:
    return json.dumps({"object": "list", "data": entries}, separators=(",", ":")).encode()
