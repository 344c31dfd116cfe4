"""Network nodes (``nodes:``): the health poll and the distributed model index (SPEC §7.2).

One task checks every enabled node each ``timeouts.health_check.interval`` with
``GET /v1/models`` (the node's key as Bearer, ``timeout`` per check, all nodes at once). A
node answering 503 (a llama.cpp or sluice server still loading) is ``warming`` and is probed
again every second until it answers 200. Entries a node itself marks ``owned_by: "remote"``
are not indexed (no multi-hop). With load balancing off nothing is sent to any node and the
index is empty; switching it on wakes the poll at once. Health checks never touch circuit
breakers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import trio

from protocol.config import Config, NodeConfig
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from proxy.pool.probe import ModelProbe, probe_models
from proxy.routing.strategies import LatencyAverage
from proxy.upstream import UpstreamPool

log = logging.getLogger("sluice.nodes")

WARMING_RETRY = 1.0  # seconds between probes of a warming node
ONLINE, OFFLINE, WARMING, UNKNOWN, PAUSED = "online", "offline", "warming", "unknown", "paused"


class NodeEndpoint:
    """One enabled node and what its last health check found."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        try:
            self.address: UpstreamAddress | None = parse_upstream_url(cfg.base_url)
        except ValueError:
            self.address = None  # never online: its checks fail with the reason
        self.status = UNKNOWN  # not checked yet
        self.models: list[dict[str, Any]] = []
        self.model_ids: frozenset[str] = frozenset()
        self.latency_ms: float | None = None  # the last health check's round trip
        # For ``fastest``: health-check round trips and request times to first byte.
        self.speed = LatencyAverage()
        self.last_error: str | None = None

    def __repr__(self) -> str:  # never shows the key
        return (f"NodeEndpoint({self.cfg.fingerprint!r}, {self.cfg.base_url}, "
                f"{self.status}, models={[m['id'] for m in self.models]})")

    @property
    def fingerprint(self) -> str:
        return self.cfg.fingerprint


class NodeIndex:
    """The enabled nodes in priority order (top first) and the models each one serves."""

    def __init__(self) -> None:
        self.endpoints: list[NodeEndpoint] = []
        self._wake = trio.Event()
        self._first_round = trio.Event()  # set once every node was checked with LB on

    def __repr__(self) -> str:
        return f"NodeIndex({self.endpoints!r})"

    def wake(self) -> None:
        """Start a round at once (a settings change: load balancing on, a node added)."""
        self._wake.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until woken; True when woken."""
        with trio.move_on_after(seconds):
            await self._wake.wait()
        woken = self._wake.is_set()
        if woken:
            self._wake = trio.Event()
        return woken

    def sync(self, nodes: Iterable[NodeConfig]) -> None:
        """Follow the configured nodes: only enabled ones, in priority order; a node whose
        URL changed starts over as unchecked."""
        old = {e.fingerprint: e for e in self.endpoints}
        out = []
        for cfg in sorted((n for n in nodes if n.enabled), key=lambda n: -n.priority):
            endpoint = old.get(cfg.fingerprint)
            if endpoint is None or endpoint.cfg.base_url != cfg.base_url:
                endpoint = NodeEndpoint(cfg)
            endpoint.cfg = cfg
            out.append(endpoint)
        self.endpoints = out

    def pause(self) -> None:
        """Load balancing is off: forget what the nodes serve."""
        for endpoint in self.endpoints:
            endpoint.status, endpoint.models, endpoint.latency_ms = UNKNOWN, [], None
            endpoint.model_ids, endpoint.speed = frozenset(), LatencyAverage()
        if self._first_round.is_set():
            self._first_round = trio.Event()

    def round_done(self) -> None:
        self._first_round.set()

    async def first_round(self, timeout: float) -> None:
        """Right after start (or after load balancing is switched on), wait up to
        ``timeout`` for the first health checks, so a request is not refused only because
        the nodes have not been asked yet."""
        if not self._first_round.is_set():
            with trio.move_on_after(timeout):
                await self._first_round.wait()

    def endpoint(self, fingerprint: str) -> NodeEndpoint | None:
        for endpoint in self.endpoints:
            if endpoint.fingerprint == fingerprint:
                return endpoint
        return None

    def online(self) -> list[NodeEndpoint]:
        return [e for e in self.endpoints if e.status == ONLINE]

    def remote_models(self) -> list[dict[str, Any]]:
        """Every online node's models, top node first; an id listed once."""
        seen: set[str] = set()
        out = []
        for endpoint in self.online():
            for entry in endpoint.models:
                if entry["id"] not in seen:
                    seen.add(entry["id"])
                    out.append(entry)
        return out

    def holders(self) -> dict[str, list[str]]:
        """model id -> fingerprints of the online nodes serving it, top node first."""
        out: dict[str, list[str]] = {}
        for endpoint in self.online():
            for entry in endpoint.models:
                fps = out.setdefault(entry["id"], [])
                if endpoint.fingerprint not in fps:
                    fps.append(endpoint.fingerprint)
        return out

    def summary(self, config: Config) -> dict[str, Any]:
        """The ``distributed`` block of ``/api/v1/inference/status``."""
        lb = config.load_balancing
        return {"enabled": lb.enabled, "strategy": lb.strategy,
                "totalNodes": len(self._configured(config)),
                "onlineNodes": len(self.online()) if lb.enabled else 0,
                "remoteModels": len(self.holders()) if lb.enabled else 0}

    def pool_status(self, config: Config) -> dict[str, Any]:
        """``GET /api/v1/pool/distributed-status``: the summary, the models and each
        enabled node in priority order (``paused`` while load balancing is off)."""
        enabled = config.load_balancing.enabled
        by_fp = {e.fingerprint: e for e in self.endpoints}
        endpoints = []
        for cfg in self._configured(config):
            endpoint = by_fp.get(cfg.fingerprint)
            status = UNKNOWN if endpoint is None else endpoint.status
            online = enabled and status == ONLINE and endpoint is not None
            latency = endpoint.latency_ms if online and endpoint is not None else None
            endpoints.append({
                "fingerprint": cfg.fingerprint, "baseUrl": cfg.base_url,
                "status": status if enabled else PAUSED,
                "latencyMs": None if latency is None else round(latency),
                "loadedModelCount": len(endpoint.models) if online and endpoint else 0,
                "priority": cfg.priority,
                # Beyond SPEC: why the last check failed (never a key: status and address).
                "lastError": endpoint.last_error if enabled and endpoint else None})
        summary = self.summary(config)
        del summary["remoteModels"]
        models = self.holders().items() if enabled else ()
        return {**summary, "models": [{"id": m, "availableOn": fps} for m, fps in models],
                "endpoints": endpoints}

    @staticmethod
    def _configured(config: Config) -> list[NodeConfig]:
        return sorted((n for n in config.nodes if n.enabled), key=lambda n: -n.priority)


