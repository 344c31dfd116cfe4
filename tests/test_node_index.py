"""The node health poll and distributed model index (SPEC §7.2, §7.5, §8): the load-balancing
switch, remote models in the unified list, online/offline/warming, disabled and removed
nodes, the node key, the ``distributed`` status shapes, and each remote model's state
(SPEC §11: ``loadedOn``).

Under the autojump clock every hop is a Unix socket, so nodes are put into the live config
directly (config validation wants http:// node URLs) and the index is woken by hand; the
switch through the settings API is tested in real time over TCP."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from proxy.registry.nodes import OFFLINE, ONLINE, NodeIndex, is_loaded
from tests.client import request
from tests.conftest import RunningGateway, StartGateway, configure, node
from tests.fakenode import start_node
from tests.fakeupstream import FakeUpstream

INTERVAL = 5.0  # the default timeouts.health_check.interval
STATUS = "/api/v1/inference/status"
POOL = "/api/v1/pool/distributed-status"


async def models(gw: RunningGateway, path: str = "/v1/models") -> list[tuple[str, str]]:
    reply = await request(gw.unix, "GET", path)
    assert reply.status == 200
    return [(m["id"], m["owned_by"]) for m in reply.json()["data"]]


async def get_json(gw: RunningGateway, path: str) -> Any:
    reply = await request(gw.unix, "GET", path)
    assert reply.status == 200, reply.body
    return reply.json()


def polls(up: FakeUpstream) -> int:
    return len(up.requests_to("/v1/models"))


async def test_remote_models_follow_the_switch(autojump_clock: trio.testing.MockClock,
                                               nursery: trio.Nursery, short_tmp: Any,
                                               start_gateway: StartGateway) -> None:
    local = FakeUpstream(models=["local-a", "shared"], unix_path=str(short_tmp / "l.sock"))
    await nursery.start(local.serve)
    gw = await start_gateway([("local", local.url)])
    hop = {"id": "hop-c", "object": "model", "owned_by": "remote"}
    up = await start_node(nursery, str(short_tmp / "n.sock"), ["shared", "remote-b"], [hop])
    gw.gateway.settings.secrets.node_keys["node-a"] = "node-key-a"
    configure(gw, (node("node-a", up.url, 1),))
    await trio.sleep(INTERVAL * 3 + 0.1)
    assert polls(up) == 0  # load balancing off: no traffic to the node at all
    assert await models(gw) == [("local-a", "llamacpp"), ("shared", "llamacpp")]
    assert "distributed" not in await get_json(gw, STATUS)
    assert (await request(gw.unix, "GET", "/v1/models/remote-b")).status == 404

    configure(gw, enabled=True)
    await trio.sleep(0.1)
    assert polls(up) == 1  # at once
    assert up.requests_to("/v1/models")[0].header("authorization") == "Bearer node-key-a"
    unified = [("local-a", "llamacpp"), ("shared", "llamacpp"), ("remote-b", "remote")]
    assert await models(gw) == unified  # local wins on "shared"; hop-c not indexed
    assert await models(gw, "/api/v1/inference/models") == unified
    one = await get_json(gw, "/v1/models/remote-b")
    assert (one["id"], one["owned_by"]) == ("remote-b", "remote")
    assert (await request(gw.unix, "GET", "/v1/models/hop-c")).status == 404
    assert (await get_json(gw, STATUS))["distributed"] == {
        "enabled": True, "strategy": "cache-aware", "totalNodes": 1, "onlineNodes": 1,
        "remoteModels": 2}
    await trio.sleep(INTERVAL)
    assert polls(up) == 2  # once per interval

    configure(gw, enabled=False)
    await trio.sleep(INTERVAL * 3)
    assert polls(up) == 2
    assert [m for m, _ in await models(gw)] == ["local-a", "shared"]
    pool = await get_json(gw, POOL)
    assert (pool["enabled"], pool["onlineNodes"], pool["models"]) == (False, 0, [])
    assert [e["status"] for e in pool["endpoints"]] == ["paused"]


async def test_warming_online_offline(autojump_clock: trio.testing.MockClock,
                                      nursery: trio.Nursery, short_tmp: Any,
                                      start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    up = await start_node(nursery, str(short_tmp / "n.sock"), ["big"])
    up.status = 503
    gone = str(short_tmp / "nobody.sock")
    configure(gw, (node("node-a", up.url, 2), node("node-x", f"unix:{gone}", 1)),
              enabled=True)
    await trio.sleep(0.1)

    def statuses(pool: dict[str, Any]) -> list[tuple[str, str]]:
        return [(e["fingerprint"], e["status"]) for e in pool["endpoints"]]

    pool = await get_json(gw, POOL)
    assert statuses(pool) == [("node-a", "warming"), ("node-x", "offline")]
    assert [e["lastError"] for e in pool["endpoints"]] == [
        "GET /v1/models answered 503 (loading)",
        f"cannot connect to unix:{gone}: ENOENT (No such file or directory)"]
    assert await models(gw) == []
    await trio.sleep(3)
    assert polls(up) == 4  # re-probed every second while warming
    up.status = 200
    await trio.sleep(1)
    assert polls(up) == 5
    pool = await get_json(gw, POOL)
    assert statuses(pool) == [("node-a", "online"), ("node-x", "offline")]
    assert pool["onlineNodes"] == 1
    assert await models(gw) == [("big", "remote")]
    await trio.sleep(0.8)
    assert polls(up) == 5  # online: back to the interval (next round at 5s)
    up.status = 500
    await trio.sleep(0.2)
    assert polls(up) == 6
    assert statuses(await get_json(gw, POOL))[0] == ("node-a", "offline")
    assert await models(gw) == []
    await trio.sleep(2)
    assert polls(up) == 6  # an offline node is not re-probed every second


async def test_pool_status_disabled_and_removed_nodes(autojump_clock: trio.testing.MockClock,
                                                      nursery: trio.Nursery, short_tmp: Any,
                                                      start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    a = await start_node(nursery, str(short_tmp / "a.sock"), ["m1", "m2"])
    b = await start_node(nursery, str(short_tmp / "b.sock"), ["m2", "m3"])
    c = await start_node(nursery, str(short_tmp / "c.sock"), ["m4"])
    nodes = (node("node-b", b.url, 1), node("node-c", c.url, 3, enabled=False),
             node("node-a", a.url, 2))
    configure(gw, nodes, enabled=True)
    await trio.sleep(0.1)
    pool = await get_json(gw, POOL)
    for endpoint in pool["endpoints"]:
        assert isinstance(endpoint.pop("latencyMs"), int)
    assert pool == {
        "enabled": True, "strategy": "cache-aware", "totalNodes": 2, "onlineNodes": 2,
        "models": [{"id": "m1", "availableOn": ["node-a"], "loadedOn": ["node-a"]},
                   {"id": "m2", "availableOn": ["node-a", "node-b"],
                    "loadedOn": ["node-a", "node-b"]},
                   {"id": "m3", "availableOn": ["node-b"], "loadedOn": ["node-b"]}],
        "endpoints": [
            {"fingerprint": "node-a", "baseUrl": a.url, "status": "online",
             "loadedModelCount": 2, "priority": 2, "weight": 1,
             "lastError": None},
            {"fingerprint": "node-b", "baseUrl": b.url, "status": "online",
             "loadedModelCount": 2, "priority": 1, "weight": 1,
             "lastError": None}]}
    assert (await get_json(gw, STATUS))["distributed"] == {
        "enabled": True, "strategy": "cache-aware", "totalNodes": 2, "onlineNodes": 2,
        "remoteModels": 3}
    assert [m for m, _ in await models(gw)] == ["m1", "m2", "m3"]
    configure(gw, (nodes[0], nodes[2]))  # node-c removed, node-b still there
    configure(gw, (attrs.evolve(nodes[0], enabled=False), nodes[2]))  # node-b disabled
    await trio.sleep(INTERVAL * 2 + 0.1)
    assert polls(c) == 0
    assert (polls(a), polls(b)) == (4, 1)  # a round at the wake, then each interval
    assert [m for m, _ in await models(gw)] == ["m1", "m2"]
    assert [e["fingerprint"] for e in (await get_json(gw, POOL))["endpoints"]] == ["node-a"]


async def test_switching_on_through_the_api(nursery: trio.Nursery,
                                            start_gateway: StartGateway) -> None:
    """Real time over TCP: the settings API's PUT wakes the poll at once."""
    up = FakeUpstream(models=["over-there"])
    await nursery.start(up.serve)
    gw = await start_gateway([])
    settings = gw.gateway.settings
    await settings.update(attrs.evolve(settings.config, nodes=(node("node-t", up.url, 1),)))
    admin = [("authorization", f"Bearer {settings.secrets.admin_token}")]

    async def put_lb(on: bool) -> None:
        body = json.dumps({"enabled": on}).encode()
        reply = await request(gw.unix, "PUT", "/api/v1/settings/load-balancing", body, admin)
        assert reply.status == 200

    await trio.testing.wait_all_tasks_blocked()  # the settings change asked no node
    assert polls(up) == 0
    await put_lb(True)
    await gw.gateway.ctx.nodes.first_round(2)  # the round the PUT started
    assert ("over-there", "remote") in await models(gw)
    assert polls(up) == 1
    await put_lb(False)
    assert await models(gw) == []
    assert "distributed" not in await get_json(gw, STATUS)


