"""The node health poll (SPEC §7.2): one task checks every enabled node each
``timeouts.health_check.interval`` with ``GET /v1/models`` (the node's key as Bearer,
``timeout`` per check, all nodes at once) and reports each result to the
:class:`~proxy.registry.nodes.NodeIndex`. A node answering 503 (a llama.cpp or sluice server still
loading) is ``warming`` and is probed again every second until it answers 200. Entries a node
itself marks ``owned_by: "remote"`` are not indexed (no multi-hop). The slots a node reports
per model (``"sluice": {"slots": ...}``, SPEC §15) come with the same answer and are read by
:meth:`~proxy.registry.nodes.NodeIndex.checked`. With load balancing off
nothing is sent to any node and the index is empty; switching it on wakes the poll at once.
Health checks never touch circuit breakers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from protocol.config import Config
from protocol.lan.pinning import NODE_IDENTITY_CHANGED, health_node_port
from protocol.upstream_url import parse_upstream_url
from proxy.link.tls import PinMismatch
from proxy.registry.nodes import OFFLINE, ONLINE, WARMING, NodeEndpoint, NodeIndex
from proxy.registry.probe import ModelProbe, probe_models
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, fetch

WARMING_RETRY = 1.0  # seconds between probes of a warming node

# What a refused health check usually means, said where the user will look for it.
_HINTS = {
    401: " (the node wants a key: give it one with `sluice nodes add --api-key-file`, or "
         "PATCH /api/v1/nodes/{fingerprint} with apiKey)",
    403: " (a wrong key, or the node refuses this Host: on the node, list its address in "
         "api.allowed_hosts)",
}


async def _learn_node_port(connections: ConnectionPool, endpoint: NodeEndpoint,
                           timeout: float) -> str | None:
    """A pinned node (SPEC §16) whose node port is not known yet: ask its ``GET /health``
    at ``base_url`` (plain, no key: the answer holds no secret; a wrong port only fails the
    pin). None when it was learnt, else why not."""
    assert endpoint.plain is not None
    with trio.move_on_after(timeout):
        try:
            status, body = await fetch(connections, endpoint.plain, b"/health")
        except (UpstreamFailure, ValueError) as exc:
            return f"cannot ask for its node port: {exc}"
        port = health_node_port(body) if status == 200 else None
        if port is None:
            return ("it names no node port in GET /health (external access off, or a "
                    "sluice without pinned links); pair with it again once it has one")
        endpoint.link(port)
        return None
    return f"GET /health did not answer within {timeout:g}s"


async def check_node(index: NodeIndex, endpoint: NodeEndpoint, connections: ConnectionPool,
                     api_key: str | None, timeout: float) -> None:
    """Fetch the node's ``/v1/models`` within ``timeout``; record status, latency, models.
    A pinned node is asked over its TLS link (its node port learnt first); a certificate
    that is not the pinned one makes it offline with ``node_identity_changed``."""
    address = endpoint.address
    if endpoint.plain is None:
        try:
            parse_upstream_url(endpoint.cfg.base_url)
        except ValueError as exc:
            probe = ModelProbe(None, [], str(exc), None)
    elif address is None:  # pinned, its node port not known yet
        why = await _learn_node_port(connections, endpoint, timeout)
        address = endpoint.address
        if why is not None:
            probe = ModelProbe(None, [], why, None)
    if address is not None:
        probe = await probe_models(connections, address, api_key=api_key, timeout=timeout)
        if endpoint.cfg.pin is not None and probe.failure is not None and \
                not isinstance(probe.failure, PinMismatch):
            endpoint.link(None)  # no TLS link: ask its node port again at the next check
    error = probe.error
    endpoint.presented = probe.failure.got if isinstance(probe.failure, PinMismatch) else None
    models: list[dict[str, Any]] = []
    if endpoint.presented is not None:
        status, error = OFFLINE, NODE_IDENTITY_CHANGED
    elif probe.status == 503:
        status, error = WARMING, "GET /v1/models answered 503 (loading)"
    elif error is not None:
        status = OFFLINE
        error += _HINTS.get(probe.status or 0, "")
    else:
        status = ONLINE  # a node's own remote entries are not indexed (no multi-hop)
        models = [m for m in probe.models if m.get("owned_by") != "remote"]
    index.checked(endpoint, status, models, error, probe.latency_ms)


class _NodeSecrets(Protocol):
    @property
    def node_keys(self) -> Mapping[str, str]: ...


class NodeSettings(Protocol):
    """What the poll reads from :class:`proxy.settings.store.Settings`."""

    @property
    def config(self) -> Config: ...

    @property
    def secrets(self) -> _NodeSecrets: ...

    def subscribe(self, callback: Callable[[Config], None]) -> Callable[[], None]: ...


async def run_node_checks(index: NodeIndex, connections: ConnectionPool,
                          settings: NodeSettings) -> None:
    """Poll the enabled nodes each interval while load balancing is on; warming nodes every
    second in between. A settings change starts a round at once."""
    unsubscribe = settings.subscribe(lambda _cfg: index.wake())
    try:
        next_round = trio.current_time()
        while True:
            config = settings.config
            if not config.load_balancing.enabled:
                index.pause()
                await index.sleep(float("inf"))
                next_round = trio.current_time()
                continue
            index.sync(config.nodes)
            hc = config.timeouts.health_check
            now = trio.current_time()
            full = now >= next_round
            if full:
                next_round = now + hc.interval
            targets = [e for e in index.endpoints if full or e.status == WARMING]
            keys = settings.secrets.node_keys
            async with trio.open_nursery() as nursery:
                for endpoint in targets:
                    nursery.start_soon(check_node, index, endpoint, connections,
                                       keys.get(endpoint.fingerprint), hc.timeout)
            if full:
                index.round_done()
            delay = next_round - trio.current_time()
            if any(e.status == WARMING for e in index.endpoints):
                delay = min(delay, WARMING_RETRY)
            if await index.sleep(max(delay, 0.0)):
                next_round = trio.current_time()
    finally:
        unsubscribe()