# What a refused health check usually means, said where the user will look for it.
_HINTS = {
    401: " (the node wants a key: give it one with `sluice nodes add --api-key-file`, or "
         "PATCH /api/v1/nodes/{fingerprint} with apiKey)",
    403: " (a wrong key, or the node refuses this Host: on the node, list its address in "
         "api.allowed_hosts)",
}


async def check_node(endpoint: NodeEndpoint, pool: UpstreamPool, api_key: str | None,
                     timeout: float) -> None:
    """Fetch the node's ``/v1/models`` within ``timeout``; record status, latency, models."""
    try:
        address = parse_upstream_url(endpoint.cfg.base_url)
    except ValueError as exc:
        probe = ModelProbe(None, [], str(exc), None)
    else:
        probe = await probe_models(pool, address, api_key=api_key, timeout=timeout)
    error = probe.error
    models: list[dict[str, Any]] = []
    if probe.status == 503:
        status, error = WARMING, "GET /v1/models answered 503 (loading)"
    elif error is not None:
        status = OFFLINE
        error += _HINTS.get(probe.status or 0, "")
    else:
        status = ONLINE  # a node's own remote entries are not indexed (no multi-hop)
        models = [m for m in probe.models if m.get("owned_by") != "remote"]
    was = endpoint.status
    endpoint.status, endpoint.models, endpoint.last_error = status, models, error
    endpoint.model_ids = frozenset(m["id"] for m in models)
    endpoint.latency_ms = probe.latency_ms if status == ONLINE else None
    if endpoint.latency_ms is not None:
        endpoint.speed.add(endpoint.latency_ms)
    if status != was:
        log.info("node %s is %s%s", endpoint.fingerprint, status,
                 f": {error}" if error else "")


class _NodeSecrets(Protocol):
    @property
    def node_keys(self) -> Mapping[str, str]: ...


class NodeSettings(Protocol):
    """What the poll reads from :class:`proxy.settings.Settings`."""

    @property
    def config(self) -> Config: ...

    @property
    def secrets(self) -> _NodeSecrets: ...

    def subscribe(self, callback: Callable[[Config], None]) -> Callable[[], None]: ...


async def run_node_checks(index: NodeIndex, pool: UpstreamPool, settings: NodeSettings) -> None:
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
                    nursery.start_soon(check_node, endpoint, pool,
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
