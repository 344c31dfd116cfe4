"""The routing decision of each request, and the routing state that lives as long as the
gateway.

:meth:`Router.place` is the one place that decides where a request goes (SPEC §7.1, §15,
§18): it snapshots the local backends that list the model and, when they take part, the
nodes (breaker permits taken by :func:`~proxy.routing.resolve.permits`) into candidates and
asks the one pure choice, :func:`protocol.routing_choice.choose`; nobody → 503.
:meth:`Router.plan` is the same without the queue, after :meth:`Router.ready_for`'s waits
right after start; the scheduler (:mod:`proxy.routing.scheduler`) calls :meth:`place` with
``queue=True`` whenever a slot may have freed. The :class:`Plan` it returns is the current
try — the upstream and the :class:`~proxy.routing.attempts.Attempt` that counts it — and,
for a forward that may fail over, the way to the next node (:meth:`Plan.alternate`).

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

from protocol.config import Strategy
from protocol.headers import FORWARDED, Header, header_value
from protocol.request_info import RequestInfo, total_timeout
from protocol.routing_choice import Choice, Rules, choose, needs_nodes
from protocol.slots import Slots, capacity, free_slots, waiting
from protocol.strategies import Candidate, RoundRobinCursor, WeightedCursor
from proxy.observe.hub import Hub
from proxy.publish import Subscribers
from proxy.registry.backends import BackendRegistry, LocalBackend
from proxy.registry.nodes import NodeEndpoint, NodeIndex
from proxy.routing.affinity import Affinity, Conversation
from proxy.routing.attempts import Attempt, Counters
from proxy.routing.breaker import CircuitBreaker
from proxy.routing.cache_stats import count_tokens
from proxy.routing.plan import Plan
from proxy.routing.resolve import (
    Forward,
    NodeView,
    NoRoute,
    RouteRequest,
    Target,
    forward,
    holders,
    permits,
)
from proxy.routing.slot_reports import SlotReports
from proxy.routing.upstreams import NodeUpstream

__all__ = ["Plan", "Router"]  # Plan lives in proxy/routing/plan.py

CACHE_AWARE = Strategy.CACHE_AWARE.value

if TYPE_CHECKING:
    from protocol.config import CircuitBreakerConfig
    from proxy.settings.store import Settings


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
        # An attempt ended (its slot is free again): the scheduler's cue (SPEC §18).
        self.freed: Subscribers[None] = Subscribers()
        self.affinity = Affinity(settings.config.load_balancing.affinity)
        self._affinity_config = settings.config.load_balancing.affinity
        # Each report of slots, read with our in-flight count as it comes.
        self.slot_reports = SlotReports()
        backends.changes.subscribe(self.affinity.backends_changed)
        backends.changes.subscribe(self._backends_reported)
        nodes.changes.subscribe(self.affinity.node_changed)
        nodes.changes.subscribe(self._node_reported)
        if hub is not None:
            hub.subscribe(partial(count_tokens, self), ("request",))

    def __repr__(self) -> str:
        return (f"Router(local={self.local!r}, nodes={len(self.counters)}, "
                f"failovers={self.failovers})")

    async def plan(self, info: RequestInfo, headers: Sequence[Header]) -> Plan:
        """Where this request goes, at once (no queue): :meth:`ready_for`, then
        :meth:`place`. Raises the 503 when nobody can take it."""
        await self.ready_for(info, headers)
        plan = self.place(info, headers)
        assert plan is not None  # without the queue a choice is never empty
        return plan

    async def ready_for(self, info: RequestInfo, headers: Sequence[Header]) -> None:
        """Right after start: when no local backend lists the model and no node could take
        it, wait for the local backends' first checks, so a request is not refused only
        because nobody has been asked yet; for a request that goes to a node, wait for the
        nodes' first round. No await for a local hit. (A managed model on demand is loaded
        before this: ``Exchange.to_model``.)"""
        if self.backends.holder_of(info.model) is not None:
            return
        request = self._route_request(info, headers)
        if not holders(request, self.views()) and \
                await self.backends.wait_for_holder(info.model) is not None:
            return
        if request.load_balancing and not request.forwarded:
            await self.nodes.first_round(self.settings.config.timeouts.health_check.timeout)

    def place(self, info: RequestInfo, headers: Sequence[Header], *,
              queue: bool = False) -> Plan | None:
        """The routing decision, synchronous: this request's candidates — the local
        backends that list the model, and the nodes when those take part
        (:func:`~protocol.routing_choice.needs_nodes`) — go through the one choice
        (:func:`~protocol.routing_choice.choose`); the first chosen is started (in flight
        from now). ``queue`` (SPEC §18): only a candidate with a free slot may be chosen, and
        None means every one is full. A request from another gateway (``x-sluice-forwarded``)
        is never sent on. Raises the 503 when nobody holds the model (or every circuit is
        open)."""
        config = self.settings.config
        lb = config.load_balancing
        local = self.backends.holders_of(info.model)
        if len(local) == 1 and not lb.spill_over:  # the hot path, as choose() would say:
            only = local[0]  # one local candidate is the choice, unless the queue finds it full
            if not queue or self._free_now(only) != 0:  # None: unknown, so unlimited
                return self._start_local(only)
            return None
        rules = Rules(lb.strategy, lb.prefer_loaded, lb.spill_over, lb.affinity.load_bound,
                      queue)
        candidates = [self._local_candidate(b, len(local) - i) for i, b in enumerate(local)]
        conversation = None
        if len(local) > 1 and lb.strategy == CACHE_AWARE:
            conversation = self._conversation(info, headers)
            if conversation is not None:
                candidates = self._matched(conversation, candidates)
        if not needs_nodes(candidates, rules):
            return self._local_plan(local, choose(candidates, rules, self.cursor,
                                                  self.weighted), conversation)
        request = self._route_request(info, headers, queue)
        views = self.views()
        if not local:
            conversation = None
            if request.strategy == CACHE_AWARE and len(holders(request, views)) > 1:
                conversation = self._conversation(info, headers)
            if conversation is not None:
                names = {f"node:{v.fingerprint}": v.fingerprint
                         for v in holders(request, views)}
                session = self.affinity.look(conversation, names)
                request = attrs.evolve(
                    request, matches={names[n]: m for n, m in conversation.matches.items()},
                    session=None if session is None else names[session])
        now = trio.current_time()
        permitted = permits(request, views, now)
        if isinstance(permitted, NoRoute):
            self.watch_circuits(now)
            if not local:
                raise permitted.error()
            granted: dict[str, Target] = {}
        else:
            granted, nodes = permitted
            candidates = [*candidates, *nodes]
        choice = choose(candidates, rules, self.cursor, self.weighted)
        first = choice.first
        route = forward(request, granted, () if first is None or first.local else choice.order,
                        choice.affinity, now)
        self.watch_circuits(now)
        if route is None:
            return self._local_plan(local, choice, conversation)
        upstream, attempt = self.start(route, now)
        return Plan(upstream, attempt, router=self, request=request,
                    may_fail_over=route.may_fail_over, affinity=route.affinity,
                    conversation=None if local else conversation)

    def _route_request(self, info: RequestInfo, headers: Sequence[Header],
                       queue: bool = False) -> RouteRequest:
        config = self.settings.config
        lb = config.load_balancing
        return RouteRequest(
            model=info.model, load_balancing=lb.enabled,
            probe_ttl=total_timeout(config.timeouts, info)[0], strategy=lb.strategy,
            failover=lb.failover_enabled, prefer_loaded=lb.prefer_loaded,
            forwarded=header_value(headers, FORWARDED) is not None,
            load_bound=lb.affinity.load_bound, queue=queue)

    def _load(self, backend: LocalBackend) -> tuple[int, Slots | None]:
        """A local backend's requests in flight and its slots now (None: unknown)."""
        busy = self.backend_in_flight(backend.name)
        return busy, capacity(self._busy_now(backend.served_by.decode(), backend.slots, busy),
                              backend.max_concurrent)

    def _free_now(self, backend: LocalBackend) -> int | None:
        """A local backend's free slots now (None: unknown)."""
        return free_slots(*self._load(backend))

    def _local_candidate(self, backend: LocalBackend, priority: int) -> Candidate:
        """A local backend as the choice sees it (named as ``servedBy``)."""
        busy, slots = self._load(backend)
        return Candidate(backend.served_by.decode(), priority, busy,
                         waiting=waiting(busy, slots), local=True,
                         free=free_slots(busy, slots))

    def _matched(self, conversation: Conversation,
                 candidates: list[Candidate]) -> list[Candidate]:
        """The candidates with the blocks of the conversation's chain each one holds and
        whether it served the session last."""
        session = self.affinity.look(conversation, [c.fingerprint for c in candidates])
        matches = conversation.matches
        return [attrs.evolve(c, match=matches.get(c.fingerprint, 0),
                             session=c.fingerprint == session) for c in candidates]

    def _local_plan(self, local: Sequence[LocalBackend], choice: Choice,
                    conversation: Conversation | None) -> Plan | None:
        first = choice.first
        if first is None:
            return None
        backend = next(b for b in local if b.served_by.decode() == first.fingerprint)
        return self._start_local(backend, choice.affinity, conversation)

    def _start_local(self, backend: LocalBackend, affinity: str | None = None,
                     conversation: Conversation | None = None) -> Plan:
        attempt = Attempt(self._backend_counters(backend.name), trio.current_time(),
                          ended=self._ended)
        return Plan(backend, attempt, affinity=affinity, conversation=conversation)

    def _ended(self) -> None:
        if self.freed:
            self.freed.publish(None)

    def _conversation(self, info: RequestInfo, headers: Sequence[Header]
                      ) -> Conversation | None:
        config = self.settings.config.load_balancing.affinity
        if config is not self._affinity_config:
            self._affinity_config = config
            self.affinity.follow(config)
        return self.affinity.conversation(info, headers)

    def start(self, route: Forward, now: float) -> tuple[NodeUpstream, Attempt]:
        """Take the route's first target: the upstream and its attempt (now in flight)."""
        target = route.choose(now)
        endpoint = self.nodes.endpoint(target.fingerprint)
        assert endpoint is not None
        key = self.settings.secrets.node_keys.get(target.fingerprint)
        upstream = NodeUpstream(endpoint, key, self.settings.node_id.encode())
        attempt = Attempt(self._node_counters(target.fingerprint), now, target, endpoint.speed,
                          reported=self.watch_circuits, ended=self._ended)
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
            in_flight = counters.active if counters is not None else 0
            slots = {model: self.slot_reports.now(f"node:{fp}\x00{model}", reported, in_flight)
                     for model, reported in endpoint.slots.items()}
            views.append(NodeView(
                fingerprint=fp, priority=cfg.priority, models=endpoint.model_ids,
                loaded=endpoint.loaded_ids,
                breaker=self._breaker(fp, cb), enabled=True, online=endpoint.online,
                in_flight=in_flight, latency_ms=endpoint.speed.value, weight=cfg.weight,
                slots=slots))
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

    def _busy_now(self, key: str, slots: Slots | None, in_flight: int) -> Slots | None:
        """SlotReports.now (None: no report)."""
        return None if slots is None else self.slot_reports.now(key, slots, in_flight)

    def _backends_reported(self, registry: BackendRegistry) -> None:
        """A backend's report may have come: read it with our in-flight count now."""
        for backend in registry.backends:
            self._busy_now(backend.served_by.decode(), backend.slots,
                           self.backend_in_flight(backend.name))

    def _node_reported(self, endpoint: NodeEndpoint) -> None:
        counters = self.counters.get(endpoint.fingerprint)
        in_flight = 0 if counters is None else counters.active
        for model, slots in endpoint.slots.items():
            self.slot_reports.now(f"node:{endpoint.fingerprint}\x00{model}", slots, in_flight)

    def backend_in_flight(self, name: str) -> int:
        """Our requests in flight to local backend ``name`` now."""
        counters = self.backend_counters.get(name)
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
