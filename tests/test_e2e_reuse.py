"""Requests right after a streamed answer, against the real llama.cpp (issue 21).

llama.cpp closes its connection after every streamed answer while announcing keep-alive,
and its FIN can come after the next request was written. Each test sends, on one client
connection, requests that follow each other at once so that there are 150 of each
transition (stream -> whole, stream -> stream, whole -> stream; tests/cycles.py), through:
the managed demo model; a ``backends:`` entry for a llama.cpp server on loopback TCP and on
its Unix socket; and two gateways (a node in front of a node whose model server is
llama.cpp). Not one request may fail, and no breaker may strike.

100 a shape (``SLUICE_REUSE_CYCLES=300`` for the 300 the figures of docs/performance.md were
measured with): the code before the fix failed about 1 stream -> stream transition in 10,
so 100 without a failure leave it no chance (0.9^100 is 3 in 100,000, on each of the four
paths). Each request is one token of llama.cpp's, some 15 ms of CPU on this project's
machine: 100 rather than 150 is a third of this file's time.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from protocol.config import ModelConfig
from protocol.stream_reuse import PROBES_AT_ONCE, Verdict
from protocol.upstream_url import parse_upstream_url
from proxy.demo import DEMO_MODEL
from proxy.server import Gateway
from tests.conftest import (
    RunningGateway,
    StartGateway,
    free_port,
    gateway_config,
    node,
    open_settings,
)
from tests.cycles import SHAPES, CycleResult, run_transitions
from tests.figures import Figures
from tests.llama_server import llama_server as launch_llama
from tests.test_e2e_llama import gguf, managed_gateway  # noqa: F401 (a fixture)

pytest.importorskip("xllamacpp")

CYCLES = int(os.environ.get("SLUICE_REUSE_CYCLES", "100"))


async def all_shapes(address: str, figures: Figures, where: str) -> dict[str, CycleResult]:
    """CYCLES transitions of every shape on one client connection (3 x CYCLES + 1 requests)."""
    results = await run_transitions(address, CYCLES, DEMO_MODEL, max_tokens=1,
                                    time_limit=400)
    for result in results.values():
        figures.count(f"after_stream_requests_{where}", result.requests)
        figures.count(f"after_stream_failures_{where}", result.failed)
    for result in results.values():
        assert result.requests == CYCLES, str(result)
        assert result.failed == 0, str(result)
    return results


async def three_slot_gateway(nursery: trio.Nursery, folder: Path, gguf: Path  # noqa: F811
                             ) -> RunningGateway:
    return await managed_gateway(nursery, folder, ModelConfig(
        name=DEMO_MODEL, path=str(gguf), context=1024, parallel=3, threads=1, preload=True))


def verdict(gw: RunningGateway) -> Verdict:
    """What the gateway learned of its one local model server's connections."""
    return gw.gateway.connections.after_streams(gw.gateway.backends.backends[0].address)


async def test_the_managed_model(nursery: trio.Nursery, short_tmp: Path, gguf: Path,  # noqa: F811
                                 figures: Figures) -> None:
    gw = await three_slot_gateway(nursery, short_tmp, gguf)
    await all_shapes(gw.tcp, figures, "managed")
    assert verdict(gw) is Verdict.CLOSES
    assert gw.gateway.connections.probes <= PROBES_AT_ONCE


@pytest.fixture(params=["tcp", "unix"])
async def llama_server(request: pytest.FixtureRequest, short_tmp: Path,
                       gguf: Path) -> AsyncIterator[str]:  # noqa: F811
    """A llama.cpp server of our own (not managed by a gateway): its URL."""
    listen = (f"127.0.0.1:{free_port()}" if request.param == "tcp"
              else str(short_tmp / "llama.sock"))
    async with launch_llama(gguf, DEMO_MODEL, listen, "--context", "1024", "--parallel", "3",
                            "--threads", "1") as (url, _):
        yield url


async def test_a_backends_entry(llama_server: str, start_gateway: StartGateway,
                                figures: Figures) -> None:
    gw = await start_gateway([("llama", llama_server)])
    transport = "unix" if llama_server.startswith("unix:") else "tcp"
    await all_shapes(gw.unix, figures, f"backend_{transport}")
    assert verdict(gw) is Verdict.CLOSES


async def test_two_gateways(nursery: trio.Nursery, short_tmp: Path, gguf: Path,  # noqa: F811
                            figures: Figures) -> None:
    b = await three_slot_gateway(nursery, short_tmp / "b", gguf)
    cfg = gateway_config([], socket_dir=short_tmp / "a" / "s", lb=True, interval=1,
                         nodes=[node("node-b", f"http://{b.tcp}", 1)])
    a = RunningGateway(Gateway(open_settings(short_tmp / "a" / "data", cfg)))
    await nursery.start(a.gateway.run)
    with trio.fail_after(30):
        while DEMO_MODEL not in a.gateway.ctx.nodes.holders():
            await trio.sleep(0.05)
    await all_shapes(a.unix, figures, "two_gateways")
    stats = (await a_stats(a))["nodes"][0]
    assert stats["failureCount"] == 0
    assert stats["consecutiveFailures"] == 0
    assert stats["circuitState"] == "closed"
    assert stats["successCount"] == CYCLES * len(SHAPES) + 1
    assert (await a_stats(a))["failovers"] == 0
    assert verdict(b) is Verdict.CLOSES  # B learned llama.cpp closes
    b_address = parse_upstream_url(f"http://{b.tcp}")
    # A learned that B keeps its connections after streams.
    assert a.gateway.connections.after_streams(b_address) is Verdict.KEEPS


async def a_stats(gw: RunningGateway) -> dict:  # type: ignore[type-arg]
    from tests.client import request

    return (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()
