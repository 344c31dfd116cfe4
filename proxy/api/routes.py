"""The gateway's own endpoints: a table of path → method → handler, each a small function.

Every ``/v1/*`` path not in the table is an OpenAI call relayed to a model server, so its
only method is POST.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from protocol.errors import (
    method_not_allowed,
    method_not_implemented,
    model_not_found,
    not_found,
)
from proxy.api import (
    access_keys,
    console,
    metrics_api,
    models_local,
    nodes,
    ollama_routes,
    pairing,
    pool_status,
    requests_api,
    settings_aliases,
    settings_api,
    settings_discovery,
    settings_history,
    settings_lb,
)
from proxy.api.call import Call, Handler
from proxy.api.model_list import model_entries
from proxy.observe import events
from proxy.routing.stats import routing_stats as stats_of

__all__ = ["NEEDS_MODELS", "ROUTES", "AnyHandler", "AsyncHandler", "Call", "Handler", "route"]

AsyncHandler = Callable[[Call], Awaitable[tuple[int, Any]]]
"""A handler that must wait for something (adding a node asks the node who it is)."""
AnyHandler = Handler | AsyncHandler


def health(call: Call) -> tuple[int, Any]:
    return 200, {"status": "ok"}


def list_models(call: Call) -> tuple[int, Any]:
    return 200, {"object": "list", "data": model_entries(call.ctx, call.grant)}


def get_model(call: Call) -> tuple[int, Any]:
    model_id = call.path[len("/v1/models/"):]
    for entry in model_entries(call.ctx, call.grant):
        if entry["id"] == model_id:
            return 200, entry
    raise model_not_found(model_id)


def notifications(call: Call) -> tuple[int, Any]:
    """SPEC §8: ``{"notifications": [{code, level, message, createdAt}, ...]}``."""
    return 200, {"notifications": call.ctx.notifications.all()}


def inference_status(call: Call) -> tuple[int, Any]:
    """SPEC §8 (the seed's example): counts of what is loaded and where the gateway
    listens; beyond the contract, ``models`` (the ids), each local backend and each managed
    model server (state, pid, address, restarts)."""
    ctx = call.ctx
    kinds: dict[str, list[str]] = {"llm": [], "diffusion": [], "embedding": []}
    loaded: list[str] = []
    backends = []
    for backend in ctx.backends.backends:
        entry = backend.status()
        for model_id in entry["models"]:
            if model_id not in loaded:
                loaded.append(model_id)
                kinds.setdefault(backend.kind, []).append(model_id)
        backends.append(entry)
    body: dict[str, Any] = {
        "available": bool(loaded),
        "routerRunning": True,
        "routerPort": ctx.tcp_port,
        "loadedModels": len(loaded),
        "llmModels": len(kinds["llm"]),
        "diffusionModels": len(kinds["diffusion"]),
    }
    if ctx.socket_path is not None:
        body["socketPath"] = ctx.socket_path
    else:
        body["localTcp"] = f"127.0.0.1:{ctx.local_tcp_port}"
    if ctx.config.load_balancing.enabled:
        body["distributed"] = pool_status.summary(ctx.nodes, ctx.config)
    body["models"] = loaded
    body["backends"] = backends
    body["managedModels"] = ctx.ondemand.status() if ctx.ondemand else []
    return 200, body


def distributed_status(call: Call) -> tuple[int, Any]:
    """SPEC §8: the pool, its models and each enabled node in priority order."""
    return 200, pool_status.pool_status(call.ctx.nodes, call.ctx.config)


def routing_stats(call: Call) -> tuple[int, Any]:
    """SPEC §8: per-node and local attempt counters, breaker states, failovers."""
    return 200, stats_of(call.ctx.router, call.ctx.config)


def live_events(call: Call) -> tuple[int, Any]:
    """SPEC §9.3: the events WebSocket (proxy.observe.events); its hello frame holds the
    bodies of GET endpoints of this table."""
    return events.upgrade(call, route)


ROUTES: dict[str, dict[bytes, AnyHandler]] = {
    "/health": {b"GET": health},
    "/metrics": {b"GET": metrics_api.scrape},
    "/v1/models": {b"GET": list_models},
    "/api/v1/inference/models": {b"GET": list_models},
    "/api/v1/inference/status": {b"GET": inference_status},
    "/api/v1/pool/distributed-status": {b"GET": distributed_status},
    "/api/v1/pool/routing-stats": {b"GET": routing_stats},
    "/api/v1/nodes/routing-stats": {b"GET": routing_stats},
    "/admin/stats": {b"GET": routing_stats},
    "/api/v1/notifications": {b"GET": notifications},
    "/api/v1/requests": {b"GET": requests_api.list_requests},
    "/api/v1/events": {b"GET": live_events},
    "/api/v1/access-keys": {b"GET": access_keys.list_keys, b"POST": access_keys.create_key},
    "/api/v1/settings/api": {b"GET": settings_api.get_api, b"PUT": settings_api.put_api},
    "/api/v1/settings/load-balancing": {b"GET": settings_lb.get_load_balancing,
                                        b"PUT": settings_lb.put_load_balancing},
    "/api/v1/settings/timeouts": {b"GET": settings_lb.get_timeouts,
                                  b"PUT": settings_lb.put_timeouts},
    "/api/v1/settings/aliases": {b"GET": settings_aliases.get_aliases,
                                 b"PUT": settings_aliases.put_aliases},
    settings_discovery.PATH: {b"GET": settings_discovery.get_discovery,
                              b"PUT": settings_discovery.put_discovery},
    settings_discovery.DISCOVERED_PATH: {b"GET": settings_discovery.discovered},  # SPEC §14
    settings_history.PATH: {b"GET": settings_history.list_history},
    "/api/v1/node/identity": {b"GET": nodes.identity},
    models_local.PATH: {b"GET": models_local.list_local},
    models_local.PREFIX + "rescan": {b"POST": models_local.rescan},
    "/api/v1/nodes": {b"GET": nodes.list_nodes, b"POST": nodes.add_node},
    "/api/v1/nodes/order": {b"PUT": nodes.put_order},
    pairing.PATH: {b"GET": pairing.show_code, b"POST": pairing.make_code,
                   b"DELETE": pairing.cancel_code},
    pairing.CLAIM_PATH: {b"POST": pairing.claim_code},
    "/ui": {b"GET": console.redirect, b"HEAD": console.redirect},
    "/ui/": {b"GET": console.serve_file, b"HEAD": console.serve_file},
}

ROUTES.update(ollama_routes.ROUTES)  # type: ignore[arg-type]  # the Ollama API (SPEC §12)

# Paths with a trailing parameter: prefix -> method -> handler.
PREFIXES: dict[str, dict[bytes, AnyHandler]] = {
    "/v1/models/": {b"GET": get_model},
    access_keys.PREFIX: {b"PATCH": access_keys.update_key, b"DELETE": access_keys.revoke_key},
    models_local.PREFIX: {b"POST": models_local.model_action},
    **ollama_routes.PREFIXES,  # type: ignore[dict-item]
    nodes.PREFIX: {b"PATCH": nodes.patch_node, b"DELETE": nodes.delete_node},
    settings_history.PREFIX: {b"POST": settings_history.restore},
    "/ui/": {b"GET": console.serve_file, b"HEAD": console.serve_file},
}

NEEDS_MODELS: frozenset[AnyHandler] = frozenset({list_models, get_model})

_RELAYED: dict[bytes, AnyHandler | None] = {b"POST": None}


IMPLEMENTED = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"})


def route(method: bytes, path: str) -> AnyHandler | None:
    """The handler for a gateway endpoint; None for an OpenAI call to relay.
    Raises 501 for a method implemented nowhere (whatever the path), 404 for unknown paths
    and 405 (with Allow) for a known path's wrong method."""
    if method not in IMPLEMENTED:
        raise method_not_implemented(method.decode("latin-1"))
    methods: dict[bytes, AnyHandler | None] | None = ROUTES.get(path)  # type: ignore[assignment]
    if methods is None:
        for prefix, table in PREFIXES.items():
            if path.startswith(prefix) and len(path) > len(prefix):
                methods = table  # type: ignore[assignment]
                break
        else:
            methods = _RELAYED if path.startswith("/v1/") else None
        if methods is None:
            raise not_found(f"no such endpoint: {path}")
    if method not in methods:
        raise method_not_allowed(method.decode("latin-1"),
                                 tuple(m.decode() for m in methods))
    return methods[method]

