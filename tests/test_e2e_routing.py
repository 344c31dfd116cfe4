"""Distributed routing end to end (SPEC §7, §8; the seed's fallback table): real ``sluice
serve`` processes on 127.0.0.1 acting as gateways and nodes, plus fault-injecting fake nodes
(:mod:`tests.fakenode`) that count what reaches them.

The seed's "폴백 동작" table, one test per row:

====================================================  ==========================================
load balancing off                                    test_row1_lb_off_serves_local_only
load balancing on, model local                        test_row2_lb_on_model_local
load balancing on, model on a node                    test_row3_lb_on_model_on_a_node[...]
load balancing on, model nowhere                      test_row4_lb_on_model_nowhere
node unreachable, failover on                         test_row5_unreachable_fails_over[...]
node unreachable, failover off                        test_row6_unreachable_without_failover[...]
node circuit open                                     test_row7_open_circuit_is_skipped
====================================================  ==========================================

Beyond the table: local first, the load-balancing switch flipped live, each strategy
across two or three nodes, the half-open probe (exactly one of ten concurrent requests),
failover before the first chunk and none after it, the node key replacing the client's
Authorization, x-sluice-forwarded, the routing-stats counters, the loop guard between two
real gateways that list each other, and the openai SDK through a chain of two gateways.

Every test waits for conditions (node online with its models, a circuit half-open, a held
request arrived) with bounded polling; none sleeps to synchronise. Each test starts its own
gateways (about 0.3 s each); the loop-guard and SDK-chain tests share one module-scoped pair
of gateways that list each other as nodes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import openai
import pytest
import trio

from tests.client import Client, Reply, assert_refused, chat_body, error_of, read_events
from tests.fakenode import (
    CHAT,
    FakeNode,
    Hold,
    ThreadedUpstream,
    chat_answer,
    close_now,
    delayed,
    finish_stream,
    in_turn,
    reset_now,
    stream_events,
)
from tests.fakeupstream import FakeUpstream, close_mid_stream, status
from tests.gateways import GatewayProcess, Launcher, Node


async def local_backend(nursery: trio.Nursery, models: list[str],
                        text: str = "from local") -> FakeUpstream:
    up = FakeUpstream(models=models)
    up.on("POST", CHAT, chat_answer(text))
    await nursery.start(up.serve)
    return up


def served_by(reply: Reply) -> str | None:
    return reply.header("x-sluice-served-by")


def content(reply: Reply) -> str:
    text: str = reply.json()["choices"][0]["message"]["content"]
    return text


def totals_add_up(stats: dict[str, Any]) -> None:
    """The invariants of a routing-stats body: per entry and nodes + local."""
    entries = [*stats["nodes"], stats["local"]]
    for e in entries:
        assert e["totalRequests"] == (e["successCount"] + e["failureCount"]
                                      + e["abortedCount"] + e["activeRequests"]), e
    for total, field in (("totalRequests", "totalRequests"), ("totalSuccesses", "successCount"),
                         ("totalFailures", "failureCount"), ("totalAborted", "abortedCount")):
        assert stats[total] == sum(e[field] for e in entries), (total, stats)


async def settled_stats(gw: GatewayProcess) -> dict[str, Any]:
    """The routing stats once nothing is in flight any more (an attempt is settled just
    after its last byte went out), checked for the invariants."""
    stats: dict[str, Any] = {}

    async def idle() -> bool:
        nonlocal stats
        stats = await gw.routing_stats()
        return all(e["activeRequests"] == 0 for e in [*stats["nodes"], stats["local"]])

    await gw.wait_until(idle, "no request in flight")
    totals_add_up(stats)
    return stats


async def settled_node(gw: GatewayProcess, fingerprint: str) -> dict[str, Any]:
    for entry in (await settled_stats(gw))["nodes"]:
        if entry["fingerprint"] == fingerprint:
            return dict(entry)
    raise AssertionError(f"{fingerprint} is not in the routing stats")


def counts(entry: dict[str, Any]) -> tuple[int, int, int, int, int]:
    return (entry["totalRequests"], entry["successCount"], entry["failureCount"],
            entry["abortedCount"], entry["activeRequests"])


# ----------------------------------------------------------------- the fallback table


async def test_row1_lb_off_serves_local_only(nursery: trio.Nursery, launch: Launcher) -> None:
    local = await local_backend(nursery, ["local-m"])
    x = await FakeNode("node-x", ["remote-m", "local-m"]).start(nursery)
    gw = await launch.start("g", backends=[("lb", local.url)], lb=False,
                            nodes=[Node(x.fingerprint, x.url, 1)])
    assert await gw.model_ids() == [("local-m", "llamacpp")]
    reply = await gw.chat("local-m")
    assert (reply.status, served_by(reply), content(reply)) == (200, "local:lb", "from local")
    for model in ("remote-m", "not-running"):
        assert_refused(await gw.chat(model), "model_not_available")
    pool = await gw.distributed_status()
    assert (pool["enabled"], [e["status"] for e in pool["endpoints"]]) == (False, ["paused"])
    assert x.requests == []  # not even a health check: polling is paused
    stats = await settled_stats(gw)
    assert counts(stats["nodes"][0]) == (0, 0, 0, 0, 0)
    assert counts(stats["local"]) == (1, 1, 0, 0, 0)


async def test_row2_lb_on_model_local(nursery: trio.Nursery, launch: Launcher) -> None:
    local = await local_backend(nursery, ["local-m"])
    x = await FakeNode("node-x", ["remote-m"]).start(nursery)
    gw = await launch.start("g", backends=[("lb", local.url)],
                            nodes=[Node(x.fingerprint, x.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["remote-m"]})
    for stream in (False, True):
        reply = await gw.chat("local-m", stream=stream)
        assert (reply.status, served_by(reply)) == (200, "local:lb")
    assert reply.body == b"".join(stream_events("from local"))
    assert x.chats() == []
    stats = await settled_stats(gw)
    assert (counts(stats["local"]), stats["nodes"][0]["totalRequests"]) == ((2, 2, 0, 0, 0), 0)


async def test_local_first_when_a_node_also_holds_the_model(nursery: trio.Nursery,
                                                            launch: Launcher) -> None:
    local = await local_backend(nursery, ["shared"])
    x = await FakeNode("node-x", ["shared", "remote-m"]).start(nursery)
    gw = await launch.start("g", backends=[("lb", local.url)],
                            nodes=[Node(x.fingerprint, x.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["shared", "remote-m"]})
    assert await gw.model_ids() == [("shared", "llamacpp"), ("remote-m", "remote")]
    for _ in range(3):
        reply = await gw.chat("shared")
        assert (reply.status, served_by(reply), content(reply)) == (200, "local:lb",
                                                                     "from local")
    assert x.chats() == []
    reply = await gw.chat("remote-m")  # the node itself works: it is simply not chosen
    assert (reply.status, served_by(reply)) == (200, "node:node-x")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_row3_lb_on_model_on_a_node(nursery: trio.Nursery, launch: Launcher,
                                          stream: bool) -> None:
    x = await FakeNode("node-x", ["remote-m"]).start(nursery)
    gw = await launch.start("g", nodes=[Node(x.fingerprint, x.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["remote-m"]})
    # Odd spacing and key order: the body must reach the node byte for byte.
    body = (b'{"messages":[{"role":"user","content":"hi"}],   "model" : "remote-m",'
            b' "stream": ' + (b"true" if stream else b"false") + b', "seed": 7}')
    reply = await gw.chat("remote-m", body=body)
    assert (reply.status, served_by(reply)) == (200, "node:node-x")
    if stream:
        assert reply.body == b"".join(stream_events("from node-x"))
        assert reply.header("content-type") == "text/event-stream"
    else:
        assert content(reply) == "from node-x"
    [seen] = x.chats()
    assert seen.body == body
    stats = await settled_node(gw, x.fingerprint)
    assert counts(stats) == (1, 1, 0, 0, 0)
    assert stats["avgLatencyMs"] is not None


async def test_row4_lb_on_model_nowhere(nursery: trio.Nursery, launch: Launcher) -> None:
    x = await FakeNode("node-x", ["remote-m"]).start(nursery)
    gw = await launch.start("g", nodes=[Node(x.fingerprint, x.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["remote-m"]})
    for stream in (False, True):
        assert_refused(await gw.chat("nowhere-m", stream=stream), "model_not_available")
    assert x.chats() == []
    stats = await settled_stats(gw)
    assert (stats["totalRequests"], stats["failovers"]) == (0, 0)


async def break_node(node: FakeNode, fault: str) -> None:
    """Make a node that is online in the index fail its next request."""
    if fault == "refused":
        await node.stop()  # the port refuses; the index (long interval) still says online
    elif fault == "reset":
        node.answer(reset_now())
    elif fault == "500":
        node.answer(status(500))
    elif fault == "head_then_close":
        node.answer(close_mid_stream(0))  # a 200 SSE head, then FIN before any body byte
    else:  # pragma: no cover
        raise ValueError(fault)


FAULTS = ["refused", "reset"]


async def two_nodes(nursery: trio.Nursery, launch: Launcher,
                    **config: Any) -> tuple[GatewayProcess, FakeNode, FakeNode]:
    """A gateway with node-x (top) and node-y both holding model ``m``. The health-check
    interval is long: the index keeps what its first round found while a test breaks a
    node (a stopped node stays a candidate, as in the moment before the next check). The
    table's rows are about the priority order, so the strategy is ``priority``: under the
    default ``cache-aware`` a repeated conversation would stay on the node that answered it
    (SPEC §15), and whether the next request saw that depends on timing."""
    x = await FakeNode("node-x", ["m"]).start(nursery)
    y = await FakeNode("node-y", ["m"]).start(nursery)
    config = {"interval": 60.0, "hc_timeout": 5.0, "strategy": "priority", **config}
    gw = await launch.start("g", nodes=[Node(x.fingerprint, x.url, 2),
                                        Node(y.fingerprint, y.url, 1)], **config)
    await gw.wait_nodes({x.fingerprint: ["m"], y.fingerprint: ["m"]})
    return gw, x, y


@pytest.mark.parametrize("fault", FAULTS)
async def test_row5_unreachable_fails_over(nursery: trio.Nursery, launch: Launcher,
                                           fault: str) -> None:
    gw, x, y = await two_nodes(nursery, launch)
    await break_node(x, fault)
    body = chat_body("m", temperature=0.25)
    reply = await gw.chat("m", body=body)
    assert (reply.status, served_by(reply), content(reply)) == (200, "node:node-y",
                                                                 "from node-y")
    assert [r.body for r in y.chats()] == [body]  # the same body bytes, once
    if fault == "reset":  # how often x itself got it: test_a_resetting_node_gets_it_once
        assert {r.body for r in x.chats()} == {body}
    stats = await settled_stats(gw)
    assert [counts(n) for n in stats["nodes"]] == [(1, 0, 1, 0, 0), (1, 1, 0, 0, 0)]
    assert stats["failovers"] == 1
    totals_add_up(stats)


async def test_failover_is_tried_only_once(nursery: trio.Nursery, launch: Launcher) -> None:
    x = await FakeNode("node-x", ["m"], answer=reset_now()).start(nursery)
    y = await FakeNode("node-y", ["m"], answer=reset_now()).start(nursery)
    z = await FakeNode("node-z", ["m"]).start(nursery)
    gw = await launch.start("g", strategy="priority", nodes=[
        Node(n.fingerprint, n.url, p) for n, p in ((x, 3), (y, 2), (z, 1))])
    await gw.wait_nodes({n.fingerprint: ["m"] for n in (x, y, z)})
    reply = await gw.chat("m")
    assert reply.status == 502, reply
    assert error_of(reply)["type"] == "server_error"
    assert z.chats() == []  # no third try
    assert x.chats()
    assert y.chats()  # (each got it once: see test_a_resetting_node_gets_it_once)
    stats = await settled_stats(gw)
    assert [n["failureCount"] for n in stats["nodes"]] == [1, 1, 0]
    assert stats["failovers"] == 1


@pytest.mark.parametrize("fault", FAULTS)
async def test_row6_unreachable_without_failover(nursery: trio.Nursery, launch: Launcher,
                                                 fault: str) -> None:
    gw, x, y = await two_nodes(nursery, launch, failover=False)
    await break_node(x, fault)
    reply = await gw.chat("m")
    assert reply.status == 502, reply
    assert (error_of(reply)["type"], error_of(reply)["code"]) == ("server_error",
                                                                  "upstream_connection_error")
    assert y.chats() == []
    stats = await settled_stats(gw)
    assert [counts(n) for n in stats["nodes"]] == [(1, 0, 1, 0, 0), (0, 0, 0, 0, 0)]
    assert stats["failovers"] == 0


async def test_node_5xx_without_failover_is_relayed_as_sent(nursery: trio.Nursery,
                                                            launch: Launcher) -> None:
    gw, x, y = await two_nodes(nursery, launch, failover=False)
    sent = {"error": {"code": 500, "message": "node-x broke", "type": "server_error"}}
    x.answer(status(500, sent))
    reply = await gw.chat("m")
    assert (reply.status, reply.json(), served_by(reply)) == (500, sent, "node:node-x")
    assert y.chats() == []


async def test_row7_open_circuit_is_skipped(nursery: trio.Nursery, launch: Launcher) -> None:
    gw, x, y = await two_nodes(nursery, launch, failure_threshold=2)
    x.answer(status(500))
    for _ in range(4):
        reply = await gw.chat("m")
        assert (reply.status, served_by(reply), content(reply)) == (200, "node:node-y",
                                                                     "from node-y")
    assert (len(x.chats()), len(y.chats())) == (2, 4)  # x was skipped once open
    stats = await settled_stats(gw)
    nx, ny = stats["nodes"]
    assert (nx["circuitState"], nx["circuitOpen"], nx["consecutiveFailures"]) == ("open", True, 2)
    assert (counts(nx), counts(ny)) == ((2, 0, 2, 0, 0), (4, 4, 0, 0, 0))
    assert (ny["circuitState"], stats["failovers"]) == ("closed", 2)


# ------------------------------------------------------------------------- failover


@pytest.mark.parametrize("fault", ["reset", "500", "head_then_close"])
async def test_stream_fails_over_before_the_first_chunk(nursery: trio.Nursery,
                                                        launch: Launcher, fault: str) -> None:
    gw, x, y = await two_nodes(nursery, launch)
    await break_node(x, fault)
    reply = await gw.chat("m", stream=True)
    assert (reply.status, served_by(reply), reply.complete) == (200, "node:node-y", True)
    assert reply.body == b"".join(stream_events("from node-y"))
    assert len(y.chats()) == 1
    assert x.chats()  # (once: see test_a_resetting_node_gets_it_once)
    stats = await settled_stats(gw)
    assert [counts(n) for n in stats["nodes"]] == [(1, 0, 1, 0, 0), (1, 1, 0, 0, 0)]
    assert stats["failovers"] == 1


@pytest.mark.parametrize("cut", ["reset", "close"])
async def test_stream_cut_after_the_first_chunk_is_not_failed_over(
        nursery: trio.Nursery, launch: Launcher, cut: str) -> None:
    gw, x, y = await two_nodes(nursery, launch)
    first = stream_events("from node-x")[0]
    hold = Hold(reset_now() if cut == "reset" else close_now(), first_event=first)
    x.answer(hold)
    client = await Client.open(gw.address)
    try:
        await client.send_request("POST", CHAT, chat_body("m", stream=True))
        head = await client.read_head()
        got = await read_events(client, 1)  # the first chunk reached the client
        hold.release()  # now the node cuts the stream
        with trio.fail_after(10):
            rest = await client.read_reply(head)
    finally:
        await client.aclose()
    assert (head.status_code, dict(head.headers)[b"x-sluice-served-by"]) == (200, b"node:node-x")
    assert got == first
    assert not rest.complete  # closed without the final chunk
    events = [e for e in rest.body.split(b"\n\n") if e.strip()]
    assert len(events) == 1, rest.body  # one error event, nothing after it
    assert events[0].startswith(b"data: "), rest.body
    assert set(json.loads(events[0][len(b"data: "):])) == {"error"}
    assert y.chats() == []
    stats = await settled_stats(gw)
    assert [counts(n) for n in stats["nodes"]] == [(1, 0, 1, 0, 0), (0, 0, 0, 0, 0)]
    assert stats["failovers"] == 0


# --------------------------------------------------------------------- circuit breaker


@pytest.mark.slow  # waits reset_timeout (1 s) in real time
@pytest.mark.parametrize("probe", ["succeeds", "fails"])
async def test_half_open_admits_exactly_one_probe(nursery: trio.Nursery, launch: Launcher,
                                                  probe: str) -> None:
    x = await FakeNode("node-x", ["m"], answer=status(500)).start(nursery)
    gw = await launch.start("g", nodes=[Node(x.fingerprint, x.url, 1)], failure_threshold=2,
                            reset_timeout=1.0)
    await gw.wait_nodes({x.fingerprint: ["m"]})
    for _ in range(2):
        assert (await gw.chat("m")).status == 500  # no alternate: the node's own answer
    state = await settled_node(gw, x.fingerprint)
    assert (state["circuitState"], state["circuitOpen"], state["consecutiveFailures"],
            state["failureCount"]) == ("open", True, 2, 2)
    assert_refused(await gw.chat("m"), "all_circuits_open")
    assert len(x.chats()) == 2  # skipped while open

    hold = Hold(chat_answer("probe answer") if probe == "succeeds" else status(500))
    x.answer(hold)

    async def half_open() -> bool:
        return bool((await gw.node_stats(x.fingerprint))["circuitState"] == "half_open")

    await gw.wait_until(half_open, "half-open after reset_timeout")
    replies: list[Reply] = []

    async def one() -> None:
        replies.append(await gw.chat("m"))

    async with trio.open_nursery() as inner:
        for _ in range(10):
            inner.start_soon(one)
        with trio.fail_after(10):
            await hold.wait_arrived(1)
            while len(replies) < 9:
                await trio.sleep(0.01)
        assert len(x.chats()) == 3  # exactly one of the ten reached the node
        for reply in replies:
            assert_refused(reply, "all_circuits_open")
        state = await gw.node_stats(x.fingerprint)
        assert (state["circuitState"], state["activeRequests"]) == ("half_open", 1)
        hold.release()
    probe_reply = replies[9]
    if probe == "succeeds":
        assert (probe_reply.status, content(probe_reply)) == (200, "probe answer")
        state = await settled_node(gw, x.fingerprint)
        assert (state["circuitState"], state["circuitOpen"],
                state["consecutiveFailures"]) == ("closed", False, 0)
        x.answer(chat_answer("closed again"))
        reply = await gw.chat("m")
        assert (reply.status, content(reply)) == (200, "closed again")
        assert len(x.chats()) == 4
    else:
        assert probe_reply.status == 500
        state = await settled_node(gw, x.fingerprint)
        assert (state["circuitState"], state["circuitOpen"]) == ("open", True)
        assert_refused(await gw.chat("m"), "all_circuits_open")
        assert len(x.chats()) == 3


# -------------------------------------------------------------------------- strategies


async def three_nodes(nursery: trio.Nursery, launch: Launcher,
                      strategy: str) -> tuple[GatewayProcess, list[FakeNode]]:
    nodes = [await FakeNode(fp, ["m"]).start(nursery) for fp in ("node-x", "node-y", "node-z")]
    gw = await launch.start("g", strategy=strategy, nodes=[
        Node(n.fingerprint, n.url, 3 - i) for i, n in enumerate(nodes)])
    await gw.wait_nodes({n.fingerprint: ["m"] for n in nodes})
    return gw, nodes


async def served_sequence(gw: GatewayProcess, count: int,
                          model: str = "m") -> list[str | None]:
    """x-sluice-served-by of ``count`` requests in a row, each answered 200."""
    out = []
    for _ in range(count):
        reply = await gw.chat(model)
        assert reply.status == 200, reply
        out.append(served_by(reply))
    return out


async def test_priority_strategy(nursery: trio.Nursery, launch: Launcher) -> None:
    gw, (x, y, z) = await three_nodes(nursery, launch, "priority")
    assert await served_sequence(gw, 5) == ["node:node-x"] * 5
    assert (len(x.chats()), len(y.chats()), len(z.chats())) == (5, 0, 0)
    # A new order (the user's drag and drop) applies live.
    polls = [len(n.requests_to("/v1/models")) for n in (x, y, z)]
    order = {"order": [z.fingerprint, x.fingerprint, y.fingerprint]}
    assert (await gw.call("PUT", "/api/v1/nodes/order", order, admin=True)).status == 200

    async def resynced() -> bool:  # the index follows a change before its next round
        return all(len(n.requests_to("/v1/models")) > p for n, p in zip((x, y, z), polls,
                                                                         strict=True))

    await gw.wait_until(resynced, "a health-check round after the new order")
    assert await served_sequence(gw, 3) == ["node:node-z"] * 3


async def test_round_robin_strategy(nursery: trio.Nursery, launch: Launcher) -> None:
    gw, nodes = await three_nodes(nursery, launch, "round-robin")
    assert await served_sequence(gw, 6) == ["node:node-x", "node:node-y", "node:node-z"] * 2
    assert [len(n.chats()) for n in nodes] == [2, 2, 2]


async def test_least_loaded_strategy(nursery: trio.Nursery, launch: Launcher) -> None:
    x = await FakeNode("node-x", ["m"]).start(nursery)
    y = await FakeNode("node-y", ["m"]).start(nursery)
    gw = await launch.start("g", strategy="least-loaded", nodes=[
        Node(x.fingerprint, x.url, 2), Node(y.fingerprint, y.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["m"], y.fingerprint: ["m"]})
    first = stream_events("from node-x")[0]
    hold = Hold(finish_stream(), first_event=first)
    x.answer(hold)
    busy = await Client.open(gw.address)
    try:
        await busy.send_request("POST", CHAT, chat_body("m", stream=True))
        head = await busy.read_head()
        assert dict(head.headers)[b"x-sluice-served-by"] == b"node:node-x"  # tie: priority
        assert await read_events(busy, 1) == first  # a stream in progress on node-x
        assert (await gw.node_stats(x.fingerprint))["activeRequests"] == 1
        assert await served_sequence(gw, 2) == ["node:node-y"] * 2
        hold.release()
        with trio.fail_after(10):
            rest = await busy.read_reply(head)
        assert rest.complete
    finally:
        await busy.aclose()
    x.answer(chat_answer("from node-x"))
    await settled_stats(gw)  # the stream's attempt is over
    assert await served_sequence(gw, 1) == ["node:node-x"]  # idle again: a tie


async def test_fastest_strategy(nursery: trio.Nursery, launch: Launcher) -> None:
    slow_by = 0.4
    x = await FakeNode("node-x", ["m"], models_delay=slow_by,
                       answer=delayed(slow_by, chat_answer("from node-x"))).start(nursery)
    y = await FakeNode("node-y", ["m"]).start(nursery)
    gw = await launch.start("g", strategy="fastest", interval=2.0, hc_timeout=1.5, nodes=[
        Node(x.fingerprint, x.url, 2), Node(y.fingerprint, y.url, 1)])  # slow x on top
    await gw.wait_nodes({x.fingerprint: ["m"], y.fingerprint: ["m"]})
    latency = {e["fingerprint"]: e["latencyMs"]
               for e in (await gw.distributed_status())["endpoints"]}
    assert latency[x.fingerprint] >= slow_by * 1000 > latency[y.fingerprint], latency
    assert await served_sequence(gw, 4) == ["node:node-y"] * 4
    assert x.chats() == []


# --------------------------------------------------------------------- live switching


async def test_load_balancing_switched_live(nursery: trio.Nursery, launch: Launcher) -> None:
    local = await local_backend(nursery, ["local-m"])
    x = await FakeNode("node-x", ["remote-m"]).start(nursery)
    gw = await launch.start("g", backends=[("lb", local.url)],
                            nodes=[Node(x.fingerprint, x.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["remote-m"]})
    assert await gw.model_ids() == [("local-m", "llamacpp"), ("remote-m", "remote")]
    assert served_by(await gw.chat("remote-m")) == "node:node-x"

    assert (await gw.set_load_balancing(enabled=False))["enabled"] is False
    assert await gw.model_ids() == [("local-m", "llamacpp")]
    assert_refused(await gw.chat("remote-m"), "model_not_available")
    assert served_by(await gw.chat("local-m")) == "local:lb"
    assert len(x.chats()) == 1

    assert (await gw.set_load_balancing(enabled=True))["enabled"] is True

    async def listed() -> bool:
        return ("remote-m", "remote") in await gw.model_ids()

    await gw.wait_until(listed, "remote-m listed again")
    reply = await gw.chat("remote-m")
    assert (reply.status, served_by(reply)) == (200, "node:node-x")
    assert len(x.chats()) == 2
    assert gw.proc is not None
    assert gw.proc.poll() is None  # the same process all along


# ---------------------------------------------------------------- keys and loop guard


@pytest.mark.parametrize("client_auth", ["loopback", "access_key"])
async def test_node_key_replaces_the_client_authorization(nursery: trio.Nursery,
                                                          launch: Launcher,
                                                          client_auth: str) -> None:
    x = await FakeNode("node-x", ["mx"]).start(nursery)
    y = await FakeNode("node-y", ["my"]).start(nursery)
    gw = await launch.start("g", require_auth=client_auth == "access_key", nodes=[
        Node(x.fingerprint, x.url, 2, key="nk-x-0123456789"), Node(y.fingerprint, y.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["mx"], y.fingerprint: ["my"]})
    if client_auth == "access_key":
        made = await gw.call("POST", "/api/v1/access-keys", {"name": "client"}, admin=True)
        assert made.status in (200, 201), made
        secret = made.json()["key"]
        assert (await gw.chat("mx")).status == 401  # the key is really required
    else:
        secret = "sk-client-own-0123456789"  # loopback needs no key: it is just passed along
    auth = [("authorization", f"Bearer {secret}")]
    for model, fp in (("mx", "node-x"), ("my", "node-y")):
        for stream in (False, True):
            reply = await gw.chat(model, stream=stream, headers=auth)
            assert (reply.status, served_by(reply)) == (200, f"node:{fp}")
    identity = await gw.get_json("/api/v1/node/identity")
    assert identity["fingerprint"] == gw.fingerprint
    for fake, key in ((x, "Bearer nk-x-0123456789"), (y, None)):
        assert len(fake.chats()) == 2
        for seen in fake.chats():
            assert seen.header("authorization") == key
            assert seen.header("x-sluice-forwarded") == gw.fingerprint
        for poll in fake.requests_to("/v1/models"):
            assert poll.header("authorization") == key
        for seen in fake.requests:
            assert not any(secret.encode() in value for _, value in seen.headers)
            assert secret.encode() not in seen.body


async def test_routing_stats_add_up(nursery: trio.Nursery, launch: Launcher) -> None:
    local = await local_backend(nursery, ["local-m"])
    x = await FakeNode("node-x", ["m"], answer=in_turn(status(500), chat_answer("x"))).start(
        nursery)
    y = await FakeNode("node-y", ["m", "only-y"]).start(nursery)
    gw = await launch.start("g", backends=[("lb", local.url)], nodes=[
        Node(x.fingerprint, x.url, 2), Node(y.fingerprint, y.url, 1)])
    await gw.wait_nodes({x.fingerprint: ["m"], y.fingerprint: ["m", "only-y"]})
    assert served_by(await gw.chat("m")) == "node:node-y"  # x: 500, failed over to y
    assert await served_sequence(gw, 3, "only-y") == ["node:node-y"] * 3
    assert await served_sequence(gw, 2, "local-m") == ["local:lb"] * 2
    # A client that leaves while y holds its stream: aborted, not failed.
    hold = Hold(finish_stream(), first_event=stream_events("y")[0])
    y.answer(hold)
    leaving = await Client.open(gw.address)
    await leaving.send_request("POST", CHAT, chat_body("only-y", stream=True))
    with trio.fail_after(10):
        await hold.wait_arrived(1)
    await leaving.aclose()

    async def aborted() -> bool:
        return bool((await gw.node_stats(y.fingerprint))["abortedCount"] == 1)

    await gw.wait_until(aborted, "the abandoned request counted as aborted")
    stats = await settled_stats(gw)
    nx, ny = stats["nodes"]
    assert (nx["fingerprint"], ny["fingerprint"]) == ("node-x", "node-y")  # top first
    assert (nx["name"], nx["enabled"]) == ("node-x", True)
    assert counts(nx) == (1, 0, 1, 0, 0)
    assert counts(ny) == (5, 4, 0, 1, 0)
    assert counts(stats["local"]) == (2, 2, 0, 0, 0)
    assert (nx["circuitState"], nx["circuitOpen"], nx["consecutiveFailures"]) == (
        "closed", False, 1)
    for entry in (nx, ny, stats["local"]):
        assert isinstance(entry["avgLatencyMs"], int | float), entry
    assert (stats["totalRequests"], stats["totalSuccesses"], stats["totalFailures"],
            stats["totalAborted"], stats["failovers"]) == (8, 6, 1, 1, 1)
    assert stats["circuitBreaker"] == {"failureThreshold": 3, "resetTimeoutSecs": 60}
    totals_add_up(stats)
    assert await gw.get_json("/api/v1/nodes/routing-stats") == stats
    assert await gw.get_json("/admin/stats", admin=True) == stats
    assert (await gw.call("GET", "/admin/stats")).status == 401
    wrong = [("authorization", "Bearer not-the-admin-token")]
    assert (await gw.call("GET", "/admin/stats", headers=wrong)).status == 403


# ------------------------------------------- a pair of real gateways, nodes of each other


@attrs.frozen
class Pair:
    a: GatewayProcess  # no local model; node: b (with b's access key as its node key)
    b: GatewayProcess  # local backend "bb" with b-model, require_auth; node: a
    backend: FakeUpstream
    node_key: str

    async def ready(self) -> None:
        await self.a.wait_nodes({self.b.fingerprint: ["b-model"]})
        await self.b.wait_nodes({self.a.fingerprint: []})


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """Gateway a lists b as a node and b lists a (added through b's POST /api/v1/nodes).
    b requires an access key on TCP; a sends it as b's node key. b's backend is a fake in
    its own thread, so the pair outlives each test's trio loop."""
    root = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    fake = FakeUpstream(models=["b-model"])
    fake.on("POST", CHAT, chat_answer("from b-backend"))
    backend = ThreadedUpstream(fake)
    launcher = Launcher(root)
    try:
        backend.start()
        b = launcher.start_sync("b", backends=[("bb", fake.url)], require_auth=True)
        made, key = b.call_sync("POST", "/api/v1/access-keys", {"name": "gateway a"},
                                admin=True)
        assert made in (200, 201), key
        a = launcher.start_sync("a", nodes=[b.node(1, key["key"])])
        added, node = b.call_sync("POST", "/api/v1/nodes", {"baseUrl": a.base_url},
                                  admin=True)
        assert (added, node["fingerprint"]) == (201, a.fingerprint), node
        yield Pair(a, b, fake, key["key"])
    finally:
        launcher.close()
        backend.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_chain_is_transparent_to_the_openai_sdk(pair: Pair) -> None:
    await pair.ready()
    a, b = pair.a, pair.b
    before_a = await a.node_stats(b.fingerprint)
    before_b = (await b.get_json("/api/v1/pool/routing-stats"))["local"]
    seen_before = len(pair.backend.requests_to(CHAT))
    result: dict[str, Any] = {}

    def run() -> None:
        client = openai.OpenAI(base_url=f"{a.base_url}/v1", api_key="sk-sdk-client-secret",
                               max_retries=0)
        with client:
            result["models"] = [(m.id, m.owned_by) for m in client.models.list()]
            raw = client.chat.completions.with_raw_response.create(
                model="b-model", messages=[{"role": "user", "content": "hi"}])
            result["served_by"] = raw.headers.get("x-sluice-served-by")
            result["whole"] = raw.parse().choices[0].message.content
            chunks = list(client.chat.completions.create(
                model="b-model", messages=[{"role": "user", "content": "hi"}], stream=True))
            result["streamed"] = "".join(c.choices[0].delta.content or "" for c in chunks
                                         if c.choices)
            try:
                client.chat.completions.create(
                    model="ghost", messages=[{"role": "user", "content": "hi"}])
            except openai.APIStatusError as exc:
                result["missing"] = (exc.status_code, exc.body)

    with trio.fail_after(30):
        await trio.to_thread.run_sync(run)
    assert result["models"] == [("b-model", "remote")]
    assert result["served_by"] == f"node:{b.fingerprint}"
    assert result["whole"] == "from b-backend"
    assert result["streamed"] == "from b-backend"
    code, body = result["missing"]
    assert (code, body["code"]) == (503, "model_not_available")
    seen = pair.backend.requests_to(CHAT)[seen_before:]
    assert len(seen) == 2
    for req in seen:  # neither the SDK's key nor a's node key for b goes further than b
        assert req.header("authorization") is None
    after_a = await settled_node(a, b.fingerprint)
    after_b = (await settled_stats(b))["local"]
    assert after_a["successCount"] - before_a["successCount"] == 2
    assert after_b["successCount"] - before_b["successCount"] == 2


async def test_mutual_nodes_do_not_loop(pair: Pair) -> None:
    await pair.ready()
    a, b = pair.a, pair.b
    # b does not index a's "remote" entry: its own model once, as local.
    assert await a.model_ids() == [("b-model", "remote")]
    assert await b.model_ids() == [("b-model", "llamacpp")]
    b_pool = await b.distributed_status()
    assert b_pool["models"] == []
    assert [(e["fingerprint"], e["status"], e["loadedModelCount"])
            for e in b_pool["endpoints"]] == [(a.fingerprint, "online", 0)]
    stats_before = [await gw.get_json("/api/v1/pool/routing-stats")
                    for gw in (a, b)]
    chats_before = len(pair.backend.requests_to(CHAT))
    with trio.fail_after(5):  # a hang guard, not a speed limit
        for gw in (a, b):
            reply = await gw.chat("ghost-model", via="unix")
            assert_refused(reply, "model_not_available")
    stats_after = [await gw.get_json("/api/v1/pool/routing-stats")
                   for gw in (a, b)]
    for before, after in zip(stats_before, stats_after, strict=True):
        assert [n["totalRequests"] for n in after["nodes"]] == [
            n["totalRequests"] for n in before["nodes"]]
    assert len(pair.backend.requests_to(CHAT)) == chats_before
    reply = await b.chat("b-model", via="unix")
    assert (reply.status, served_by(reply)) == (200, "local:bb")


async def test_forwarded_request_is_not_forwarded_again(pair: Pair) -> None:
    await pair.ready()
    a, b = pair.a, pair.b
    before = await a.node_stats(b.fingerprint)
    chats_before = len(pair.backend.requests_to(CHAT))
    loop = [("x-sluice-forwarded", "node-somewhere-else")]
    for stream in (False, True):
        assert_refused(await a.chat("b-model", stream=stream, headers=loop),
                       "model_not_available")
    assert len(pair.backend.requests_to(CHAT)) == chats_before  # b was not contacted
    assert (await a.node_stats(b.fingerprint))["totalRequests"] == before["totalRequests"]
    reply = await a.chat("b-model")  # without the header the same request goes through
    assert (reply.status, served_by(reply)) == (200, f"node:{b.fingerprint}")
    assert len(pair.backend.requests_to(CHAT)) == chats_before + 1
