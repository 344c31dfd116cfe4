"""What one try of a request on one upstream counts (SPEC §7.4, §8).

An :class:`Attempt` is in flight from its creation until :meth:`Attempt.finish` records its
:class:`Outcome`, exactly once, on the upstream's :class:`Counters` (a local attempt also on
its backend's own, for the metrics' per-upstream gauge) and — for a node — on its circuit
breaker:

- *success*: the upstream answered below 400 and the answer was relayed whole;
- *client error*: a 4xx relayed whole — the node did its job, so a success in the stats, but
  the client's doing, so it moves no breaker (a half-open probe is released);
- *failure*: a connect error, a 5xx, a timeout or a cut stream;
- *aborted*: the client went away first (or the gateway stopped): moves no breaker.
"""

from __future__ import annotations

import enum
from typing import Any

from proxy.routing.resolve import Target
from proxy.routing.strategies import LatencyAverage


class Outcome(enum.Enum):
    SUCCESS = "success"
    CLIENT_ERROR = "client_error"
    FAILURE = "failure"
    ABORTED = "aborted"


class Counters:
    """Attempts on one upstream (a node, one local backend, or all local backends
    together)."""

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
    """One try of a request on one upstream (see the module docstring)."""

    __slots__ = ("_counters", "_speed", "finished", "started", "target")

    def __init__(self, counters: Counters, now: float, target: Target | None = None,
                 speed: LatencyAverage | None = None, *,
                 backend: Counters | None = None) -> None:
        self._counters = (counters,) if backend is None else (counters, backend)
        self._speed = speed
        self.target = target
        self.started = now
        self.finished = False
        for each in self._counters:
            each.total += 1
            each.active += 1

    def __repr__(self) -> str:
        where = self.target.fingerprint if self.target is not None else "local"
        return f"Attempt({where}, finished={self.finished})"

    def answered(self, now: float) -> None:
        """The response head arrived: time to first byte, for the stats and ``fastest``."""
        ms = max(now - self.started, 0.0) * 1000
        for each in self._counters:
            each.latency_sum += ms
            each.latency_count += 1
        if self._speed is not None:
            self._speed.add(ms)

    def finish(self, outcome: Outcome, now: float) -> None:
        """Record the outcome; later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        for each in self._counters:
            each.active -= 1
            if outcome is Outcome.FAILURE:
                each.failure += 1
            elif outcome is Outcome.ABORTED:
                each.aborted += 1
            else:
                each.success += 1
        if outcome is Outcome.FAILURE:
            report = Target.failed
        elif outcome is Outcome.ABORTED:
            report = Target.neutral
        else:  # answered; a 4xx is the client's doing and moves no breaker
            report = Target.succeeded if outcome is Outcome.SUCCESS else Target.neutral
        if self.target is not None:
            report(self.target, now)
