"""The attempts-per-request figure: three fake nodes behind a real gateway process, the
first two resetting every request (the other reliability figures, in process:
tests/test_reliability_figures.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import trio

from tests.client import chat_body
from tests.fakenode import FakeNode, reset_now
from tests.figures import Figures
from tests.gateways import Launcher, Node

FAILOVER_REQUESTS = 10


async def test_attempts_per_request(nursery: trio.Nursery, short_tmp: Path,
                                    figures: Figures) -> None:
    """Three nodes, the first two resetting every request: each request is tried at most
    twice (one failover), never on the third node; the figure is the fakes' request count
    per request, checked against the gateway's routing stats."""
    x, y, z = [await FakeNode(f"node-{n}", ["m"], answer=answer).start(nursery)
               for n, answer in (("x", reset_now()), ("y", reset_now()), ("z", None))]
    launcher = Launcher(short_tmp)
    try:
        gw = await launcher.start("g", failure_threshold=1000, nodes=[
            Node(n.fingerprint, n.url, p) for n, p in ((x, 3), (y, 2), (z, 1))])
        await gw.wait_nodes({n.fingerprint: ["m"] for n in (x, y, z)})
        for i in range(FAILOVER_REQUESTS):
            reply = await gw.chat("m", body=chat_body("m", tag=f"r{i}"))
            assert reply.status == 502, reply
        tries = Counter(json.loads(r.body)["tag"] for n in (x, y, z) for r in n.chats())
        assert z.chats() == []
        stats = await gw.routing_stats()
    finally:
        await launcher.aclose()
    figures.peak("attempts_per_request_max", max(tries.values()))
    assert sorted(tries) == sorted(f"r{i}" for i in range(FAILOVER_REQUESTS))
    assert set(tries.values()) == {2}
    assert stats["failovers"] == FAILOVER_REQUESTS

