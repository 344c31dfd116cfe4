"""What one try of a request on one upstream counts (SPEC §7.4, §8).

An :class:`Attempt` is in flight from its creation until :meth:`Attempt.finish` records its
:class:`Outcome`, exactly once, on the upstream's :class:`Counters` and — for a node — on its
circuit breaker:

- *success*: the upstream answered below 400 and the answer was relayed whole;
- *client error*: a 4xx relayed whole — the node did its job, so a success in the stats, but
  the client's doing, so it moves no breaker (a half-open probe is released);
- *failure*: a connect error, a 5xx, a timeout or a cut stream;
- *aborted*: the client went away first (or the gateway stopped): moves no breaker.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

from protocol.strategies import LatencyAverage
from proxy.routing.resolve import Target


class Outcome(enum.Enum):
    SUCCESS = "success"
    CLIENT_ERROR = "client_error"
    FAILURE = "failure"
    ABORTED = "aborted"


class Counters:
    """Attempts on one upstream (a node or a local backend; :meth:`added` sums several)."""

    __slots__ = ("aborted", "active", "cached_tokens", "failure", "latency_count",
                 "latency_sum", "prompt_tokens", "success", "total")

    def __init__(self) -> None:
        self.total = 0  # = success + failure + aborted + active
        self.success = 0
        self.failure = 0
        self.aborted = 0
        self.active = 0  # in flight now
        self.latency_sum = 0.0  # ms to the response head, over answered attempts
        self.latency_count = 0
        # Prompt tokens of the answers that said how many they reused, and those reused
        # (SPEC §15 cacheHitRate), added in the hub's batch (Router.count_tokens).
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def __repr__(self) -> str:
        return (f"Counters(total={self.total}, ok={self.success}, failed={self.failure}, "
                f"aborted={self.aborted}, active={self.active})")

    @classmethod
    def added(cls, parts: Iterable[Counters]) -> Counters:
        """The sum of several upstreams' counters (all local backends together)."""
        total = cls()
        for part in parts:
            for name in cls.__slots__:
                setattr(total, name, getattr(total, name) + getattr(part, name))
        return total

    def to_json(self) -> dict[str, Any]:
        avg = (round(self.latency_sum / self.latency_count, 1) if self.latency_count
               else None)
        return {"totalRequests": self.total, "successCount": self.success,
                "failureCount": self.failure, "abortedCount": self.aborted,
                "avgLatencyMs": avg, "activeRequests": self.active,
                "cacheHitRate": (round(self.cached_tokens / self.prompt_tokens, 4)
                                 if self.prompt_tokens else None)}


class Attempt:
    """One try of a request on one upstream (see the module docstring). ``reported(now)``,
    when given, is called after a node's breaker heard the outcome (the router looks there
    for a circuit transition); ``ended()`` last, once its slot is free again (the queue's
    cue, SPEC §18)."""

    __slots__ = ("_counters", "_ended", "_reported", "_speed", "finished", "started", "target")

    def __init__(self, counters: Counters, now: float, target: Target | None = None,
                 speed: LatencyAverage | None = None, *,
                 reported: Callable[[float], None] | None = None,
                 ended: Callable[[], None] | None = None) -> None:
        self._counters = counters
        self._speed = speed
        self._reported = reported
        self._ended = ended
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
        """Record the outcome; later calls do nothing."""
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
        else:
            counters.success += 1  # answered; a 4xx is the client's doing and moves no breaker
            report = Target.succeeded if outcome is Outcome.SUCCESS else Target.neutral
        if self.target is not None:
            report(self.target, now)
            if self._reported is not None:
                self._reported(now)
        if self._ended is not None:
            self._ended()
