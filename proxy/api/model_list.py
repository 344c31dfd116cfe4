"""The unified model list (SPEC §7.5), as ``/v1/models`` and the Ollama API's listings
read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.aliases import alias_entries
from protocol.openai import merge_model_lists
from protocol.served_context import entry_context, with_context
from protocol.slots import busy_now, slots_entry

if TYPE_CHECKING:
    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext
    from proxy.registry.backends import BackendRegistry


def model_entries(ctx: GatewayContext, grant: Grant | None = None) -> list[dict[str, Any]]:
    """SPEC §7.5: local models, then (load balancing on) the nodes' as ``remote``; then the
    exact aliases whose target is listed (SPEC §12). For a request that presented an access
    key with ``models`` (``grant``), only the ones it may use (SPEC §13). A local model
    whose servers report slots says so in its ``sluice`` facts (SPEC §15), and one whose
    context is known its ``context_length`` and ``max_model_len`` (SPEC §17.2)."""
    local = ctx.backends.model_entries()
    ondemand = ctx.ondemand
    if ondemand is not None:
        local = ondemand.listed(local)
    local = with_slots(ctx.backends, local, ctx.router.backend_in_flight)
    local = with_served_context(ctx.backends, local,
                                None if ondemand is None else ondemand.contexts.planned)
    config = ctx.config
    if config.load_balancing.enabled:
        local = merge_model_lists([("", local)], ctx.nodes.remote_models())
    listed = alias_entries(config.aliases, local) if config.aliases else local
    if grant is None or grant.limits.models is None:
        return listed
    allows = grant.limits.allows
    return [e for e in listed if allows(e["id"]) or allows(_alias_of(e))]


def with_slots(backends: BackendRegistry, entries: list[dict[str, Any]],
               in_flight: Callable[[str], int]) -> list[dict[str, Any]]:
    """The local ``entries`` with ``"sluice": {..., "slots": {"busy": B, "total": T}}`` on
    each model that a live backend holding it reports slots for: T and B summed over those
    backends, B counting our own requests in flight now (``in_flight(backend name)``: what
    a node tells its peers, SPEC §15). An entry is copied, never changed; one without
    slots is left as it is."""
    out = entries
    for i, entry in enumerate(entries):
        busy = total = 0
        for backend in backends.holders_of(entry["id"]):
            slots = backend.slots
            if slots is not None:
                busy += busy_now(in_flight(backend.name), slots)
                total += slots.total
        if not total:
            continue
        if out is entries:
            out = list(entries)
        extra = entry.get("sluice")
        out[i] = {**entry, "sluice": {**(extra if isinstance(extra, dict) else {}),
                                      "slots": slots_entry(busy, total)}}
    return out


def with_served_context(backends: BackendRegistry, entries: list[dict[str, Any]],
                        planned: Callable[[str], int | None] | None) -> list[dict[str, Any]]:
    """The local ``entries`` with the context one request can use (SPEC §17.2): what the
    first live server holding the model says in ``/props``, else what the entry itself
    says (``max_model_len``, ``meta.n_ctx``), else, for a managed model, ``planned``'s
    (its configuration's). An entry is copied, never changed."""
    out = []
    for entry in entries:
        holder = backends.holder_of(entry["id"])
        served = None if holder is None or holder.served is None else holder.served.per_slot
        if served is None:
            served = entry_context(entry)
        if served is None and planned is not None:
            served = planned(entry["id"])
        out.append(with_context(entry, served))
    return out


def _alias_of(entry: dict[str, Any]) -> str:
    """The target of an alias's entry; "" for a model's own."""
    extra = entry.get("sluice")
    target = extra.get("aliasOf") if isinstance(extra, dict) else None
    return target if isinstance(target, str) else ""
