"""SPEC §8 routing stats (``/api/v1/pool/routing-stats``, ``/admin/stats``): every
configured node (top first) with its counters and circuit, the local backends, the totals."""

from __future__ import annotations

from typing import Any

import trio

from protocol.config import Config, by_priority
from proxy.routing.attempts import Counters
from proxy.routing.breaker import BreakerState
from proxy.routing.router import Router


def routing_stats(router: Router, config: Config) -> dict[str, Any]:
    now = trio.current_time()
    configured = by_priority(config.nodes)
    router.forget_removed({n.fingerprint for n in configured})
    nodes = []
    for cfg in configured:
        counters = router.counters.get(cfg.fingerprint) or Counters()
        breaker = router.breakers.get(cfg.fingerprint)
        state = breaker.state(now) if breaker is not None else BreakerState.CLOSED
        nodes.append({
            "fingerprint": cfg.fingerprint, "name": cfg.name, "enabled": cfg.enabled,
            **counters.to_json(),
            "circuitOpen": state is not BreakerState.CLOSED,
            "circuitState": state.value,
            "consecutiveFailures": breaker.consecutive_failures if breaker else 0})
    local = router.local.to_json()
    every = [*nodes, local]
    cb = config.circuit_breaker
    return {
        "nodes": nodes,
        "local": local,
        "totalRequests": sum(n["totalRequests"] for n in every),
        "totalSuccesses": sum(n["successCount"] for n in every),
        "totalFailures": sum(n["failureCount"] for n in every),
        "totalAborted": sum(n["abortedCount"] for n in every),
        "failovers": router.failovers,
        "circuitBreaker": {"failureThreshold": cb.failure_threshold,
                           "resetTimeoutSecs": _seconds(cb.reset_timeout)},
    }


def _seconds(value: float) -> float | int:
    """Whole seconds as an integer (``60``, as the seed shows), others as they are."""
    return int(value) if float(value).is_integer() else value
