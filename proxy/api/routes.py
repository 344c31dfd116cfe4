"""The gateway's own endpoints: a table of path → who may call it and, by method, its
handler, each a small function. Who may call a path is decided here alone (SPEC §5, §13,
§14): every entry names its :class:`~protocol.access.Rule`, and :func:`unlisted` gives the
rule of every path outside the table; :func:`access_level` reads them.

Every ``/v1/*`` path not in the table is an OpenAI call relayed to a model server, so its
only method is POST.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.access import (
    ADMIN_CHANGES,
    ADMIN_ONLY,
    ANYONE,
    KEY_HOLDERS,
    Access,
    Rule,
)
from protocol.errors import (
    method_not_allowed,
    method_not_implemented,
    model_not_found,
    not_found,
)
from proxy.api import (
    access_keys,
    console,
    events,
    metrics_api,
    models_local,
    nodes,
    ollama_routes,
    pairing,
    pool_status,
    queue_api,
    requests_api,
    settings_aliases,
    settings_api,
    settings_discovery,
    settings_history,
    settings_lb,
)
from proxy.api.call import AnyHandler, AsyncHandler, Call, Endpoint, Handler
from proxy.api.model_list import model_entries
from proxy.routing.stats import routing_stats as stats_of

__all__ = ["NEEDS_LLAMA", "NEEDS_MODELS", "PREFIXES", "ROUTES", "AnyHandler", "AsyncHandler",
           "Call", "Endpoint", "Handler", "access_level", "route", "unlisted"]


def health(call: Call) -> tuple[int, Any]:
    """``status``; and what another computer needs to pair and link (SPEC §16, no secret):
    this gateway's ``identity`` (its certificate's pin) and its ``nodePort`` (null
    without a node listener)."""
    identity = call.ctx.identity
    return 200, {"status": "ok", "identity": None if identity is None else identity.fingerprint,
                 "nodePort": call.ctx.listening.node_port}


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
    listens; beyond the contract, ``models`` (the ids), each local backend, each managed
    model server (state, pid, address, restarts) and ``llamaBackends``, the compute
    backends of the installed llama.cpp (SPEC §11.1; null when it is not installed)."""
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
    identity = ctx.identity  # SPEC §16: this gateway's certificate pin, its node port
    body["identity"] = None if identity is None else identity.fingerprint
    body["nodePort"] = ctx.listening.node_port
    body["models"] = loaded
    body["backends"] = backends
    body["managedModels"] = ctx.ondemand.status() if ctx.ondemand else []
    body["llamaBackends"] = ctx.llama.backends
    return 200, body


def distributed_status(call: Call) -> tuple[int, Any]:
    """SPEC §8: the pool, its models and each enabled node in priority order."""
    return 200, pool_status.pool_status(call.ctx.nodes, call.ctx.config)


def routing_stats(call: Call) -> tuple[int, Any]:
    """SPEC §8: per-node and local attempt counters, breaker states, failovers."""
    return 200, stats_of(call.ctx.router, call.ctx.config)


def live_events(call: Call) -> tuple[int, Any]:
    """SPEC §9.3: the events WebSocket (proxy.api.events); its hello frame holds the
    bodies of GET endpoints of this table."""
    return events.upgrade(call, route)


