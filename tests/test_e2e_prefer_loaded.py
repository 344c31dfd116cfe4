"""Loaded first, end to end (SPEC §11 "Nodes"): a real ``sluice serve`` process on 127.0.0.1
in front of three fake nodes (:mod:`tests.fakenode`) that list the same model, one as a
sluice gateway lists a managed model it has not loaded, one as a plain server (no ``sluice``
field: serving), one as loaded. With ``load_balancing.prefer_loaded`` (the default) requests
go to the nodes that have it loaded, in the strategy's order among them; switched off through
the settings API, by the plain strategy order; and the choice follows the states the next
health checks report."""

from __future__ import annotations

import trio

from tests.fakenode import FakeNode
from tests.gateways import GatewayProcess, Launcher, Node


async def served(gw: GatewayProcess, count: int) -> list[str | None]:
    out = []
    for _ in range(count):
        reply = await gw.chat("m")
        assert reply.status == 200, reply
        out.append(reply.header("x-sluice-served-by"))
    return out


async def wait_loaded_on(gw: GatewayProcess, fingerprints: list[str]) -> None:
    async def check() -> bool:
        pool = await gw.distributed_status()
        return [m["loadedOn"] for m in pool["models"] if m["id"] == "m"] == [fingerprints]

    await gw.wait_until(check, f"m loaded on {fingerprints}")


async def test_requests_go_to_the_nodes_that_have_the_model_loaded(
        nursery: trio.Nursery, launch: Launcher) -> None:
    x = await FakeNode("node-x", ["m"]).start(nursery)  # top priority, m not loaded
    y = await FakeNode("node-y", ["m"]).start(nursery)  # no sluice field: serving
    z = await FakeNode("node-z", ["m"]).start(nursery)  # m loaded
    x.states["m"] = "unloaded"
    z.states["m"] = "loaded"
    gw = await launch.start("g", nodes=[Node(n.fingerprint, n.url, 3 - i)
                                        for i, n in enumerate((x, y, z))])
    await gw.wait_nodes({n.fingerprint: ["m"] for n in (x, y, z)})
    pool = await gw.distributed_status()
    assert pool["models"] == [{"id": "m", "availableOn": ["node-x", "node-y", "node-z"],
                               "loadedOn": ["node-y", "node-z"]}]
    assert (await gw.get_json("/api/v1/settings/load-balancing"))["preferLoaded"] is True

    # priority among the loaded: y, every time; x (the top) is passed over
    assert await served(gw, 3) == ["node:node-y"] * 3
    # round-robin among the loaded: y and z in turn, never x
    await gw.set_load_balancing(strategy="round-robin")
    assert await served(gw, 4) == ["node:node-y", "node:node-z"] * 2
    assert x.chats() == []

    # Off: the plain strategy order, x included.
    assert (await gw.set_load_balancing(preferLoaded=False))["preferLoaded"] is False
    assert sorted(await served(gw, 3)) == ["node:node-x", "node:node-y", "node:node-z"]
    await gw.set_load_balancing(strategy="priority")
    assert await served(gw, 2) == ["node:node-x"] * 2

    # On again, and x has loaded m while z unloaded it: the next checks decide.
    x.states["m"] = "loaded"
    z.states["m"] = "unloading"
    await gw.set_load_balancing(preferLoaded=True)
    await wait_loaded_on(gw, ["node-x", "node-y"])
    assert await served(gw, 2) == ["node:node-x"] * 2
    # Only z has it loaded now: z before the two above it.
    x.states["m"] = "unloaded"
    y.states["m"] = "failed"
    z.states["m"] = "loaded"
    await wait_loaded_on(gw, ["node-z"])
    assert await served(gw, 2) == ["node:node-z"] * 2
    assert (len(x.chats()), len(y.chats()), len(z.chats())) == (5, 6, 5)
