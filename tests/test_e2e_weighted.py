"""The weighted strategy end to end (SPEC §7.3, §13): a ``sluice serve`` gateway in front of
three real sluice gateways (each a process with its own local model server) as its nodes,
weighted 3:1:1. Fifty requests in a row are served exactly 30/10/10, spread out, as the
answers' ``x-sluice-served-by``, the nodes' own model servers and the routing stats all
say; a node taken out of routing and put back leaves the others' rotation whole; a weight
changed through the API applies to the next request."""

from __future__ import annotations

from collections import Counter

import attrs
import trio

from tests.client import CHAT
from tests.fakenode import chat_answer
from tests.fakeupstream import FakeUpstream
from tests.gateways import GatewayProcess, Launcher

NAMES = ("x", "y", "z")


@attrs.frozen
class Pool:
    front: GatewayProcess
    nodes: dict[str, GatewayProcess]  # name -> the node gateway
    models: dict[str, FakeUpstream]  # name -> that node's local model server

    def name_of(self, served_by: str | None) -> str:
        for name, gw in self.nodes.items():
            if served_by == f"node:{gw.fingerprint}":
                return name
        raise AssertionError(f"served by {served_by!r}, not one of the nodes")

    async def send(self, count: int) -> str:
        """``count`` chat completions in a row, each answered 200 by a node's own model
        server; the names of the nodes that served them, in order."""
        served = []
        for _ in range(count):
            reply = await self.front.chat("m")
            assert reply.status == 200, (reply.status, reply.body)
            name = self.name_of(reply.header("x-sluice-served-by"))
            assert reply.json()["choices"][0]["message"]["content"] == f"from {name}"
            served.append(name)
        return "".join(served)

    async def patch(self, name: str, **fields: object) -> None:
        path = f"/api/v1/nodes/{self.nodes[name].fingerprint}"
        reply = await self.front.call("PATCH", path, fields, admin=True)
        assert reply.status == 200, reply.body


async def weighted_pool(nursery: trio.Nursery, launch: Launcher,
                        weights: tuple[int, ...]) -> Pool:
    models = {}
    for name in NAMES:
        up = FakeUpstream(models=["m"])
        up.on("POST", CHAT, chat_answer(f"from {name}"))
        await nursery.start(up.serve)
        models[name] = up
    started = await launch.start_many(
        {name: {"lb": False, "backends": [(f"b{name}", models[name].url)]} for name in NAMES})
    nodes = dict(zip(NAMES, started, strict=True))
    front = await launch.start("front", strategy="weighted", nodes=[
        attrs.evolve(nodes[name].node(len(NAMES) - i), weight=weight)
        for i, (name, weight) in enumerate(zip(NAMES, weights, strict=True))])
    await front.wait_nodes({gw.fingerprint: ["m"] for gw in started})
    return Pool(front, nodes, models)


def cycles(served: str, size: int) -> list[Counter[str]]:
    return [Counter(served[i:i + size]) for i in range(0, len(served), size)]


async def test_weights_3_1_1_serve_exactly_30_10_10(nursery: trio.Nursery,
                                                    launch: Launcher) -> None:
    pool = await weighted_pool(nursery, launch, (3, 1, 1))
    status = await pool.front.distributed_status()
    assert status["strategy"] == "weighted"
    assert [e["weight"] for e in status["endpoints"]] == [3, 1, 1]
    served = await pool.send(50)
    assert Counter(served) == {"x": 30, "y": 10, "z": 10}
    assert cycles(served, 5) == [Counter({"x": 3, "y": 1, "z": 1})] * 10
    assert "xxx" not in served  # spread out: x y x z x, not x x x y z
    # Each node's own model server saw exactly its share; the front's stats agree.
    assert {n: len(up.requests_to(CHAT)) for n, up in pool.models.items()} == \
        {"x": 30, "y": 10, "z": 10}
    for name, gw in pool.nodes.items():
        assert (await pool.front.node_stats(gw.fingerprint))["successCount"] == \
            served.count(name)

    # z out of routing: x and y go on 3:1 in every cycle of 4; back in, 3:1:1 again.
    await pool.patch("z", enabled=False)
    alone = await pool.send(20)
    assert cycles(alone, 4) == [Counter({"x": 3, "y": 1})] * 5
    await pool.patch("z", enabled=True)
    back = await pool.send(25)
    assert cycles(back, 5) == [Counter({"x": 3, "y": 1, "z": 1})] * 5

    # A weight changed through the API applies to the very next request.
    await pool.patch("x", weight=1)
    await pool.patch("z", weight=3)
    changed = await pool.send(25)
    assert cycles(changed, 5) == [Counter({"x": 1, "y": 1, "z": 3})] * 5
    assert [e["weight"] for e in (await pool.front.distributed_status())["endpoints"]] == \
        [1, 1, 3]
