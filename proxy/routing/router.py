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

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio

from protocol.affinity_choice import SPILL
from protocol.config import Strategy
from protocol.headers import FORWARDED, Header, header_value
from protocol.request_info import RequestInfo, total_timeout
from protocol.slots import has_free_slot, waiting
from proxy.observe.hub import Hub
from proxy.registry.backends import BackendRegistry, LocalBackend
from proxy.registry.nodes import NodeIndex
from proxy.routing.affinity import Affinity, Conversation
from proxy.routing.attempts import Attempt, Counters, Outcome
from proxy.routing.breaker import CircuitBreaker
from proxy.routing.cache_stats import count_tokens
from proxy.routing.resolve import Forward, NodeView, NoRoute, RouteRequest, holders, resolve
from proxy.routing.strategies import (
    Candidate,
    RoundRobinCursor,
    WeightedCursor,
    affinity_result,
    order_candidates,
)
from proxy.routing.upstreams import NodeUpstream, Upstream

CACHE_AWARE = Strategy.CACHE_AWARE.value

if TYPE_CHECKING:
    from protocol.config import CircuitBreakerConfig
    from proxy.settings.store import Settings


class Plan:
    """Where one request goes. ``upstream`` and ``attempt`` are the current try."""

    __slots__ = ("_request", "_router", "affinity", "attempt", "conversation", "failed",
                 "may_fail_over", "upstream")

    def __init__(self, upstream: Upstream, attempt: Attempt, *, router: Router | None = None,
                 request: RouteRequest | None = None, may_fail_over: bool = False,
                 affinity: str | None = None, conversation: Conversation | None = None) -> None:
        self.upstream = upstream
        self.attempt = attempt
        self.may_fail_over = may_fail_over
        self.failed: NodeUpstream | None = None  # the node failed over from
        self._router = router
        self._request = request
        self.affinity = affinity  # hit | miss | session | spill (SPEC §15), or None
        self.conversation = conversation  # cache-aware: what the index is told once answered

    @property
    def affinity_header(self) -> bytes | None:
        """``x-sluice-affinity``'s value, when there is one."""
        return None if self.affinity is None else self.affinity.encode()

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
        retry = attrs.evolve(request, failover=False,
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
        self.affinity = Affinity(settings.config.load_balancing.affinity)
        self._affinity_config = settings.config.load_balancing.affinity
        # The registries read our in-flight counts when a server reports its slots.
        backends.in_flight = self._backend_in_flight
        nodes.in_flight = self._node_in_flight
        backends.changes.subscribe(self.affinity.backends_changed)
        nodes.changes.subscribe(self.affinity.node_changed)
        if hub is not None:
            hub.subscribe(partial(count_tokens, self), ("request",))

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
        config = self.settings.config
        lb = config.load_balancing
        if backend is not None:
            if lb.strategy != CACHE_AWARE and not lb.spill_over:
                return self._local(backend)  # all a local hit costs
            return self._local_choice(info, headers, backend)
        request = self._route_request(info, headers)
        views = self.views()
        fresh: list[NodeView] | None = views
        if not holders(request, views):
            backend = await self.backends.wait_for_holder(info.model)
            fresh = None  # taken before a wait: looked at again
        if backend is not None:
            return self._local(backend)
        return await self._forward(request, fresh, info, headers)

    def _route_request(self, info: RequestInfo, headers: Sequence[Header]) -> RouteRequest:
        config = self.settings.config
        lb = config.load_balancing
        return RouteRequest(
            model=info.model, load_balancing=lb.enabled,
            probe_ttl=total_timeout(config.timeouts, info)[0], strategy=lb.strategy,
            failover=lb.failover_enabled, prefer_loaded=lb.prefer_loaded,
            forwarded=header_value(headers, FORWARDED) is not None,
            load_bound=lb.affinity.load_bound)

    def _local(self, backend: LocalBackend, affinity: str | None = None,
               conversation: Conversation | None = None) -> Plan:
        return Plan(backend, Attempt(self._backend_counters(backend.name), trio.current_time()),
                    affinity=affinity, conversation=conversation)

    def _local_choice(self, info: RequestInfo, headers: Sequence[Header],
                      first: LocalBackend) -> Plan:
        """A model local backends hold, under cache-aware or with spill-over on: spilled to
        a node with a free slot when every local server is full (SPEC §15), else the
        cache-aware pick among several local servers, else the one."""
        lb = self.settings.config.load_balancing
        local = self.backends.holders_of(info.model) or [first]
        if lb.spill_over and self._local_full(local):
            plan = self._spill(info, headers)
            if plan is not None:
                return plan
        if len(local) < 2 or lb.strategy != CACHE_AWARE:
            return self._local(first)
        conversation = self._conversation(info, headers)
        names = [b.served_by.decode() for b in local]
        session = (None if conversation is None
                   else self.affinity.look(conversation, names))
        matches = {} if conversation is None else conversation.matches
        contenders = []
        for i, (backend, name) in enumerate(zip(local, names, strict=True)):
            busy = self._backend_in_flight(backend.name)
            contenders.append(Candidate(name, len(local) - i, busy,
                                        waiting=waiting(busy, backend.slots),
                                        match=matches.get(name, 0), session=name == session))
        ordered = order_candidates(CACHE_AWARE, contenders, self.cursor,
                                   load_bound=lb.affinity.load_bound)
        chosen = local[names.index(ordered[0].fingerprint)]
        return self._local(chosen, affinity_result(ordered[0], contenders), conversation)

    def _local_full(self, local: Sequence[LocalBackend]) -> bool:
        """Every local server holding the model says it has no free slot."""
        return all(has_free_slot(self._backend_in_flight(b.name), b.slots) is False
                   for b in local)

    def _spill(self, info: RequestInfo, headers: Sequence[Header]) -> Plan | None:
        """SPEC §15 spill-over: a node holding the model with a free slot, if any (chosen as
        the strategy would among those); None to stay local."""
        request = self._route_request(info, headers)
        views = [v for v in holders(request, self.views())
                 if has_free_slot(v.in_flight, v.slots.get(info.model))]
        if not views:
            return None
        now = trio.current_time()
        route = resolve(request, views, self.cursor, now, weighted=self.weighted)
        self.watch_circuits(now)
        if isinstance(route, NoRoute):
            return None
        upstream, attempt = self.start(route, now)
        return Plan(upstream, attempt, router=self, request=request,
                    may_fail_over=route.may_fail_over, affinity=SPILL)

    def _conversation(self, info: RequestInfo, headers: Sequence[Header]
                      ) -> Conversation | None:
        config = self.settings.config.load_balancing.affinity
        if config is not self._affinity_config:
            self._affinity_config = config
            self.affinity.follow(config)
        return self.affinity.conversation(info, headers)

    async def _forward(self, request: RouteRequest, views: list[NodeView] | None,
                       info: RequestInfo, headers: Sequence[Header]) -> Plan:
        if request.load_balancing and not request.forwarded and await self.nodes.first_round(
                self.settings.config.timeouts.health_check.timeout):
            views = None  # right after start (or LB switched on): after the first checks
        if views is None:
            views = self.views()
        conversation = None
        if request.strategy == CACHE_AWARE:
            eligible = holders(request, views)
            if len(eligible) > 1:
                conversation = self._conversation(info, headers)
            if conversation is not None:
                names = {f"node:{v.fingerprint}": v.fingerprint for v in eligible}
                session = self.affinity.look(conversation, names)
                request = attrs.evolve(
                    request, matches={names[n]: m for n, m in conversation.matches.items()},
                    session=None if session is None else names[session])
        now = trio.current_time()
        route = resolve(request, views, self.cursor, now, weighted=self.weighted)
        self.watch_circuits(now)
        if isinstance(route, NoRoute):
            raise route.error()
        upstream, attempt = self.start(route, now)
        return Plan(upstream, attempt, router=self, request=request,
                    may_fail_over=route.may_fail_over, affinity=route.affinity,
                    conversation=conversation)

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
                latency_ms=endpoint.speed.value, weight=cfg.weight, slots=endpoint.slots))
        return views

    def forget_removed(self, known: set[str]) -> None:
        """Drop the breakers, counters, weighted values and index entries of nodes no longer
        configured."""
        for fp in [fp for fp in self.counters if fp not in known]:
            self.affinity.forget(f"node:{fp}")
        for table in (self.breakers, self.counters, self._published):
            for fp in [fp for fp in table if fp not in known]:
                del table[fp]
        self.weighted.forget(known)

    # -- what the servers hold and report (SPEC §15) ----------------------------------------

    def served(self, plan: Plan, cached: Callable[[], int | None]) -> None:
        """A plan's upstream answered (SPEC §15): the index learns it."""
        if plan.conversation is not None:
            self.affinity.served(plan.conversation, plan.upstream.served_by.decode(), cached)

    def _backend_in_flight(self, name: str) -> int:
        counters = self.backend_counters.get(name)
        return 0 if counters is None else counters.active

    def _node_in_flight(self, fingerprint: str) -> int:
        counters = self.counters.get(fingerprint)
        return 0 if counters is None else counters.active

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
