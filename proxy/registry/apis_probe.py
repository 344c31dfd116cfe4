"""A server's Messages and Responses APIs, probed (SPEC §17.1): ``POST /v1/messages {}`` and
``POST /v1/responses {}``, each answer judged by :func:`protocol.api_modes.verdict`.
Asked with a health check while a backend's ``apis: auto`` has not found both."""

from __future__ import annotations

import trio

from protocol.api_modes import API_NAMES, PROBES, ApiModes, Mode, verdict
from protocol.headers import Header
from protocol.upstream_url import UpstreamAddress
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, whole_exchange

__all__ = ["probe_apis"]

PROBE_CAP = 64 * 1024  # an answer to {} is small


async def probe_apis(connections: ConnectionPool, address: UpstreamAddress, modes: ApiModes,
                     *, api_key: str | None, deadline: float) -> dict[str, Mode]:
    """The verdicts of the APIs ``modes`` does not know yet (an API left out: no verdict,
    asked again at the next check), each probe bounded by ``deadline``."""
    headers: list[Header] = [(b"host", address.authority), (b"accept", b"application/json"),
                             (b"content-type", b"application/json"),
                             (b"content-length", b"2")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    found: dict[str, Mode] = {}
    for name in API_NAMES:
        if modes.of(name) is not None:
            continue
        with trio.move_on_at(deadline):
            try:
                head, body = await whole_exchange(connections, address, b"POST",
                                                  address.target(PROBES[name]), headers, b"{}",
                                                  cap=PROBE_CAP)
            except (UpstreamFailure, ValueError):
                continue
            mode = verdict(head.status_code, body)
            if mode is not None:
                found[name] = mode
    return found
