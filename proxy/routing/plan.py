"""One request's place (:class:`Plan`): the upstream and the attempt of its current try,
and, for a forward that may fail over, the way to the next node (:meth:`Plan.alternate`).
Made by :meth:`proxy.routing.router.Router.place`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from proxy.routing.attempts import Attempt, Outcome
from proxy.routing.resolve import Forward, RouteRequest, resolve
from proxy.routing.upstreams import NodeUpstream, Upstream

if TYPE_CHECKING:
    from protocol.strategies import RoundRobinCursor, WeightedCursor
    from proxy.routing.affinity import Conversation
    from proxy.routing.resolve import NodeView


class Router(Protocol):
    """What a plan's failover asks of the router (:class:`proxy.routing.router.Router`)."""

    cursor: RoundRobinCursor
    weighted: WeightedCursor
    failovers: int

    def views(self) -> Sequence[NodeView]: ...

    def watch_circuits(self, now: float) -> None: ...

    def start(self, route: Forward, now: float) -> tuple[NodeUpstream, Attempt]: ...


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
