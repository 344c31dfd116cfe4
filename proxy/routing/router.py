"""The routing decision of each request, and the routing state that lives as long as the
gateway.

:meth:`Router.plan` is the one place that decides where a request goes (SPEC §7.1): a local
backend that lists the model, else a network node chosen by :func:`~proxy.routing.resolve.
resolve` (pure: this module snapshots the node index into views and reads the clock), else a
503. The :class:`Plan` it returns is the current try — the upstream and the
:class:`~proxy.routing.attempts.Attempt` that counts it — and, for a forward that may fail
over, the way to the next node (:meth:`Plan.alternate`).

:class:`Router` owns a circuit breaker and a set of counters per node, the counters of the
local backends, the round-robin and weighted cursors and the failover count; their JSON is
:func:`proxy.routing.stats.routing_stats`. It publishes each breaker transition to the hub
as a ``circuit`` event (SPEC §9.3, :meth:`Router.watch_circuits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from protocol.headers import FORWARDED, Header, header_value
from protocol.request_info import RequestInfo, total_timeout
from protocol.upstream_url import UpstreamAddress
from proxy.observe.hub import Hub
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import NodeEndpoint, NodeIndex
from proxy.routing.attempts import Attempt, Counters, Outcome
from proxy.routing.breaker import CircuitBreaker
from proxy.routing.resolve import Forward, NodeView, NoRoute, RouteRequest, holders, resolve
from proxy.routing.strategies import RoundRobinCursor, WeightedCursor

if TYPE_CHECKING:
    from protocol.config import CircuitBreakerConfig
    from proxy.settings.store import Settings


class Upstream(Protocol):
    """Where an attempt goes: a local backend or a node."""

    @property
    def address(self) -> UpstreamAddress | None: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def served_by(self) -> bytes: ...
    @property
    def forwarded_by(self) -> bytes | None: ...


class NodeUpstream:
    """A network node as an upstream: its key, and our fingerprint as the loop guard."""

    __slots__ = ("address", "api_key", "fingerprint", "forwarded_by", "served_by")

    def __init__(self, endpoint: NodeEndpoint, api_key: str | None, forwarded_by: bytes) -> None:
        self.fingerprint = endpoint.fingerprint
        self.address = endpoint.address
        self.api_key = api_key
        self.forwarded_by: bytes | None = forwarded_by
        self.served_by = b"node:" + endpoint.fingerprint.encode()

    def __repr__(self) -> str:  # never the key
        return f"NodeUpstream({self.fingerprint!r})"


class Plan:
    """Where one request goes. ``upstream`` and ``attempt`` are the current try."""

    __slots__ = ("_request", "_router", "attempt", "failed", "may_fail_over", "upstream")

    def __init__(self, upstream: Upstream, attempt: Attempt, *, router: Router | None = None,
                 request: RouteRequest | None = None, may_fail_over: bool = False) -> None:
        self.upstream = upstream
        self.attempt = attempt
        self.may_fail_over = may_fail_over
        self.failed: NodeUpstream | None = None  # the node failed over from
        self._router = router
        self._request = request

    def __repr__(self) -> str:
        return f"Plan({self.upstream!r}, {self.attempt!r}, may_fail_over={self.may_fail_over})"

    def alternate(self, now: float) -> bool:
        """After a connect error or a 5xx before anything reached the client: switch to the
        next eligible node (once per request). False when failover is off, already used,
        or no other node can take it; the current attempt is then left as it is."""
        router, request = self._router, self._request
        if not self.may_fail_over or router is None or request is None:
            return False
        self.may_fail_over = False
        target = self.attempt.target
        assert target is not None
        retry = RouteRequest(
            model=request.model, load_balancing=True, probe_ttl=request.probe_ttl,
            strategy=request.strategy, failover=False, prefer_loaded=request.prefer_loaded,
            tried=request.tried | {target.fingerprint})
        route = resolve(retry, router.views(), router.cursor, now, weighted=router.weighted)
        router.watch_circuits(now)
        if not isinstance(route, Forward):
            return False
        self.attempt.finish(Outcome.FAILURE, now)
        self.failed = self.upstream  # type: ignore[assignment]  # only nodes fail over
        self.upstream, self.attempt = router.start(route, now)
        router.failovers += 1
        return True


class Router:
    """The routing decision and its long-lived state (see the module docstring)."""

    def __init__(self, settings: Settings, backends: BackendRegistry, nodes: NodeIndex,
                 hub: Hub | None = None) -> None:
        self.settings = settings
        self.backends = backends
        self.nodes = nodes
        self.hub = hub
        self.backend_counters: dict[str, Counters] = {}  # each local backend's
        self.cursor = RoundRobinCursor()
        self.weighted = WeightedCursor()
        self.failovers = 0
        self.breakers: dict[str, CircuitBreaker] = {}
        self.counters: dict[str, Counters] = {}
        self._published: dict[str, int] = {}  # fingerprint -> breaker generation last published

    def __repr__(self) -> str:
        return (f"Router(local={self.local!r}, nodes={len(self.counters)}, "
                f"failovers={self.failovers})")

    async def plan(self, info: RequestInfo, headers: Sequence[Header]) -> Plan:
        """Where this request goes: a local backend that lists the model (asked first, and
        all a local hit costs), else a node that holds it, else 503 (raised). A request that
        came from another gateway (``x-sluice-forwarded`` in ``headers``) is never sent on.
        When no node could take it either, waits for the local backends' first checks, so a
        request right after start is not refused only because nobody has been asked yet.
        (A managed model on demand is loaded before this: ``Exchange.answer``.)"""
        backend = self.backends.holder_of(info.model)
        if backend is None:
            config = self.settings.config
            lb = config.load_balancing
            request = RouteRequest(
                model=info.model, load_balancing=lb.enabled,
                probe_ttl=total_timeout(config.timeouts, info)[0], strategy=lb.strategy,
                failover=lb.failover_enabled, prefer_loaded=lb.prefer_loaded,
                forwarded=header_value(headers, FORWARDED) is not None)
            views = self.views()
            fresh: list[NodeView] | None = views
            if not holders(request, views):
                backend = await self.backends.wait_for_holder(info.model)
                fresh = None  # taken before a wait: looked at again
            if backend is None:
                return await self._forward(request, fresh)
        return Plan(backend, Attempt(self._backend_counters(backend.name),
                                     trio.current_time()))

    async def _forward(self, request: RouteRequest, views: list[NodeView] | None) -> Plan:
        if request.load_balancing and not request.forwarded and await self.nodes.first_round(
                self.settings.config.timeouts.health_check.timeout):
            views = None  # right after start (or LB switched on): after the first checks
        now = trio.current_time()
        route = resolve(request, self.views() if views is None else views, self.cursor, now,
                        weighted=self.weighted)
        self.watch_circuits(now)
        if isinstance(route, NoRoute):
            raise route.error()
        upstream, attempt = self.start(route, now)
        return Plan(upstream, attempt, router=self, request=request,
                    may_fail_over=route.may_fail_over)

    def start(self, route: Forward, now: float) -> tuple[NodeUpstream, Attempt]:
        """Take the route's first target: the upstream and its attempt (now in flight)."""
        target = route.choose(now)
        endpoint = self.nodes.endpoint(target.fingerprint)
        assert endpoint is not None
        key = self.settings.secrets.node_keys.get(target.fingerprint)
        upstream = NodeUpstream(endpoint, key, self.settings.node_id.encode())
        attempt = Attempt(self._node_counters(target.fingerprint), now, target, endpoint.speed,
                          reported=self.watch_circuits)
        return upstream, attempt

    def views(self) -> list[NodeView]:
        """The indexed nodes as routing sees them now. The live config decides who is in: a
        node disabled or removed a moment ago is out even before the health-check task has
        caught up with the change."""
        config = self.settings.config
        cb = config.circuit_breaker
        live = {n.fingerprint: n for n in config.nodes if n.enabled}
        views = []
        for endpoint in self.nodes.endpoints:
            fp = endpoint.fingerprint
            cfg = live.get(fp)
            if cfg is None or cfg.base_url != endpoint.cfg.base_url:
                continue
            counters = self.counters.get(fp)
            views.append(NodeView(
                fingerprint=fp, priority=cfg.priority, models=endpoint.model_ids,
                loaded=endpoint.loaded_ids,
                breaker=self._breaker(fp, cb), enabled=True, online=endpoint.online,
                in_flight=counters.active if counters is not None else 0,
                latency_ms=endpoint.speed.value, weight=cfg.weight))
        return views

    def forget_removed(self, known: set[str]) -> None:
        """Drop the breakers, counters and weighted values of nodes no longer configured."""
        for table in (self.breakers, self.counters, self._published):
            for fp in [fp for fp in table if fp not in known]:
                del table[fp]
        self.weighted.forget(known)

    def watch_circuits(self, now: float) -> None:
        """:meth:`look_at_circuits`, after every routing decision and every outcome a
        breaker hears; with nobody reading circuit events it does nothing (the once-a-second
        look catches up)."""
        if self.hub is not None and self.hub.wants("circuit"):
            self.look_at_circuits(now)

    def look_at_circuits(self, now: float) -> None:
        """Each breaker's state at ``now`` (the time-driven moves, open to half_open or an
        expired probe, applied); a ``circuit`` event ``{fingerprint, state,
        consecutiveFailures}`` for each one that moved since the last look. Also run each
        second by :func:`proxy.observe.state_events.run_stats_feed`, so a half-open move is seen
        within a second, and a subscriber hears only of moves made after it came. Several
        moves between two looks are one event with the state reached."""
        hub = self.hub if self.hub is not None and self.hub.wants("circuit") else None
        published = self._published
        for fp, breaker in self.breakers.items():
            state = breaker.state(now)
            if published.get(fp, 0) != breaker.generation:
                published[fp] = breaker.generation
                if hub is not None:
                    hub.publish("circuit", {"fingerprint": fp, "state": state.value,
                                            "consecutiveFailures": breaker.consecutive_failures})

    def _breaker(self, fingerprint: str, config: CircuitBreakerConfig) -> CircuitBreaker:
        breaker = self.breakers.get(fingerprint)
        if breaker is None:
            breaker = self.breakers[fingerprint] = CircuitBreaker.from_config(config)
        else:  # follow live settings changes without forgetting the state
            breaker.failure_threshold = config.failure_threshold
            breaker.reset_timeout = config.reset_timeout
        return breaker

    @property
    def local(self) -> Counters:
        """All local backends' attempts together (the routing stats' ``local``)."""
        return Counters.added(self.backend_counters.values())

    def active_requests(self) -> dict[str, int]:
        """Attempts in flight now per upstream (``local:<backend>``, ``node:<fingerprint>``)
        of every upstream tried since start."""
        out = {f"local:{name}": c.active for name, c in self.backend_counters.items()}
        out.update((f"node:{fp}", c.active) for fp, c in self.counters.items())
        return out

    def _backend_counters(self, name: str) -> Counters:
        counters = self.backend_counters.get(name)
        if counters is None:
            counters = self.backend_counters[name] = Counters()
        return counters

    def _node_counters(self, fingerprint: str) -> Counters:
        counters = self.counters.get(fingerprint)
        if counters is None:
            counters = self.counters[fingerprint] = Counters()
        return counters
