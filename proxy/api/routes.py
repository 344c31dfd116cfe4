"""The gateway's own endpoints: a table of path → method → handler, each a small function.

Every ``/v1/*`` path not in the table is an OpenAI call relayed to a model server, so its
only method is POST.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.errors import SluiceError, method_not_allowed, not_found

if TYPE_CHECKING:
    from proxy.context import GatewayContext

Handler = Callable[["GatewayContext", str], tuple[int, Any]]


def health(ctx: GatewayContext, path: str) -> tuple[int, Any]:
    return 200, {"status": "ok"}


def list_models(ctx: GatewayContext, path: str) -> tuple[int, Any]:
    return 200, {"object": "list", "data": ctx.backends.model_entries()}


def get_model(ctx: GatewayContext, path: str) -> tuple[int, Any]:
    model_id = path[len("/v1/models/"):]
    for entry in ctx.backends.model_entries():
        if entry["id"] == model_id:
            return 200, entry
    raise SluiceError(404, f"model {model_id!r} does not exist", type="invalid_request_error",
                      code="model_not_found", param="model")


def inference_status(ctx: GatewayContext, path: str) -> tuple[int, Any]:
    """SPEC §8: what is loaded and where the gateway listens, plus each local backend and
    managed model server (state, pid, address, restarts)."""
    kinds: dict[str, list[str]] = {"llm": [], "diffusion": [], "embedding": []}
    loaded: list[str] = []
    backends = []
    for backend in ctx.backends.backends:
        live = backend.online and backend.address is not None
        ids = [m["id"] for m in backend.models] if live else []
        for model_id in ids:
            if model_id not in loaded:
                loaded.append(model_id)
                kinds.setdefault(backend.kind, []).append(model_id)
        backends.append({"name": backend.name, "kind": backend.kind, "online": live,
                         "models": ids, "lastError": backend.last_error})
    body: dict[str, Any] = {
        "available": bool(loaded),
        "routerRunning": True,
        "routerPort": ctx.tcp_port,
        "loadedModels": loaded,
        "llmModels": kinds["llm"],
        "diffusionModels": kinds["diffusion"],
    }
    if ctx.socket_path is not None:
        body["socketPath"] = ctx.socket_path
    else:
        body["localTcp"] = f"127.0.0.1:{ctx.local_tcp_port}"
    body["backends"] = backends
    body["managedModels"] = ctx.supervisor.status() if ctx.supervisor else []
    return 200, body


ROUTES: dict[str, dict[bytes, Handler]] = {
    "/health": {b"GET": health},
    "/v1/models": {b"GET": list_models},
    "/api/v1/inference/models": {b"GET": list_models},
    "/api/v1/inference/status": {b"GET": inference_status},
}

NEEDS_MODELS: frozenset[Handler] = frozenset({list_models, get_model})

_RELAYED: dict[bytes, Handler | None] = {b"POST": None}


def route(method: bytes, path: str) -> Handler | None:
    """The handler for a gateway endpoint; None for an OpenAI call to relay.
    Raises 404 for unknown paths and 405 (with Allow) for a known path's wrong method."""
    methods: dict[bytes, Handler | None] | None = ROUTES.get(path)  # type: ignore[assignment]
    if methods is None:
        if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
            methods = {b"GET": get_model}
        elif path.startswith("/v1/"):
            methods = _RELAYED
        else:
            raise not_found(f"no such endpoint: {path}")
    if method not in methods:
        raise method_not_allowed(method.decode("latin-1"),
                                 tuple(m.decode() for m in methods))
    return methods[method]

