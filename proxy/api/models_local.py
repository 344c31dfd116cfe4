"""The managed models on demand (SPEC §11 "API"): ``GET /api/v1/models/local``, and the
admin's ``POST /api/v1/models/local/{name}/load``, ``.../{name}/unload`` and
``.../rescan``. The work is :class:`~proxy.models.ondemand.OnDemand`'s; these only read the
path and shape the answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.errors import no_such_item, not_found
from protocol.model_room import memory_budget_bytes
from protocol.views import local_models_view
from proxy.api.call import Call

if TYPE_CHECKING:
    from proxy.context import GatewayContext
    from proxy.models.ondemand import OnDemand

PATH = "/api/v1/models/local"
PREFIX = PATH + "/"
ACTIONS = ("load", "unload")


def local_models(ctx: GatewayContext) -> dict[str, Any]:
    """The body of ``GET /api/v1/models/local`` (each model with ``waiting``: its requests
    in the queue, SPEC §18, for ``sluice ps``); ``llamaBackends``: the compute backends of
    the installed llama.cpp (SPEC §11.1; null when it is not installed), which the exchange
    has asked for first (``NEEDS_LLAMA``)."""
    ondemand = ctx.ondemand
    if ondemand is None:  # no models and no folder to find them in
        from proxy.models.ondemand import physical_memory

        loading = ctx.config.model_loading
        return local_models_view(
            [], budget=memory_budget_bytes(loading.memory_budget, physical_memory()),
            in_use=0, max_loaded=loading.max_loaded, backends=ctx.llama.backends)
    life = ondemand.lifecycle
    body = local_models_view(ondemand.status(), budget=life.budget,
                             in_use=ondemand.memory_in_use(), max_loaded=life.max_loaded,
                             backends=ctx.llama.backends)
    waiting = ctx.scheduler.waiting_for  # SPEC §18: requests waiting for each one
    body["models"] = [{**m, "waiting": waiting(m["name"])} for m in body["models"]]
    return body


def list_local(call: Call) -> tuple[int, Any]:
    return 200, local_models(call.ctx)


def _ondemand(call: Call, name: str) -> OnDemand:
    ondemand = call.ctx.ondemand
    if ondemand is None or not ondemand.holds(name):
        raise no_such_item("managed model", "name", name)
    return ondemand


async def rescan(call: Call) -> tuple[int, Any]:
    """Look at model_loading.dirs now: ``{added, removed}`` (names) and the list after."""
    ondemand = call.ctx.ondemand
    found: dict[str, list[str]] = {"added": [], "removed": []}
    if ondemand is not None:
        found = await ondemand.rescan()
    return 200, {**found, **local_models(call.ctx)}


async def model_action(call: Call) -> tuple[int, Any]:
    """``POST .../{name}/load`` answers once it is loaded (or with the load's error);
    ``.../{name}/unload`` once its server is gone, or at once when a request is in flight
    (it goes when that ends)."""
    name, _, action = call.path[len(PREFIX):].rpartition("/")
    if not name or action not in ACTIONS:
        raise not_found(f"no such endpoint: {call.path} (POST {PREFIX}{{name}}/load, "
                        f"{PREFIX}{{name}}/unload or {PREFIX}rescan)")
    ondemand = _ondemand(call, name)
    if action == "load":
        return 200, await ondemand.load(name)
    return 200, await ondemand.unload(name)