# Who may call each path (SPEC §5): ANYONE (nothing needed), KEY_HOLDERS (an access key where
# one is needed, whatever the method), ADMIN_CHANGES (reads with a key, writes with the admin
# token), ADMIN_ONLY (the admin token for every method); see protocol.access.Rule.
ROUTES: dict[str, Endpoint] = {
    "/health": Endpoint(ANYONE, {b"GET": health}),
    "/metrics": Endpoint(KEY_HOLDERS, {b"GET": metrics_api.scrape}),
    "/v1/models": Endpoint(KEY_HOLDERS, {b"GET": list_models}),
    "/api/v1/inference/models": Endpoint(ADMIN_CHANGES, {b"GET": list_models}),
    "/api/v1/inference/status": Endpoint(ADMIN_CHANGES, {b"GET": inference_status}),
    "/api/v1/pool/distributed-status": Endpoint(ADMIN_CHANGES, {b"GET": distributed_status}),
    "/api/v1/pool/routing-stats": Endpoint(ADMIN_CHANGES, {b"GET": routing_stats}),
    "/api/v1/nodes/routing-stats": Endpoint(ADMIN_CHANGES, {b"GET": routing_stats}),
    "/admin/stats": Endpoint(ADMIN_ONLY, {b"GET": routing_stats}),
    "/api/v1/notifications": Endpoint(ADMIN_CHANGES, {b"GET": notifications}),
    "/api/v1/requests": Endpoint(ADMIN_CHANGES, {b"GET": requests_api.list_requests}),
    queue_api.PATH: Endpoint(ADMIN_ONLY, {b"GET": queue_api.show_queue}),
    "/api/v1/events": Endpoint(ADMIN_CHANGES, {b"GET": live_events}),
    "/api/v1/access-keys": Endpoint(ADMIN_CHANGES, {b"GET": access_keys.list_keys,
                                                    b"POST": access_keys.create_key}),
    "/api/v1/settings/api": Endpoint(ADMIN_CHANGES, {b"GET": settings_api.get_api,
                                                     b"PUT": settings_api.put_api}),
    "/api/v1/settings/load-balancing": Endpoint(ADMIN_CHANGES, {
        b"GET": settings_lb.get_load_balancing, b"PUT": settings_lb.put_load_balancing}),
    "/api/v1/settings/timeouts": Endpoint(ADMIN_CHANGES, {b"GET": settings_lb.get_timeouts,
                                                          b"PUT": settings_lb.put_timeouts}),
    "/api/v1/settings/aliases": Endpoint(ADMIN_CHANGES, {b"GET": settings_aliases.get_aliases,
                                                         b"PUT": settings_aliases.put_aliases}),
    settings_discovery.PATH: Endpoint(ADMIN_CHANGES, {b"GET": settings_discovery.get_discovery,
                                                      b"PUT": settings_discovery.put_discovery}),
    settings_discovery.DISCOVERED_PATH: Endpoint(ADMIN_CHANGES, {  # SPEC §14
        b"GET": settings_discovery.discovered}),
    settings_history.PATH: Endpoint(ADMIN_CHANGES, {b"GET": settings_history.list_history}),
    "/api/v1/node/identity": Endpoint(ADMIN_CHANGES, {b"GET": nodes.identity}),
    models_local.PATH: Endpoint(ADMIN_CHANGES, {b"GET": models_local.list_local}),
    models_local.PREFIX + "rescan": Endpoint(ADMIN_CHANGES, {b"POST": models_local.rescan}),
    "/api/v1/nodes": Endpoint(ADMIN_CHANGES, {b"GET": nodes.list_nodes,
                                              b"POST": nodes.add_node}),
    "/api/v1/nodes/order": Endpoint(ADMIN_CHANGES, {b"PUT": nodes.put_order}),
    # SPEC §14: whether a code is active, and its tries left, are the admin's even to read;
    # a claim is open to strangers (its one-time code is its key; CLAIM: its body small).
    pairing.PATH: Endpoint(ADMIN_ONLY, {b"GET": pairing.show_code, b"POST": pairing.make_code,
                                        b"DELETE": pairing.cancel_code}),
    pairing.CLAIM_PATH: Endpoint(ADMIN_CHANGES.but(b"POST", Access.CLAIM),
                                 {b"POST": pairing.claim_code}),
    # SPEC §16: the exchange is a claim's kind (no token, no key, a small body), served on
    # the node listener only (PAIRING: the access table says so). The peers are the admin's.
    pairing.EXCHANGE_PATH: Endpoint(ADMIN_CHANGES.but(b"POST", Access.PAIRING),
                                    {b"POST": pairing.exchange}),
    pairing.PEERS_PATH: Endpoint(ADMIN_ONLY, {b"GET": pairing.list_peers}),
    "/ui": Endpoint(KEY_HOLDERS, {b"GET": console.redirect, b"HEAD": console.redirect}),
    "/ui/": Endpoint(KEY_HOLDERS, {b"GET": console.serve_file, b"HEAD": console.serve_file}),
    **ollama_routes.ROUTES,  # the Ollama API (SPEC §12)
}

