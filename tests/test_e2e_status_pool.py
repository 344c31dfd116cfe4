"""``sluice status`` as a child process shows the node row (the pool's status in process:
tests/test_status_pool.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from proxy.routing.stats import routing_stats
from tests.client import chat_body, request
from tests.conftest import RunningGateway, StartGateway, admin
from tests.fakeupstream import FakeUpstream, ReceivedRequest, ResponseWriter, json_completion
from tests.waits import settled


async def sluice_status(gw: RunningGateway, *extra: str) -> str:
    done = await trio.run_process(
        [sys.executable, "-m", "proxy", "status", "--data-dir",
         str(gw.gateway.settings.data_dir), *extra],
        capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


async def get_json(gw: RunningGateway, path: str) -> Any:
    reply = await request(gw.unix, "GET", path)
    assert reply.status == 200, reply.body
    return reply.json()


async def admin_json(gw: RunningGateway, method: str, path: str, body: Any) -> Any:
    """The answer of an admin request that must succeed (200 or 201)."""
    reply = await admin(gw, method, path, body)
    assert reply.status in (200, 201), reply.body
    return reply.json()


async def test_status_shows_the_node_row(nursery: trio.Nursery,
                                         start_gateway: StartGateway) -> None:
    node = FakeUpstream(models=["remote-model"])

    async def identity(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, {"fingerprint": "node-gpu0001", "version": "0.1"})

    node.on("GET", "/api/v1/node/identity", identity)
    node.on("POST", "/v1/chat/completions", json_completion(model="remote-model"))
    await nursery.start(node.serve)
    gw = await start_gateway([])
    off = await sluice_status(gw)
    assert "load balancing: off (no nodes registered)" in off

    added = await admin_json(gw, "POST", "/api/v1/nodes", {"baseUrl": node.url, "name": "gpu-box"})
    assert added["fingerprint"] == "node-gpu0001"
    assert "load balancing: off (1 node registered)" in await sluice_status(gw)
    await admin_json(gw, "PUT", "/api/v1/settings/load-balancing", {"enabled": True})
    await gw.gateway.ctx.nodes.first_round(10)  # the switch wakes the health poll at once
    assert gw.gateway.ctx.nodes.online()

    text = await sluice_status(gw)
    lines = text.splitlines()
    assert "load balancing: on, strategy cache-aware, 1 of 1 nodes online, 1 remote model" in lines
    header = next(line for line in lines if line.startswith("PRIO NODE"))
    assert header.split() == ["PRIO", "NODE", "STATUS", "LATENCY", "MODELS", "CIRCUIT",
                              "IN-FLIGHT", "REQ", "OK", "FAIL", "AVG-TTFB"]
    [row] = [line.split() for line in lines if "gpu-box (node-gpu0001)" in line]
    assert row[:4] == [str(added["priority"]), "gpu-box", "(node-gpu0001)", "online"]
    assert row[4].endswith("ms")  # the health check's latency
    assert row[5] == "1"  # one model
    assert row[6:] == ["closed", "0", "0", "0", "0", "-"]  # no request yet
    assert any(line.split()[:2] == ["-", "local"] for line in lines)
    assert max(len(line) for line in lines) <= 100

    # A request forwarded to the node shows in its counters and in the totals.
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("remote-model"))
    assert reply.status == 200, reply.body
    assert reply.header("x-sluice-served-by") == "node:node-gpu0001"
    ctx = gw.gateway.ctx  # counted once the answer is relayed whole
    await settled(lambda: routing_stats(ctx.router, ctx.config)["totalSuccesses"] == 1,
                  "the forwarded request counted", 10)
    assert (await get_json(gw, "/api/v1/pool/routing-stats"))["totalSuccesses"] == 1
    lines = (await sluice_status(gw)).splitlines()
    [row] = [line.split() for line in lines if "gpu-box (node-gpu0001)" in line]
    assert row[6:11] == ["closed", "0", "1", "1", "0"]  # CIRCUIT IN-FLIGHT REQ OK FAIL
    assert row[11].endswith("ms")  # AVG-TTFB
    assert "totals: requests 1, successes 1, failures 0, aborted 0, failovers 0" in lines

    as_json = json.loads(await sluice_status(gw, "--json"))
    pool = as_json["pool"]
    assert [n["fingerprint"] for n in pool["nodes"]] == ["node-gpu0001"]
    assert pool["distributedStatus"]["endpoints"][0]["status"] == "online"
    assert pool["routingStats"]["nodes"][0]["successCount"] == 1

