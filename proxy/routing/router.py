"""The routing state that lives as long as the gateway, and the plan of one request.

:class:`Router` owns a circuit breaker and a set of :class:`Counters` per node, the
counters of the local backends, the round-robin cursor and the failover count. For each
request it makes a :class:`Plan`: the upstream to send to, the :class:`Attempt` that counts
it, and — for a forward that may fail over — the way to the next node
(:meth:`Plan.alternate`). Resolution itself is :func:`proxy.routing.resolve.resolve`
(pure); this module feeds it a snapshot of the node index and reads the clock.

Outcomes (SPEC §7.4, §8): an attempt is a *success* when the upstream answered below 500
and the answer was relayed whole (a 4xx is the client's doing: the node did its job); a
*failure* on a connect error, a 5xx, a timeout or a cut stream; *aborted* when the client
went away first. Failures and successes below 400 move the node's breaker; a 4xx or an
aborted attempt is client-caused: it releases a half-open probe and moves nothing.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Protocol

import trio

from protocol.request_info import RequestInfo, total_timeout
from protocol.upstream_url import UpstreamAddress
from proxy.pool.nodes import ONLINE, NodeEndpoint, NodeIndex
from proxy.routing.breaker import BreakerState, CircuitBreaker
from proxy.routing.resolve import Forward, Local, NodeView, Refusal, RouteRequest, Target, resolve
from proxy.routing.strategies import LatencyAverage, RoundRobinCursor

if TYPE_CHECKING:
    from protocol.config import CircuitBreakerConfig
    from proxy.settings import Settings


class Outcome(enum.Enum):
    SUCCESS = "success"  # answered below 400 and relayed whole
    REFUSED = "refused"  # a 4xx relayed whole: a success in the stats, neutral for the breaker
    FAILURE = "failure"
    ABORTED = "aborted"


class Counters:
    """Attempts on one upstream (a node, or all local backends together)."""

    __slots__ = ("aborted", "active", "failure", "latency_count", "latency_sum", "success",
                 "total")

    def __init__(self) -> None:
        self.total = 0  # = success + failure + aborted + active
        self.success = 0
        self.failure = 0
        self.aborted = 0
        self.active = 0  # in flight now
        self.latency_sum = 0.0  # ms to the response head, over answered attempts
        self.latency_count = 0

    def __repr__(self) -> str:
        return (f"Counters(total={self.total}, ok={self.success}, failed={self.failure}, "
                f"aborted={self.aborted}, active={self.active})")

    def to_json(self) -> dict[str, Any]:
        avg = (round(self.latency_sum / self.latency_count, 1) if self.latency_count
               else None)
        return {"totalRequests": self.total, "successCount": self.success,
                "failureCount": self.failure, "abortedCount": self.aborted,
                "avgLatencyMs": avg, "activeRequests": self.active}


class Attempt:
    """One try of a request on one upstream: in flight from creation until
    :meth:`finish`, which records the outcome exactly once (later calls do nothing)."""

    __slots__ = ("_counters", "_speed", "finished", "started", "target")

    def __init__(self, counters: Counters, now: float, target: Target | None = None,
                 speed: LatencyAverage | None = None) -> None:
        self._counters = counters
        self._speed = speed
        self.target = target
        self.started = now
        self.finished = False
        counters.total += 1
        counters.active += 1

    def __repr__(self) -> str:
        where = self.target.fingerprint if self.target is not None else "local"
        return f"Attempt({where}, finished={self.finished})"

    def answered(self, now: float) -> None:
        """The response head arrived: time to first byte, for the stats and ``fastest``."""
        ms = max(now - self.started, 0.0) * 1000
        self._counters.latency_sum += ms
        self._counters.latency_count += 1
        if self._speed is not None:
            self._speed.add(ms)

    def finish(self, outcome: Outcome, now: float) -> None:
        if self.finished:
            return
        self.finished = True
        counters = self._counters
        counters.active -= 1
        if outcome is Outcome.FAILURE:
            counters.failure += 1
            report = Target.failed
        elif outcome is Outcome.ABORTED:
            counters.aborted += 1
            report = Target.neutral
        else:  # answered; a 4xx is the client's doing and moves no breaker
            counters.success += 1
            report = Target.succeeded if outcome is Outcome.SUCCESS else Target.neutral
        if self.target is not None:
            report(self.target, now)


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

    __slots__ = ("_request", "_router", "attempt", "may_fail_over", "upstream")

    def __init__(self, upstream: Upstream, attempt: Attempt, *, router: Router | None = None,
                 request: RouteRequest | None = None, may_fail_over: bool = False) -> None:
        self.upstream = upstream
        self.attempt = attempt
        self.may_fail_over = may_fail_over
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
            model=request.model, local=False, load_balancing=True,
            probe_ttl=request.probe_ttl, strategy=request.strategy, failover=False,
            tried=request.tried | {target.fingerprint})
        route = router.resolve(retry, now)
        if not isinstance(route, Forward):
            return False
        self.attempt.finish(Outcome.FAILURE, now)
        self.upstream, self.attempt = router.start(route, now)
        router.failovers += 1
        return True


class Router:
    """Breakers, counters and the round-robin cursor (see the module docstring)."""

    def __init__(self, settings: Settings, nodes: NodeIndex) -> None:
        self.settings = settings
        self.nodes = nodes
        self.local = Counters()
        self.cursor = RoundRobinCursor()
        self.failovers = 0
        self._breakers: dict[str, CircuitBreaker] = {}
        self._counters: dict[str, Counters] = {}

    def __repr__(self) -> str:
        return (f"Router(local={self.local!r}, nodes={len(self._counters)}, "
                f"failovers={self.failovers})")

    # -- plans ---------------------------------------------------------------------------

    def local_plan(self, backend: Upstream) -> Plan:
        return Plan(backend, Attempt(self.local, trio.current_time()))

    def node_holds(self, model: str, *, forwarded: bool) -> bool:
        """True when a node could take ``model`` now: load balancing on, the request not
        forwarded to us, and a node that routing would consider (enabled in the live
        config, online) lists it. Breakers are not asked here."""
        if forwarded or not self.settings.config.load_balancing.enabled:
            return False
        return any(view.online and model in view.models for view in self._views())

    async def forward_plan(self, info: RequestInfo, *, forwarded: bool) -> Plan:
        """The plan for a model no local backend holds, or the 503 to answer (raised)."""
        config = self.settings.config
        lb = config.load_balancing
        if lb.enabled and not forwarded:
            await self.nodes.first_round(config.timeouts.health_check.timeout)
        request = RouteRequest(
            model=info.model, local=False, load_balancing=lb.enabled,
            probe_ttl=total_timeout(config.timeouts, info)[0], strategy=lb.strategy,
            failover=lb.failover_enabled, forwarded=forwarded)
        now = trio.current_time()
        route = self.resolve(request, now)
        if isinstance(route, Refusal):
            raise route.error()
        upstream, attempt = self.start(route, now)
        return Plan(upstream, attempt, router=self, request=request,
                    may_fail_over=route.may_fail_over)

    def resolve(self, request: RouteRequest, now: float) -> Forward | Refusal:
        route = resolve(request, self._views(), self.cursor, now)
        if isinstance(route, Local):  # pragma: no cover - local=False never resolves LOCAL
            raise AssertionError("a forward resolved to a local backend")
        return route

    def start(self, route: Forward, now: float) -> tuple[NodeUpstream, Attempt]:
        """Take the route's first target: the upstream and its attempt (now in flight)."""
        target = route.choose(now)
        endpoint = self.nodes.endpoint(target.fingerprint)
        assert endpoint is not None
        key = self.settings.secrets.node_keys.get(target.fingerprint)
        upstream = NodeUpstream(endpoint, key, self.settings.node_id.encode())
        attempt = Attempt(self._node_counters(target.fingerprint), now, target, endpoint.speed)
        return upstream, attempt

    # -- state ---------------------------------------------------------------------------

    def _breaker(self, fingerprint: str, config: CircuitBreakerConfig) -> CircuitBreaker:
        breaker = self._breakers.get(fingerprint)
        if breaker is None:
            breaker = self._breakers[fingerprint] = CircuitBreaker.from_config(config)
        else:  # follow live settings changes without forgetting the state
            breaker.failure_threshold = config.failure_threshold
            breaker.reset_timeout = config.reset_timeout
        return breaker

    def _node_counters(self, fingerprint: str) -> Counters:
        counters = self._counters.get(fingerprint)
        if counters is None:
            counters = self._counters[fingerprint] = Counters()
        return counters

    def _views(self) -> list[NodeView]:
        config = self.settings.config
        cb = config.circuit_breaker
        # The live config decides who is in: a node disabled or removed a moment ago is out
        # even before the health-check task has caught up with the change.
        live = {n.fingerprint: n for n in config.nodes if n.enabled}
        views = []
        for endpoint in self.nodes.endpoints:
            fp = endpoint.fingerprint
            cfg = live.get(fp)
            if cfg is None or cfg.base_url != endpoint.cfg.base_url:
                continue
            counters = self._counters.get(fp)
            views.append(NodeView(
                fingerprint=fp, priority=cfg.priority, models=endpoint.model_ids,
                breaker=self._breaker(fp, cb), enabled=True,
                online=endpoint.status == ONLINE and endpoint.address is not None,
                in_flight=counters.active if counters is not None else 0,
                latency_ms=endpoint.speed.value))
        return views

    def stats(self) -> dict[str, Any]:
        """SPEC §8 routing stats: every configured node (top first), local, the totals."""
        config = self.settings.config
        now = trio.current_time()
        configured = sorted(config.nodes, key=lambda n: -n.priority)
        known = {n.fingerprint for n in configured}
        for table in (self._breakers, self._counters):  # forget removed nodes
            for fp in [fp for fp in table if fp not in known]:
                del table[fp]
        nodes = []
        for cfg in configured:
            counters = self._counters.get(cfg.fingerprint) or Counters()
            breaker = self._breakers.get(cfg.fingerprint)
            state = breaker.state(now) if breaker is not None else BreakerState.CLOSED
            nodes.append({
                "fingerprint": cfg.fingerprint, "name": cfg.name, "enabled": cfg.enabled,
                **counters.to_json(),
                "circuitOpen": state is not BreakerState.CLOSED,
                "circuitState": state.value,
                "consecutiveFailures": breaker.consecutive_failures if breaker else 0})
        local = self.local.to_json()
        every = [*nodes, local]
        return {
            "nodes": nodes,
            "local": local,
            "totalRequests": sum(n["totalRequests"] for n in every),
            "totalSuccesses": sum(n["successCount"] for n in every),
            "totalFailures": sum(n["failureCount"] for n in every),
            "totalAborted": sum(n["abortedCount"] for n in every),
            "failovers": self.failovers,
            "circuitBreaker": {"failureThreshold": config.circuit_breaker.failure_threshold,
                               "resetTimeoutSecs": _seconds(config.circuit_breaker.reset_timeout)},
        }


def _seconds(value: float) -> float | int:
    """Whole seconds as an integer (``60``, as the seed shows), others as they are."""
    return int(value) if float(value).is_integer() else value
