"""The Ollama API's paths (SPEC §12) in the route table, without loading the Ollama API: each
handler here imports :mod:`proxy.api.ollama` (and :mod:`protocol.ollama`) when the first
Ollama request comes, so a gateway no Ollama app talks to does not hold them (about 0.8 MB).

Every Ollama path is the model API's: an access key where one is needed, whatever the
method (:data:`protocol.access.KEY_HOLDERS`).

The endpoints that run a model (``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings``) are in :data:`TRANSLATED`: the exchange sends them through
:mod:`proxy.ollama` (routing, failover and timeouts as every ``/v1/*`` request), never
through a handler.
"""

from __future__ import annotations

from typing import Any

from protocol.access import KEY_HOLDERS
from proxy.api.call import Call, Endpoint

__all__ = ["PREFIXES", "ROUTES", "TRANSLATED"]


def tags(call: Call) -> tuple[int, Any]:
    from proxy.api import ollama

    return ollama.tags(call)


def ps(call: Call) -> tuple[int, Any]:
    from proxy.api import ollama

    return ollama.ps(call)


def show(call: Call) -> tuple[int, Any]:
    from proxy.api import ollama

    return ollama.show(call)


def version(call: Call) -> tuple[int, Any]:
    from proxy.api import ollama

    return ollama.version(call)


def refuse(call: Call) -> tuple[int, Any]:
    """``/api/pull``, ``/api/push``, ``/api/create``, ``/api/copy``, ``/api/delete``,
    ``/api/blobs/...``: sluice does not manage model files that way."""
    from proxy.api import ollama

    return ollama.refuse(call)


def translated(call: Call) -> tuple[int, Any]:  # pragma: no cover (never called)
    """A marker: the exchange relays these paths itself (:mod:`proxy.ollama`)."""
    raise AssertionError(f"{call.path} is relayed by the exchange, not answered here")


TRANSLATED = frozenset({translated})


ROUTES: dict[str, Endpoint] = {
    "/api/tags": Endpoint(KEY_HOLDERS, {b"GET": tags, b"HEAD": tags}),
    "/api/ps": Endpoint(KEY_HOLDERS, {b"GET": ps}),
    "/api/show": Endpoint(KEY_HOLDERS, {b"POST": show}),
    "/api/version": Endpoint(KEY_HOLDERS, {b"GET": version}),
    "/api/chat": Endpoint(KEY_HOLDERS, {b"POST": translated}),
    "/api/generate": Endpoint(KEY_HOLDERS, {b"POST": translated}),
    "/api/embed": Endpoint(KEY_HOLDERS, {b"POST": translated}),
    "/api/embeddings": Endpoint(KEY_HOLDERS, {b"POST": translated}),
    "/api/pull": Endpoint(KEY_HOLDERS, {b"POST": refuse}),
    "/api/push": Endpoint(KEY_HOLDERS, {b"POST": refuse}),
    "/api/create": Endpoint(KEY_HOLDERS, {b"POST": refuse}),
    "/api/copy": Endpoint(KEY_HOLDERS, {b"POST": refuse}),
    "/api/delete": Endpoint(KEY_HOLDERS, {b"DELETE": refuse}),
}
PREFIXES: dict[str, Endpoint] = {
    "/api/blobs/": Endpoint(KEY_HOLDERS, {b"HEAD": refuse, b"POST": refuse}),
}