async def test_a_refused_check_says_what_to_fix(autojump_clock: trio.testing.MockClock,
                                               nursery: trio.Nursery, short_tmp: Any,
                                               start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    up = await start_node(nursery, str(short_tmp / "n.sock"), ["m"])
    up.status = 401
    configure(gw, (node("node-a", up.url, 1),), enabled=True)
    await trio.sleep(0.1)
    (entry,) = (await get_json(gw, POOL))["endpoints"]
    assert entry["status"] == "offline"
    assert entry["lastError"].startswith("GET /v1/models answered 401 (the node wants a key")
    up.status = 403
    await trio.sleep(INTERVAL)
    (entry,) = (await get_json(gw, POOL))["endpoints"]
    assert "api.allowed_hosts" in entry["lastError"]
    up.status = 200
    await trio.sleep(INTERVAL)
    (entry,) = (await get_json(gw, POOL))["endpoints"]
    assert (entry["status"], entry["lastError"]) == ("online", None)



# ------------------------------------------------------ remote models' states (SPEC §11)

@pytest.mark.parametrize(("extra", "loaded"), [
    pytest.param({}, True, id="no_sluice_field"),
    pytest.param({"sluice": {"state": "loaded"}}, True, id="loaded"),
    pytest.param({"sluice": {"state": "unloaded"}}, False, id="unloaded"),
    pytest.param({"sluice": {"state": "loading"}}, False, id="loading"),
    pytest.param({"sluice": {"state": "unloading"}}, False, id="unloading"),
    pytest.param({"sluice": {"state": "failed"}}, False, id="failed"),
    pytest.param({"sluice": {"state": "asleep"}}, False, id="a_state_we_do_not_know"),
    pytest.param({"sluice": {}}, True, id="no_state"),
    pytest.param({"sluice": {"state": 1}}, True, id="state_not_a_string"),
    pytest.param({"sluice": "loaded"}, True, id="sluice_not_an_object"),
])
def test_which_entries_are_loaded(extra: dict[str, Any], loaded: bool) -> None:
    assert is_loaded({"id": "m", "owned_by": "llamacpp", **extra}) is loaded


def entry(model: str, state: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": model, "object": "model", "owned_by": "llamacpp"}
    if state is not None:
        out["sluice"] = {"state": state}
    return out


def test_the_index_keeps_each_remote_models_state() -> None:
    index = NodeIndex()
    index.sync((node("node-a", "http://127.0.0.1:9", 2), node("node-b", "http://127.0.0.1:8", 1)))
    a, b = index.endpoints
    changed: list[Any] = []
    index.changes.subscribe(changed.append)
    index.checked(a, ONLINE, [entry("m1", "loaded"), entry("m2", "unloaded"), entry("plain")],
                  None, 1.0)
    index.checked(b, ONLINE, [entry("m2", "loaded"), entry("m1", "loading")], None, 1.0)
    assert a.models[1]["sluice"] == {"state": "unloaded"}  # kept as the node sent it
    assert (a.model_ids, a.loaded_ids) == ({"m1", "m2", "plain"}, {"m1", "plain"})
    assert (b.model_ids, b.loaded_ids) == ({"m1", "m2"}, {"m2"})
    assert index.holders() == {"m1": ["node-a", "node-b"], "m2": ["node-a", "node-b"],
                               "plain": ["node-a"]}
    assert index.loaded_on() == {"m1": ["node-a"], "m2": ["node-b"], "plain": ["node-a"]}
    assert changed == [a, b]
    # m2 loads on node-a: the next check says so, and the change is published.
    index.checked(a, ONLINE, [entry("m1", "loaded"), entry("m2", "loaded"), entry("plain")],
                  None, 1.0)
    assert a.loaded_ids == a.model_ids
    assert index.loaded_on()["m2"] == ["node-a", "node-b"]
    assert changed == [a, b, a]
    # An offline node serves nothing; a pause forgets it all.
    index.checked(b, OFFLINE, [], "refused", None)
    assert b.loaded_ids == frozenset()
    assert index.loaded_on() == {"m1": ["node-a"], "m2": ["node-a"], "plain": ["node-a"]}
    index.pause()
    assert (a.model_ids, a.loaded_ids, index.loaded_on()) == (frozenset(), frozenset(), {})


async def test_pool_status_says_where_each_model_is_loaded(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    a = await start_node(nursery, str(short_tmp / "a.sock"), ["m1", "m2", "plain"])
    b = await start_node(nursery, str(short_tmp / "b.sock"), ["m1", "m2"])
    a.states.update(m1="loaded", m2="unloaded")  # "plain": no sluice field, so serving
    b.states.update(m1="loading", m2="loaded")
    configure(gw, (node("node-a", a.url, 2), node("node-b", b.url, 1)), enabled=True)
    await trio.sleep(0.1)

    async def placement() -> dict[str, tuple[list[str], list[str]]]:
        pool = await get_json(gw, POOL)
        return {m["id"]: (m["availableOn"], m["loadedOn"]) for m in pool["models"]}

    assert await placement() == {
        "m1": (["node-a", "node-b"], ["node-a"]),
        "m2": (["node-a", "node-b"], ["node-b"]),
        "plain": (["node-a"], ["node-a"])}
    b.states["m1"] = "loaded"
    a.states["m1"] = "unloading"
    await trio.sleep(INTERVAL)
    assert (await placement())["m1"] == (["node-a", "node-b"], ["node-b"])
    b.states["m1"] = "failed"
    await trio.sleep(INTERVAL)
    assert (await placement())["m1"] == (["node-a", "node-b"], [])
    configure(gw, enabled=False)
    await trio.sleep(0.1)
    assert (await get_json(gw, POOL))["models"] == []
