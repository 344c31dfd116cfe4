"""Forwarding to network nodes in one process (SPEC §7.1, §7.3, §7.4, §8): the node key and
the loop guard, failover before commit and none after, the circuit breaker with its single
half-open probe, client-caused outcomes, the strategies, and routing-stats counters.

Everything runs under the autojump clock, so every hop is a Unix socket and the nodes are
put into the live config directly (``configure`` in tests/conftest.py). The same behaviours
across real gateway processes over TCP are in tests/test_e2e_routing.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from tests.client import CHAT, Client, Reply, assert_refused, chat_body, read_events, request
from tests.conftest import (
    RunningGateway,
    StartGateway,
    configure,
    gateway_config,
    node,
    open_settings,
)
from tests.fakenode import FakeNode, reset_now, start_node
from tests.fakeupstream import (
    FakeUpstream,
    Handler,
    ReceivedRequest,
    ResponseWriter,
    close_mid_stream,
    json_completion,
    reset_mid_stream,
    sse_events,
    sse_stream,
    stall_before_head,
    status,
)
from tests.waits import settled

STATS = "/api/v1/pool/routing-stats"
MODEL = "remote-m"


async def pool(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Any,
               *handlers: Handler, **options: Any) -> tuple[RunningGateway, list[FakeNode]]:
    """A gateway without local backends and one node per handler, top priority first
    (node-a, node-b, ...), load balancing on; waits until every node is indexed. The
    strategy is ``priority`` unless ``lb`` says otherwise (these tests are about the order
    of the nodes; tests/test_cache_aware.py is about the cache-aware default)."""
    lb = {"strategy": "priority", **options.pop("lb", {})}
    breaker = options.pop("breaker", None)
    gw = await start_gateway([], **options)
    ups = []
    nodes = []
    for i, handler in enumerate(handlers):
        name = f"node-{chr(ord('a') + i)}"
        up = await start_node(nursery, str(short_tmp / f"{name}.sock"), [MODEL], answer=handler)
        ups.append(up)
        nodes.append(node(name, up.url, len(handlers) - i))
        gw.gateway.settings.secrets.node_keys[name] = f"key-of-{name}"
    settings = gw.gateway.settings
    cfg = settings.config
    cfg = attrs.evolve(cfg, load_balancing=attrs.evolve(cfg.load_balancing, **lb))
    if breaker is not None:
        cfg = attrs.evolve(cfg, circuit_breaker=attrs.evolve(cfg.circuit_breaker, **breaker))
    settings.config = cfg
    configure(gw, tuple(nodes), enabled=True)
    await gw.gateway.ctx.nodes.first_round(10)  # the round the switch started
    assert [e.status for e in gw.gateway.ctx.nodes.endpoints] == ["online"] * len(handlers)
    return gw, ups


def chats(up: FakeUpstream) -> list[ReceivedRequest]:
    return up.requests_to(CHAT)


async def chat(gw: RunningGateway, *, stream: bool = False,
               headers: list[tuple[str, str]] | None = None) -> Any:
    return await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=stream),
                         headers=headers)


async def stats(gw: RunningGateway) -> dict[str, Any]:
    reply = await request(gw.unix, "GET", STATS)
    assert reply.status == 200
    data: dict[str, Any] = reply.json()
    # The invariant the endpoint promises, checked after every call.
    every = [*data["nodes"], data["local"]]
    for entry in every:
        assert entry["totalRequests"] == (entry["successCount"] + entry["failureCount"]
                                          + entry["abortedCount"] + entry["activeRequests"])
    assert data["totalRequests"] == sum(e["totalRequests"] for e in every)
    assert data["totalSuccesses"] == sum(e["successCount"] for e in every)
    assert data["totalFailures"] == sum(e["failureCount"] for e in every)
    return data


def counts(data: dict[str, Any], fp: str) -> tuple[int, int, int, int]:
    entry = next(n for n in data["nodes"] if n["fingerprint"] == fp)
    return (entry["totalRequests"], entry["successCount"], entry["failureCount"],
            entry["abortedCount"])


def gated(gate: trio.Event, then: Handler) -> Handler:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await gate.wait()
        await then(req, w)

    return handler


def switchable(initial: Handler) -> tuple[Handler, Callable[[Handler], None]]:
    current = [initial]

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await current[0](req, w)

    def switch(new: Handler) -> None:
        current[0] = new

    return handler, switch


# ---------------------------------------------------------------------------- forwarding


async def test_forward_uses_the_node_key_and_marks_the_hop(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, json_completion("from a"))
    body = chat_body(MODEL, temperature=0.5)
    reply = await request(gw.unix, "POST", CHAT, body, headers=[
        ("authorization", "Bearer client-own-secret"), ("x-custom", "kept")])
    assert reply.status == 200
    assert reply.json()["choices"][0]["message"]["content"] == "from a"
    assert reply.header("x-sluice-served-by") == "node:node-a"
    (seen,) = chats(a)
    assert seen.body == body
    assert seen.header("authorization") == "Bearer key-of-node-a"
    assert seen.header("x-sluice-forwarded") == gw.gateway.settings.node_id
    assert seen.header("x-custom") == "kept"
    assert all(b"client-own-secret" not in v for _, v in seen.headers)
    data = await stats(gw)
    assert counts(data, "node-a") == (1, 1, 0, 0)
    assert data["local"]["totalRequests"] == 0
    assert data["failovers"] == 0
    assert data["nodes"][0]["avgLatencyMs"] is not None


async def test_a_node_without_a_key_gets_no_authorization(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, json_completion())
    del gw.gateway.settings.secrets.node_keys["node-a"]
    reply = await chat(gw, headers=[("authorization", "Bearer client-own-secret")])
    assert reply.status == 200
    assert chats(a)[0].header("authorization") is None


async def test_a_forwarded_request_is_never_forwarded_again(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, json_completion())
    reply = await chat(gw, headers=[("x-sluice-forwarded", "some-other-gateway")])
    assert_refused(reply, "model_not_available")
    assert chats(a) == []
    assert (await stats(gw))["totalRequests"] == 0


async def test_load_balancing_off_serves_local_only(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, json_completion())
    configure(gw, enabled=False)
    await trio.sleep(0.1)
    reply = await chat(gw)
    assert_refused(reply, "model_not_available")
    assert chats(a) == []


async def test_a_model_held_nowhere_is_503(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, json_completion())
    reply = await request(gw.unix, "POST", CHAT, chat_body("nobody-has-it"))
    assert_refused(reply, "model_not_available")
    assert chats(a) == []


async def test_local_first(autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
                           short_tmp: Any, start_gateway: StartGateway) -> None:
    local = FakeUpstream(models=[MODEL], unix_path=str(short_tmp / "local.sock"))
    local.on("POST", CHAT, json_completion("local"))
    await nursery.start(local.serve)
    gw = await start_gateway([("mine", local.url)])
    a = await start_node(nursery, str(short_tmp / "a.sock"), [MODEL],
                         answer=json_completion("node"))
    configure(gw, (node("node-a", a.url, 1),), enabled=True)
    await trio.sleep(0.1)
    reply = await chat(gw)
    assert reply.header("x-sluice-served-by") == "local:mine"
    assert chats(a) == []
    data = await stats(gw)
    assert (data["local"]["totalRequests"], data["local"]["successCount"]) == (1, 1)


# ------------------------------------------------------------------------------ failover


async def test_failover_on_a_5xx_resends_the_same_body(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gw, (a, b) = await pool(nursery, start_gateway, short_tmp, status(500),
                            json_completion("from b"))
    body = chat_body(MODEL, seed=7)
    reply = await request(gw.unix, "POST", CHAT, body)
    assert reply.status == 200
    assert reply.header("x-sluice-served-by") == "node:node-b"
    assert [r.body for r in chats(a)] == [body]
    assert [r.body for r in chats(b)] == [body]
    assert chats(b)[0].header("authorization") == "Bearer key-of-node-b"
    data = await stats(gw)
    assert counts(data, "node-a") == (1, 0, 1, 0)
    assert counts(data, "node-b") == (1, 1, 0, 0)
    assert data["failovers"] == 1
    assert data["nodes"][0]["consecutiveFailures"] == 1
    # The first node may have worked on it: the log says the request ran twice.
    assert ("failover: node:node-a failed (it answered 500); POST /v1/chat/completions sent "
            "again to node:node-b") in caplog.text


async def test_failover_on_reset_and_on_close_before_the_first_chunk(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, switch = switchable(reset_now())
    gw, (a, b) = await pool(nursery, start_gateway, short_tmp, handler,
                            sse_stream(sse_events(3)))
    reply = await chat(gw, stream=True)
    assert (reply.status, reply.complete) == (200, True)
    assert reply.header("x-sluice-served-by") == "node:node-b"
    assert reply.body.endswith(b"data: [DONE]\n\n")
    switch(close_mid_stream(0))  # a 200 head, then closed before any event
    reply = await chat(gw, stream=True)
    assert (reply.status, reply.complete) == (200, True)
    assert reply.header("x-sluice-served-by") == "node:node-b"
    # The reset came on the pooled health-check connection after node-a had read the
    # request: it is node-a's failure, never a second send to node-a (UPSTREAMS.md), so each
    # request reached node-a once before failing over.
    assert (len(chats(a)), len(chats(b))) == (2, 2)
    data = await stats(gw)
    assert counts(data, "node-a") == (2, 0, 2, 0)
    assert data["failovers"] == 2


async def test_failover_on_a_connect_error(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    b = await start_node(nursery, str(short_tmp / "b.sock"), [MODEL],
                         answer=json_completion("from b"))
    a = FakeUpstream(models=[MODEL], unix_path=str(short_tmp / "a.sock"))
    async with a.running():
        configure(gw, (node("node-a", a.url, 2), node("node-b", b.url, 1)), enabled=True)
        await trio.sleep(0.1)
    # node-a is gone but still indexed as online until its next health check.
    reply = await chat(gw)
    assert reply.status == 200
    assert reply.header("x-sluice-served-by") == "node:node-b"
    data = await stats(gw)
    assert counts(data, "node-a") == (1, 0, 1, 0)
    assert data["failovers"] == 1


async def test_failover_happens_once(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a, b, c) = await pool(nursery, start_gateway, short_tmp, status(500), status(502),
                               json_completion())
    reply = await chat(gw)
    assert reply.status == 502  # node-b's answer as it sent it: no third try
    assert reply.json()["error"]["code"] == 502
    assert reply.header("x-sluice-served-by") == "node:node-b"
    assert (len(chats(a)), len(chats(b)), len(chats(c))) == (1, 1, 0)
    data = await stats(gw)
    assert data["failovers"] == 1
    assert data["totalFailures"] == 2


async def test_without_an_alternate_the_first_error_is_the_answer(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (_a,) = await pool(nursery, start_gateway, short_tmp, status(503))
    reply = await chat(gw)
    assert reply.status == 503
    assert reply.json()["error"]["message"] == "Service Unavailable"  # the node's own body
    data = await stats(gw)
    assert counts(data, "node-a") == (1, 0, 1, 0)
    assert data["failovers"] == 0


async def test_failover_disabled_returns_the_upstream_error(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, switch = switchable(status(500))
    gw, (_a, b) = await pool(nursery, start_gateway, short_tmp, handler, json_completion(),
                            lb={"failover_enabled": False})
    reply = await chat(gw)
    assert reply.status == 500
    switch(reset_now())
    reply = await chat(gw)
    assert reply.status == 502
    assert reply.json()["error"]["code"] == "upstream_connection_error"
    assert chats(b) == []
    assert (await stats(gw))["failovers"] == 0


async def test_no_failover_after_the_first_chunk(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (_a, b) = await pool(nursery, start_gateway, short_tmp, reset_mid_stream(2),
                            sse_stream(sse_events(3)))
    reply = await chat(gw, stream=True)
    assert reply.status == 200
    assert not reply.complete  # no final chunk
    events = reply.body.split(b"\n\n")
    assert events[:2] == [e.rstrip(b"\n") for e in sse_events(3)[:2]]
    assert events[2].startswith(b'data: {"error":')
    assert chats(b) == []
    data = await stats(gw)
    assert counts(data, "node-a") == (1, 0, 1, 0)
    assert data["failovers"] == 0


async def test_a_first_byte_timeout_is_504_and_a_failure_without_failover(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (_a, b) = await pool(nursery, start_gateway, short_tmp, stall_before_head(),
                            json_completion(), standard_total=20)
    start = trio.current_time()
    reply = await chat(gw)
    assert reply.status == 504
    assert trio.current_time() - start == pytest.approx(20)
    assert chats(b) == []
    assert counts(await stats(gw), "node-a") == (1, 0, 1, 0)


# ------------------------------------------------------------------------ circuit breaker


async def open_circuit(gw: RunningGateway, threshold: int) -> None:
    for _ in range(threshold):
        reply = await chat(gw)
        assert reply.status == 500


async def test_breaker_opens_skips_and_lets_one_probe_through(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, switch = switchable(status(500))
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, handler,
                          breaker={"failure_threshold": 3, "reset_timeout": 60.0})
    await open_circuit(gw, 3)
    entry = (await stats(gw))["nodes"][0]
    assert (entry["circuitOpen"], entry["circuitState"], entry["consecutiveFailures"]) == (
        True, "open", 3)
    assert_refused(await chat(gw), "all_circuits_open")
    assert len(chats(a)) == 3  # skipped while open

    await trio.sleep(60)
    assert (await stats(gw))["nodes"][0]["circuitState"] == "half_open"
    gate = trio.Event()
    switch(gated(gate, json_completion("probe")))
    replies: list[Any] = []

    async def one() -> None:
        replies.append(await chat(gw))

    async with trio.open_nursery() as inner:
        for _ in range(10):
            inner.start_soon(one)
        await trio.sleep(1)
        assert len(chats(a)) == 4  # exactly one probe reached the node
        assert len(replies) == 9
        assert {r.json()["error"]["code"] for r in replies} == {"all_circuits_open"}
        gate.set()
    assert sorted(r.status for r in replies) == [200] + [503] * 9
    entry = (await stats(gw))["nodes"][0]
    assert (entry["circuitState"], entry["consecutiveFailures"]) == ("closed", 0)
    assert (await chat(gw)).status == 200


async def test_a_failed_probe_reopens_at_once(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, status(500),
                          breaker={"failure_threshold": 2, "reset_timeout": 30.0})
    breaker = (await stats(gw))["circuitBreaker"]
    assert breaker == {"failureThreshold": 2, "resetTimeoutSecs": 30}
    assert type(breaker["resetTimeoutSecs"]) is int  # whole seconds print as 30, not 30.0
    await open_circuit(gw, 2)
    await trio.sleep(30)
    assert (await chat(gw)).status == 500  # the probe
    assert (await stats(gw))["nodes"][0]["circuitState"] == "open"
    assert (await chat(gw)).json()["error"]["code"] == "all_circuits_open"
    await trio.sleep(29)
    assert (await chat(gw)).json()["error"]["code"] == "all_circuits_open"
    await trio.sleep(1)
    assert (await chat(gw)).status == 500  # another probe after a full reset_timeout
    assert len(chats(a)) == 4


async def test_an_open_node_is_skipped_for_an_alternate(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, _switch = switchable(status(500))
    gw, (a, _b) = await pool(nursery, start_gateway, short_tmp, handler, json_completion(),
                            breaker={"failure_threshold": 2, "reset_timeout": 60.0},
                            lb={"failover_enabled": False})
    await open_circuit(gw, 2)
    for _ in range(3):
        reply = await chat(gw)
        assert reply.header("x-sluice-served-by") == "node:node-b"
    assert len(chats(a)) == 2


async def test_a_hung_probe_is_bounded_by_the_request_timeout(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, switch = switchable(status(500))
    gw, (_a,) = await pool(nursery, start_gateway, short_tmp, handler, standard_total=20,
                          breaker={"failure_threshold": 1, "reset_timeout": 10.0})
    await open_circuit(gw, 1)
    await trio.sleep(10)
    switch(stall_before_head())
    async with trio.open_nursery() as inner:
        inner.start_soon(chat, gw)  # the probe: hangs until the 20 s total
        await trio.sleep(5)
        assert (await chat(gw)).json()["error"]["code"] == "all_circuits_open"
        await trio.sleep(16)
    assert (await stats(gw))["nodes"][0]["circuitState"] == "open"  # the probe failed
    switch(json_completion())
    await trio.sleep(10)
    assert (await chat(gw)).status == 200  # half-open again, not wedged
    assert (await stats(gw))["nodes"][0]["circuitState"] == "closed"


async def test_client_caused_outcomes_are_not_failures(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    handler, switch = switchable(status(400))
    gw, (_a,) = await pool(nursery, start_gateway, short_tmp, handler,
                          breaker={"failure_threshold": 1, "reset_timeout": 10.0})
    for _ in range(3):
        assert (await chat(gw)).status == 400
    data = await stats(gw)
    assert counts(data, "node-a") == (3, 3, 0, 0)
    assert data["nodes"][0]["circuitState"] == "closed"

    switch(sse_stream(sse_events(20), gap=1.0))
    client = await Client.open(gw.unix)
    await client.send_request("POST", CHAT, chat_body(MODEL, stream=True))
    await client.read_head()
    await read_events(client, 2)
    assert (await stats(gw))["nodes"][0]["activeRequests"] == 1
    await client.aclose()
    await trio.sleep(0.5)
    data = await stats(gw)
    assert counts(data, "node-a") == (4, 3, 0, 1)
    assert data["nodes"][0]["circuitState"] == "closed"


# ----------------------------------------------------------------------------- strategies


async def served_by(gw: RunningGateway, n: int) -> list[str]:
    out = []
    for _ in range(n):
        reply = await chat(gw)
        assert reply.status == 200
        out.append(str(reply.header("x-sluice-served-by"))[len("node:"):])
    return out


def set_strategy(gw: RunningGateway, strategy: str) -> None:
    settings = gw.gateway.settings
    cfg = settings.config
    settings.config = attrs.evolve(
        cfg, load_balancing=attrs.evolve(cfg.load_balancing, strategy=strategy))


async def test_priority_and_round_robin(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, _ = await pool(nursery, start_gateway, short_tmp, json_completion(),
                       json_completion(), json_completion())
    assert await served_by(gw, 3) == ["node-a"] * 3
    set_strategy(gw, "round-robin")
    assert await served_by(gw, 6) == ["node-a", "node-b", "node-c"] * 2


async def test_least_loaded_counts_requests_in_flight(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gate = trio.Event()
    handler, switch = switchable(gated(gate, json_completion()))
    gw, (_a, _b) = await pool(nursery, start_gateway, short_tmp, handler, json_completion(),
                            lb={"strategy": "least-loaded"})
    async with trio.open_nursery() as inner:
        inner.start_soon(chat, gw)  # held on node-a
        await trio.sleep(1)
        data = await stats(gw)
        assert [n["activeRequests"] for n in data["nodes"]] == [1, 0]
        assert await served_by(gw, 2) == ["node-b", "node-b"]
        gate.set()
    switch(json_completion())
    assert await served_by(gw, 1) == ["node-a"]  # a tie again: priority decides


async def test_fastest_follows_health_checks_and_time_to_first_byte(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    async def slow_answer(req: ReceivedRequest, w: ResponseWriter) -> None:
        await trio.sleep(1.0)
        await json_completion()(req, w)

    handler, switch = switchable(json_completion())
    gw, (a, _b) = await pool(nursery, start_gateway, short_tmp, json_completion(), handler,
                            lb={"strategy": "fastest"})
    a.models_delay = 0.2
    await trio.sleep(5.5)  # the next round: node-a's check takes 200 ms, node-b's none
    assert await served_by(gw, 2) == ["node-b", "node-b"]
    switch(slow_answer)  # node-b now takes 1 s to its first byte
    assert await served_by(gw, 2) == ["node-b", "node-a"]


async def test_right_after_start_a_request_waits_for_the_first_node_checks(
        nursery: trio.Nursery, short_tmp: Any) -> None:
    """Real time over TCP: config.yaml names the node, as a user would write it."""
    from proxy.server import Gateway

    # The first check is held until the request has come.
    up = await FakeNode("node-a", [MODEL], answer=json_completion("first")).start(nursery)
    up.models_gate = gate = trio.Event()
    cfg = gateway_config([], socket_dir=short_tmp / "s", nodes=(node("node-a", up.url, 1),),
                         lb=True)
    gateway = Gateway(open_settings(short_tmp / "data", cfg), drain_timeout=1.0)
    await nursery.start(gateway.run)
    gw = RunningGateway(gateway)
    replies: list[Reply] = []

    async def send() -> None:
        replies.append(await chat(gw))

    async with trio.open_nursery() as inner:
        inner.start_soon(send)
        await settled(lambda: gateway.ctx.connection_count == 1, "the request at the gateway")
        assert not replies  # it waits for the check
        gate.set()
    [reply] = replies
    assert reply.status == 200
    assert reply.header("x-sluice-served-by") == "node:node-a"


async def test_node_switches_and_order_apply_to_the_very_next_request(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, (a, b) = await pool(nursery, start_gateway, short_tmp, json_completion(),
                            json_completion())
    settings = gw.gateway.settings
    nodes = settings.config.nodes
    # Straight into the live config, before the health-check task has seen the change.
    settings.config = attrs.evolve(settings.config, nodes=(
        attrs.evolve(nodes[0], enabled=False), nodes[1]))
    assert await served_by(gw, 1) == ["node-b"]
    settings.config = attrs.evolve(settings.config, nodes=(
        attrs.evolve(nodes[0], priority=1), attrs.evolve(nodes[1], priority=2)))
    assert await served_by(gw, 1) == ["node-b"]
    settings.config = attrs.evolve(settings.config, nodes=(nodes[0],))
    assert await served_by(gw, 1) == ["node-a"]
    assert (len(chats(a)), len(chats(b))) == (1, 2)


async def test_a_4xx_moves_no_breaker(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    answers = iter([500, 400, 500, 400, 500])

    async def alternating(req: ReceivedRequest, w: ResponseWriter) -> None:
        await status(next(answers))(req, w)

    handler, switch = switchable(alternating)
    gw, (_a,) = await pool(nursery, start_gateway, short_tmp, handler,
                          breaker={"failure_threshold": 3, "reset_timeout": 10.0})
    assert [(await chat(gw)).status for _ in range(5)] == [500, 400, 500, 400, 500]
    entry = (await stats(gw))["nodes"][0]
    assert (entry["circuitState"], entry["consecutiveFailures"]) == ("open", 3)
    assert (entry["successCount"], entry["failureCount"]) == (2, 3)  # 4xx: answered
    await trio.sleep(10)
    switch(status(404))
    assert (await chat(gw)).status == 404  # a probe answered 4xx: released, still half-open
    assert (await stats(gw))["nodes"][0]["circuitState"] == "half_open"
    switch(json_completion())
    assert (await chat(gw)).status == 200  # the next probe closes it
    assert (await stats(gw))["nodes"][0]["circuitState"] == "closed"
