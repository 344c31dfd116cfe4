"""Which headers cross the gateway, in each direction (RFC 9110 §7.6.1, SPEC §6.1).

Header names arrive lowercased from h11; every function here takes and returns
``(name, value)`` byte pairs and never touches a socket.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Header = tuple[bytes, bytes]

# Hop-by-hop headers: they describe one connection and never cross the gateway.
HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

SERVED_BY = b"x-sluice-served-by"
REQUEST_ID = b"x-sluice-request-id"  # ours on every answer (an upstream gateway's is replaced)
FORWARDED = b"x-sluice-forwarded"  # set on a request one gateway forwards to another
AFFINITY = b"x-sluice-affinity"  # why cache-aware routing chose the upstream (SPEC §15)
SESSION = b"x-sluice-session"  # a client's conversation key (SPEC §15)
QUEUE_MS = b"x-sluice-queue-ms"  # the time a request waited in our queue (SPEC §18)
PRIORITY = b"x-sluice-priority"  # a request's class: "batch" lowers it (SPEC §18)

# Request headers the gateway sets itself, or credentials for the gateway (Anthropic's
# clients send their key as x-api-key), so the client's copies are dropped.
_REPLACED_UPSTREAM = frozenset(
    {b"host", b"authorization", b"x-api-key", b"content-length", b"expect", FORWARDED})
# Response headers the gateway sets itself.
_REPLACED_DOWNSTREAM = frozenset({b"content-length", SERVED_BY, REQUEST_ID, AFFINITY,
                                  QUEUE_MS})


def connection_tokens(headers: Iterable[Header]) -> frozenset[bytes]:
    """Header names listed in ``Connection:`` (they are hop-by-hop too)."""
    names: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            for token in value.split(b","):
                token = token.strip().lower()
                if token:
                    names.add(token)
    return frozenset(names)


def _is_hop_by_hop(name: bytes, listed: frozenset[bytes]) -> bool:
    return name in HOP_BY_HOP or name.startswith(b"proxy-") or name in listed


def upstream_request_headers(
    headers: Sequence[Header],
    *,
    authority: bytes,
    body_length: int,
    api_key: str | None = None,
    forwarded_by: bytes | None = None,
) -> list[Header]:
    """The headers sent upstream: hop-by-hop and client auth removed, ``Host`` replaced;
    ``api_key`` becomes the Authorization, ``forwarded_by`` (our fingerprint, when the
    upstream is another gateway) the loop guard."""
    listed = connection_tokens(headers)
    out: list[Header] = [(b"host", authority)]
    for name, value in headers:
        if name in _REPLACED_UPSTREAM or _is_hop_by_hop(name, listed):
            continue
        out.append((name, value))
    out.append((b"content-length", str(body_length).encode()))
    if api_key:
        out.append((b"authorization", b"Bearer " + api_key.encode()))
    if forwarded_by:
        out.append((FORWARDED, forwarded_by))
    return out


def downstream_response_headers(headers: Sequence[Header], *, served_by: bytes,
                                affinity: bytes | None = None) -> list[Header]:
    """The headers relayed to the client. The body's framing (Content-Length or chunked) is
    the gateway's own, so the upstream's Content-Length is dropped too; an upstream
    gateway's served-by and affinity are replaced by ours."""
    listed = connection_tokens(headers)
    out: list[Header] = []
    for name, value in headers:
        if name in _REPLACED_DOWNSTREAM or _is_hop_by_hop(name, listed):
            continue
        out.append((name, value))
    out.append((SERVED_BY, served_by))
    if affinity is not None:
        out.append((AFFINITY, affinity))
    return out


def header_value(headers: Iterable[Header], name: bytes) -> bytes | None:
    """The first value of ``name`` (lowercase), or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


def is_event_stream(headers: Iterable[Header]) -> bool:
    value = header_value(headers, b"content-type")
    return value is not None and value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
