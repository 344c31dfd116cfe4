"""The Ollama API's paths (SPEC §12) in the route table, without loading the Ollama API: each
handler here imports :mod:`proxy.api.ollama` (and :mod:`protocol.ollama`) when the first
Ollama request comes, so a gateway no Ollama app talks to does not hold them (about 0.8 MB).

The endpoints that run a model (``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings``) are in :data:`TRANSLATED`: the exchange sends them through
:mod:`proxy.ollama` (routing, failover and timeouts as every ``/v1/*`` request), never
through a handler.
"""

from __future__ import annotations

from typing import Any

from proxy.api.call import Call, Handler

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

ROUTES: dict[str, dict[bytes, Handler]] = {
    "/api/tags": {b"GET": tags, b"HEAD": tags},
    "/api/ps": {b"GET": ps},
    "/api/show": {b"POST": show},
    "/api/version": {b"GET": version},
    "/api/chat": {b"POST": translated},
    "/api/generate": {b"POST": translated},
    "/api/embed": {b"POST": translated},
    "/api/embeddings": {b"POST": translated},
    "/api/pull": {b"POST": refuse},
    "/api/push": {b"POST": refuse},
    "/api/create": {b"POST": refuse},
    "/api/copy": {b"POST": refuse},
    "/api/delete": {b"DELETE": refuse},
}
PREFIXES: dict[str, dict[bytes, Handler]] = {"/api/blobs/": {b"HEAD": refuse, b"POST": refuse}}
