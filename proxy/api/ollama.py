"""The Ollama API's own endpoints (SPEC §12): ``GET /api/tags``, ``GET /api/ps``,
``POST /api/show``, ``GET /api/version``, and a clear refusal for the endpoints that manage
model files. The bodies are made by :mod:`protocol.ollama`. This module (and with it
:mod:`protocol.ollama`) is imported by the first Ollama request: the route table is
:mod:`proxy.api.ollama_routes`, which also marks the endpoints that run a model."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from protocol.model_state import ModelState
from protocol.ollama import (
    JSON_TYPE,
    LoadedModel,
    ModelFacts,
    facts_from_entry,
    model_not_found,
    not_supported,
    ps_body,
    show_body,
    show_model,
    tags_body,
    version_body,
)
from proxy.api.call import Body, Call
from proxy.api.model_list import model_entries
from proxy.timestamps import wall

if TYPE_CHECKING:
    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext


def _facts(ctx: GatewayContext, grant: Grant | None = None) -> dict[str, ModelFacts]:
    """Every model of the unified list (SPEC §7.5) as Ollama lists it (for a limited key,
    those it may use), with the context its list entry carries (SPEC §17.2); a managed
    model with its file's size, ``gguf`` and its architecture when its header was read."""
    ondemand = ctx.ondemand
    out = {}
    for entry in model_entries(ctx, grant):
        name = entry["id"]
        context = entry.get("context_length")
        context = context if type(context) is int and context > 0 else 0
        found = ondemand.entries.get(name) if ondemand is not None else None
        if found is None or ondemand is None:
            out[name] = facts_from_entry(entry, context_length=context)
            continue
        model = ondemand.lifecycle.models.get(name)
        family = model.spec.architecture if model is not None else ""
        out[name] = ModelFacts(name=name, size=found.size, format="gguf", family=family,
                               context_length=context)
    return out


def _json(data: bytes, status: int = 200) -> tuple[int, Any]:
    return status, Body(JSON_TYPE, data)


def tags(call: Call) -> tuple[int, Any]:
    return _json(tags_body(_facts(call.ctx, call.grant).values()))


def ps(call: Call) -> tuple[int, Any]:
    """The loaded managed models, with when each unloads if still idle."""
    ctx = call.ctx
    ondemand = ctx.ondemand
    loaded = []
    if ondemand is not None:
        facts = _facts(ctx)
        wall_now, now = wall(), trio.current_time()
        for name, model in ondemand.lifecycle.models.items():
            if model.state is not ModelState.LOADED or name not in facts:
                continue
            idle = model.idle_time
            if math.isinf(idle):
                expires = math.inf
            elif model.in_flight:  # its idle clock starts when its requests end
                expires = wall_now + idle
            else:
                expires = wall_now + max(0.0, model.unloads_at() - now)
            loaded.append(LoadedModel(facts[name], model.memory or model.spec.estimate,
                                      expires))
    return _json(ps_body(loaded, wall()))


def show(call: Call) -> tuple[int, Any]:
    name = show_model(call.body)
    facts = _facts(call.ctx).get(name)
    if facts is None:
        raise model_not_found(name)
    return _json(show_body(facts))


def version(call: Call) -> tuple[int, Any]:
    return _json(version_body())


def refuse(call: Call) -> tuple[int, Any]:
    """``/api/pull``, ``/api/push``, ``/api/create``, ``/api/copy``, ``/api/delete``,
    ``/api/blobs/...``: sluice does not manage model files that way."""
    raise not_supported(call.path)
