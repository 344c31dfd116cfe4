"""The soak (issue 11, part 7): a real gateway process in front of a fake model server
(tests/soakload.py, in its own process: tests/soakserver.py), loaded by many clients each opening
stream after stream, over TCP and over the Unix socket, with 10% client aborts and 5%
injected upstream faults. It asserts correctness only, never speed:

- every request has exactly its expected outcome: a whole, byte-exact stream; a 5xx or one
  SSE error event for each injected fault (and no other request fails); each client request
  reaches the upstream exactly once (a local backend has no failover);
- the gateway's counters agree: every request counted once, as a success, a failure (the
  injected faults) or an abort (the client aborts), and nothing left in flight;
- no leak: once the load is over, the gateway's open file descriptors minus the upstream
  connections its pool keeps idle (counted on the fake's side) are back to the warm
  baseline, the idle ones are within the pool's cap, and when the gateway stops the fake
  has no connection left;
- RSS drift under 5% between the end of the warm-up and the end of the load.

``scripts/soak`` runs the full size (``SLUICE_SOAK=1``; ``SLUICE_SOAK_STREAMS``, default
500, ``SLUICE_SOAK_SECONDS``, default 120, ``SLUICE_SOAK_SEED``, and ``SLUICE_SOAK_GAP``,
the seconds between two events, default 0.5: streams of about 3 s, so that the clients,
one Python process, can keep 500 of them open at once); the default suite runs the same
checks small (:data:`SMOKE`: 40 streams for 5 s, events 20 ms apart).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from proxy.upstream.pool import IDLE_PER_ADDRESS
from tests.figures import Figures
from tests.gateways import GatewayProcess, Launcher
from tests.soakload import GAP, Tally, client_loop, open_fds, rss_kb
from tests.soakserver import SoakServer

SMOKE = {"streams": 40, "seconds": 5.0}
WARM_REQUESTS = 5
HEALTH = {"interval": 5.0, "timeout": 4.0}  # the defaults of protocol.config
SETTLE = 20.0  # seconds for connections to close once the load is over
RSS_DRIFT_LIMIT = 5.0  # percent


def soak_size() -> dict[str, Any]:
    return {"streams": int(os.environ.get("SLUICE_SOAK_STREAMS", "500")),
            "seconds": float(os.environ.get("SLUICE_SOAK_SECONDS", "120")),
            "seed": int(os.environ.get("SLUICE_SOAK_SEED", "11")),
            "gap": float(os.environ.get("SLUICE_SOAK_GAP", "0.5"))}


async def held(gw: GatewayProcess, up: SoakServer) -> int:
    """Gateway fds that are not upstream connections (each one the fake sees open)."""
    assert gw.proc is not None
    open_upstream = (await up.stats())["open"]
    return open_fds(gw.proc.pid) - open_upstream


async def settle(gw: GatewayProcess, up: SoakServer, baseline: int) -> int:
    """Wait (bounded) until the gateway holds no more fds than at the baseline."""
    with trio.move_on_after(SETTLE):
        while await held(gw, up) != baseline:
            await trio.sleep(0.1)
    return await held(gw, up)


async def quiet(gw: GatewayProcess, up: SoakServer) -> int:
    """``held()`` once it has not changed for a second (bounded): the warm baseline, with
    no client connection still closing and no health check in progress."""
    last: list[int] = []
    with trio.move_on_after(SETTLE):
        while len(last) < 10 or len(set(last[-10:])) > 1:
            last.append(await held(gw, up))
            await trio.sleep(0.1)
    return min(last[-10:])


async def warm(gw: GatewayProcess, address: str, tally: Tally) -> None:
    """The model is listed, then a few streams one by one (modules loaded, pool warm)."""
    async def listed() -> bool:
        return any(m == "fake-model" for m, _ in await gw.model_ids())

    await gw.wait_until(listed, "the fake backend's model listed", timeout=15)
    await client_loop(address, -1, 0, trio.current_time() + 10, WARM_REQUESTS, tally,
                      plain=True)


async def soak(root: Path, transport: str, streams: int, seconds: float,
               seed: int = 11, gap: float = GAP) -> dict[str, Any]:
    up = await SoakServer().start()
    launcher = Launcher(root)
    stopped = False
    try:
        # The product's health-check timing (tests' processes poll faster): a check that
        # fails takes the backend offline, and under this load a 0.8 s check may.
        gw = await launcher.start("soak", backends=[("fake", up.url)],
                                  interval=HEALTH["interval"], hc_timeout=HEALTH["timeout"])
        assert gw.proc is not None
        pid = gw.proc.pid
        address = gw.address if transport == "tcp" else gw.unix
        warm_tally = Tally()
        await warm(gw, address, warm_tally)
        assert warm_tally.ok == warm_tally.requests, warm_tally.unexpected
        baseline = await quiet(gw, up)
        fds_before = open_fds(pid)
        rss_idle = rss_kb(pid)
        tally = Tally()
        start = trio.current_time()
        until = start + seconds
        warm_at = start + max(1.0, seconds / 4)
        rss: dict[str, int] = {}
        fds_peak = 0

        async def sample() -> None:
            nonlocal fds_peak
            while trio.current_time() < until:
                await trio.sleep(0.25)
                fds_peak = max(fds_peak, open_fds(pid))
                rss["load_max"] = max(rss.get("load_max", 0), rss_kb(pid))
                if "warm" not in rss and trio.current_time() >= warm_at:
                    rss["warm"] = rss_kb(pid)
                    rss["warm_streams"] = tally.streaming
            rss["end"] = rss_kb(pid)

        max_requests = int(seconds * 200) + 10  # a bound far above what fits in the time
        with trio.fail_after(seconds + 60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                for worker in range(streams):
                    nursery.start_soon(partial(client_loop, address, worker, seed, until,
                                               max_requests, tally, gap=gap))
        elapsed = trio.current_time() - start
        after = await settle(gw, up, baseline)
        fds_after = open_fds(pid)
        seen = await up.stats()
        stats = (await gw.routing_stats())["local"]
        stopped = True
        await launcher.aclose()  # SIGTERM; fails on a traceback in the gateway's log
        with trio.move_on_after(SETTLE):
            while (await up.stats())["open"]:
                await trio.sleep(0.05)
        left_open = (await up.stats())["open"]
    finally:
        try:
            if not stopped:
                await launcher.aclose()
        finally:
            await up.stop()
    drift = 100.0 * (rss["end"] - rss["warm"]) / rss["warm"]
    injected = sum(tally.injected.values())
    return {
        "tally": tally, "seen": seen, "stats": stats, "baseline": baseline, "after": after,
        "idle_upstream": seen["open"], "left_open": left_open, "drift": drift,
        "figures": {
            "transport": transport, "streams": streams, "event_gap_s": gap,
            "seconds": round(elapsed, 1),
            "requests": tally.requests, "completed": tally.ok, "aborts": tally.aborts,
            "injected_faults": injected, "client_visible_errors": tally.client_errors,
            "unexpected": tally.unexpected_count, "streams_held": tally.streams_held,
            "client_connections": tally.connections,
            "fds_before": fds_before, "fds_peak": fds_peak, "fds_after": fds_after,
            "idle_upstream_after": seen["open"],
            "rss_idle_kb": rss_idle, "rss_warm_kb": rss["warm"], "rss_end_kb": rss["end"],
            "rss_drift_pct": round(drift, 2),
            "rss_per_stream_kb": round((rss["load_max"] - rss_idle) / max(streams, 1), 1),
            "attempts_per_request_max": seen["attempts_max"]},
    }


def check(result: dict[str, Any]) -> None:
    tally: Tally = result["tally"]
    seen = result["seen"]
    stats = result["stats"]
    assert tally.unexpected == []
    assert tally.unexpected_count == 0
    assert min(tally.requests, tally.ok, tally.aborts) > 0
    # Client-visible errors are exactly the injected faults, each with its expected outcome.
    assert tally.client_errors == sum(tally.injected.values())
    assert tally.as_expected == tally.injected
    # What reached the upstream: each request once, each fault as injected.
    assert seen["acts"].get("reset", 0) == tally.injected["reset"]
    assert seen["acts"].get("status", 0) == tally.injected["status"]
    assert seen["ids"] == seen["attempts"] == tally.requests
    # (one local backend: no failover; attempts_per_request_max is test_reliability_figures')
    assert seen["attempts_max"] == 1
    # The gateway's counters add up, and nothing is in flight.
    assert stats["activeRequests"] == 0, stats
    assert stats["totalRequests"] == seen["attempts"] + WARM_REQUESTS, stats
    # Each outcome counted as what it was: an abort, a failure (the injected faults), or not.
    assert stats["abortedCount"] == tally.aborts, stats
    assert stats["failureCount"] == sum(tally.injected.values()), stats
    assert stats["successCount"] == tally.ok + WARM_REQUESTS, stats
    # No leaked fds or upstream connections.
    assert result["after"] == result["baseline"], result["figures"]
    assert result["idle_upstream"] <= IDLE_PER_ADDRESS
    assert result["left_open"] == 0
    assert result["drift"] < RSS_DRIFT_LIMIT, result["figures"]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_soak_smoke(transport: str, short_tmp: Path, figures: Figures) -> None:
    result = await soak(short_tmp, transport, SMOKE["streams"], SMOKE["seconds"])
    figures.note(f"soak_smoke_{transport}", result["figures"])
    check(result)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SLUICE_SOAK") != "1",
                    reason="the full soak runs with scripts/soak (SLUICE_SOAK=1)")
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_soak(transport: str, short_tmp: Path, figures: Figures) -> None:
    size = soak_size()
    result = await soak(short_tmp, transport, size["streams"], size["seconds"], size["seed"],
                        size["gap"])
    numbers = result["figures"]
    figures.note(f"soak_{transport}", numbers)
    figures.note("streams_held", numbers["streams_held"])
    figures.note("rss_per_stream_kb", numbers["rss_per_stream_kb"])
    check(result)