# Paths with a trailing parameter: prefix -> endpoint (the first prefix that matches).
PREFIXES: dict[str, Endpoint] = {
    "/v1/models/": Endpoint(KEY_HOLDERS, {b"GET": get_model}),
    access_keys.PREFIX: Endpoint(ADMIN_CHANGES, {b"PATCH": access_keys.update_key,
                                                 b"DELETE": access_keys.revoke_key}),
    models_local.PREFIX: Endpoint(ADMIN_CHANGES, {b"POST": models_local.model_action}),
    **ollama_routes.PREFIXES,
    nodes.PREFIX: Endpoint(ADMIN_CHANGES, {b"PATCH": nodes.patch_node,
                                           b"DELETE": nodes.delete_node}),
    settings_history.PREFIX: Endpoint(ADMIN_CHANGES, {b"POST": settings_history.restore}),
    pairing.PEERS_PREFIX: Endpoint(ADMIN_ONLY, {b"DELETE": pairing.unpair}),
    "/ui/": Endpoint(KEY_HOLDERS, {b"GET": console.serve_file, b"HEAD": console.serve_file}),
}

NEEDS_MODELS: frozenset[AnyHandler] = frozenset({list_models, get_model})
# The answers that say which backends llama.cpp has (SPEC §11.1; the events' hello holds two
# of them): the exchange has ctx.llama ask first (once per gateway).
NEEDS_LLAMA: frozenset[AnyHandler] = frozenset({inference_status, models_local.list_local,
                                                models_local.rescan, live_events})

_RELAYED: Mapping[bytes, AnyHandler | None] = {b"POST": None}  # an OpenAI call's methods


def unlisted(path: str) -> Rule:
    """Who may call a path outside the tables: an OpenAI call relayed to a model server, or
    a path answered 404 once let through. The admin's paths and the gateway's own API keep
    their rules there (SPEC §5: ``/admin/*`` and every write under ``/api/v1/`` need the
    admin token), so an unknown path is refused as a known one would be."""
    if path == "/admin" or path.startswith("/admin/"):
        return ADMIN_ONLY
    if path.startswith("/api/v1/"):
        return ADMIN_CHANGES
    return KEY_HOLDERS


IMPLEMENTED = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"})

_PREFIXES = tuple(PREFIXES)  # one test rejects most paths (a model API call) at once


def _endpoint(path: str) -> Endpoint | None:
    found = ROUTES.get(path)
    if found is None and path.startswith(_PREFIXES):
        for prefix, endpoint in PREFIXES.items():
            if path.startswith(prefix) and len(path) > len(prefix):
                return endpoint
    return found


def access_level(method: bytes, path: str) -> Access:
    """What a request must show to be let through (:func:`protocol.access.authorize`),
    decided before it is routed: a method the path does not serve has a level too."""
    endpoint = _endpoint(path)
    return (unlisted(path) if endpoint is None else endpoint.access).level(method)


def route(method: bytes, path: str) -> AnyHandler | None:
    """The handler for a gateway endpoint; None for an OpenAI call to relay.
    Raises 501 for a method implemented nowhere (whatever the path), 404 for unknown paths
    and 405 (with Allow) for a known path's wrong method."""
    if method not in IMPLEMENTED:
        raise method_not_implemented(method.decode("latin-1"))
    endpoint = _endpoint(path)
    handlers: Mapping[bytes, AnyHandler | None]
    if endpoint is not None:
        handlers = endpoint.handlers
    elif path.startswith("/v1/"):
        handlers = _RELAYED
    else:
        raise not_found(f"no such endpoint: {path}")
    if method not in handlers:
        raise method_not_allowed(method.decode("latin-1"),
                                 tuple(m.decode() for m in handlers))
    return handlers[method]
