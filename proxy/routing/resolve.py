"""Which node takes a request no local backend holds (SPEC §7.1, §7.4). Local first is
decided before this, by :meth:`proxy.routing.router.Router.plan`.

Pure and synchronous: the caller snapshots its state into a :class:`RouteRequest` and
:class:`NodeView` values, passes ``now`` (``trio.current_time()``), a
:class:`RoundRobinCursor` and (for the weighted strategy) a :class:`WeightedCursor`, and
gets back one of

- a :class:`Forward` — the eligible nodes in strategy order (those that have the model
  loaded first, with ``prefer_loaded``), each with its breaker permit;
- a :class:`NoRoute` — 503 with ``code`` ``model_not_available`` (nobody eligible holds it,
  load balancing is off, or the request was already forwarded to us) or
  ``all_circuits_open`` (eligible holders exist, but every one's circuit is open, or
  half-open with its single probe already out).

Eligible (:func:`holders`, the one rule) = load balancing on, the request not forwarded to
us, the node enabled, online, holding the model and not yet tried by this request; then its
breaker must grant a permit now. Using a Forward: call :meth:`Forward.choose` straight away
(no await in between), which returns the first target and releases the permits of the
others, then report the outcome on the chosen :class:`Target`. On a connect error or a 5xx with
``forward.may_fail_over``, resolve again with the failed fingerprint added to ``tried``; a
:class:`NoRoute` then means there is no alternate, and the first upstream error is the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from protocol.config import Strategy
from protocol.errors import SluiceError, all_circuits_open, model_not_available
from protocol.routing_choice import Rules, choose
from protocol.slots import Slots, free_slots, waiting
from protocol.strategies import Candidate, RoundRobinCursor, WeightedCursor
from proxy.routing.breaker import CircuitBreaker, Permit

MODEL_NOT_AVAILABLE = "model_not_available"
ALL_CIRCUITS_OPEN = "all_circuits_open"
NO_FREE_SLOT = "no_free_slot"  # SPEC §18: only with the queue; the request waits


@attrs.frozen
class NodeView:
    """One registered node as routing sees it at this instant."""

    fingerprint: str
    priority: int
    models: frozenset[str]  # ids from its last health check (owned_by "remote" excluded)
    breaker: CircuitBreaker = attrs.field(eq=False)
    enabled: bool = True  # the per-node routing switch
    online: bool = True  # the last health check answered
    in_flight: int = 0
    latency_ms: float | None = None  # LatencyAverage.value
    # The models it has loaded (SPEC §11; NodeEndpoint.loaded_ids): by default all it holds.
    loaded: frozenset[str] = attrs.field(
        default=attrs.Factory(lambda view: view.models, takes_self=True))
    weight: int = 1  # nodes[].weight (SPEC §13)
    # Per model, the node's slots as its last health check reported them (SPEC §15).
    slots: Mapping[str, Slots] = attrs.field(factory=dict, eq=False)

    def candidate(self, model: str, request: RouteRequest | None = None) -> Candidate:
        fp = self.fingerprint
        slots = self.slots.get(model)
        return Candidate(fp, self.priority, self.in_flight, self.latency_ms,
                         model in self.loaded, self.weight, waiting(self.in_flight, slots),
                         0 if request is None else request.matches.get(fp, 0),
                         request is not None and fp == request.session,
                         free=free_slots(self.in_flight, slots))


@attrs.frozen
class RouteRequest:
    """The facts of one request that routing needs."""

    model: str
    load_balancing: bool
    probe_ttl: float  # the request's own total timeout: bounds a half-open probe
    strategy: Strategy | str = Strategy.PRIORITY
    failover: bool = True  # load_balancing.failover_enabled
    prefer_loaded: bool = True  # load_balancing.prefer_loaded: loaded holders first
    forwarded: bool = False  # came with x-sluice-forwarded: never forward again
    tried: frozenset[str] = frozenset()  # fingerprints this request already failed on
    # cache-aware (SPEC §15): leading blocks of the prompt's chain each node holds, the node
    # that last served the request's session, and load_balancing.affinity.load_bound
    matches: Mapping[str, int] = attrs.field(factory=dict, eq=False)
    session: str | None = None
    load_bound: int = 1
    queue: bool = False  # SPEC §18: only a node with a free slot may be chosen

    @property
    def rules(self) -> Rules:
        return Rules(self.strategy, self.prefer_loaded, load_bound=self.load_bound,
                     queue=self.queue)


@attrs.frozen
class Target:
    """One node to send to, with the breaker permit to report the outcome on."""

    fingerprint: str
    breaker: CircuitBreaker = attrs.field(eq=False, repr=False)
    permit: Permit

    def succeeded(self, now: float) -> None:
        self.breaker.record_success(self.permit, now)

    def failed(self, now: float) -> None:
        self.breaker.record_failure(self.permit, now)

    def neutral(self, now: float) -> None:
        self.breaker.record_neutral(self.permit, now)


@attrs.frozen
class Forward:
    """Forward to a node: ``targets`` in strategy order, never empty."""

    targets: tuple[Target, ...]
    may_fail_over: bool  # failover enabled and this is not already the second attempt
    affinity: str | None = None  # cache-aware: why the first target (SPEC §15)

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return tuple(t.fingerprint for t in self.targets)

    def choose(self, now: float) -> Target:
        """The target to use; the other permits are released (a held probe goes back)."""
        for other in self.targets[1:]:
            other.neutral(now)
        return self.targets[0]


@attrs.frozen
class NoRoute:
    """No route: answer 503 with this ``code``."""

    model: str
    code: str
    status: int = 503

    def error(self) -> SluiceError:
        if self.code == ALL_CIRCUITS_OPEN:
            return all_circuits_open(self.model)
        return model_not_available(self.model)


def holders(request: RouteRequest, nodes: Sequence[NodeView]) -> list[NodeView]:
    """The nodes that may take ``request`` (breakers aside): none with load balancing off or
    for a request already forwarded to us; else the enabled, online nodes that hold the
    model and were not tried by this request yet."""
    if request.forwarded or not request.load_balancing:
        return []
    return [node for node in nodes
            if node.enabled and node.online and request.model in node.models
            and node.fingerprint not in request.tried]


def resolve(
    request: RouteRequest, nodes: Sequence[NodeView], cursor: RoundRobinCursor, now: float,
    *, weighted: WeightedCursor | None = None,
) -> Forward | NoRoute:
    """Resolve one request (see the module docstring). Advances ``cursor`` for round-robin
    or ``weighted`` for weighted, and takes breaker permits (those of nodes not in the
    order are given back); nothing else changes. With ``request.queue`` every permitted
    node may be full: a NoRoute with ``code`` :data:`NO_FREE_SLOT`."""
    permitted = permits(request, nodes, now)
    if isinstance(permitted, NoRoute):
        return permitted
    granted, candidates = permitted
    choice = choose(candidates, request.rules, cursor, weighted)
    route = forward(request, granted, choice.order, choice.affinity, now)
    return NoRoute(request.model, NO_FREE_SLOT) if route is None else route


def permits(request: RouteRequest, nodes: Sequence[NodeView], now: float
            ) -> tuple[dict[str, Target], list[Candidate]] | NoRoute:
    """The eligible nodes' breaker permits and their candidates, or why there are none."""
    Strategy(request.strategy)  # an unknown one fails before any permit is taken
    eligible = holders(request, nodes)
    if not eligible:
        return NoRoute(request.model, MODEL_NOT_AVAILABLE)
    if len({node.fingerprint for node in eligible}) != len(eligible):
        raise ValueError("a node fingerprint is listed twice")
    granted: dict[str, Target] = {}
    candidates: list[Candidate] = []
    for node in eligible:
        permit = node.breaker.allow(now, request.probe_ttl)
        if permit is not None:
            granted[node.fingerprint] = Target(node.fingerprint, node.breaker, permit)
            candidates.append(node.candidate(request.model, request))
    if not candidates:
        return NoRoute(request.model, ALL_CIRCUITS_OPEN)
    return granted, candidates


def forward(request: RouteRequest, granted: Mapping[str, Target], order: Sequence[Candidate],
            affinity: str | None, now: float) -> Forward | None:
    """The Forward to the ordered nodes (None when the order is empty); the permits of
    the granted nodes left out of it are given back."""
    chosen = {c.fingerprint for c in order}
    for fp, target in granted.items():
        if fp not in chosen:
            target.neutral(now)
    if not order:
        return None
    return Forward(targets=tuple(granted[c.fingerprint] for c in order),
                   may_fail_over=request.failover and not request.tried, affinity=affinity)
