"""``GET /metrics`` end to end (SPEC §9.2): an in-process gateway with a local fake model
server and two fake nodes (every hop a Unix socket, under the autojump clock as in
tests/test_forwarding.py) runs a known sequence of real requests — local, forwarded, failed
over, aborted, timed out, 4xx, streamed and not — and the scrape, parsed with
prometheus_client's own parser, must count exactly those; the gauges follow what is in
flight, the nodes, their circuits and the client connections."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from proxy.observe.metrics import DURATION_BUCKETS, TTFB_BUCKETS
from tests.client import CHAT, Client, chat_body, read_events, request
from tests.conftest import RunningGateway, StartGateway, configure, node
from tests.fakenode import start_node
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    Handler,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
    sse_stream,
    stall_before_head,
    status,
)
from tests.test_metrics import expected_buckets, histogram, labels, parse, series

LOCAL = "fake-model"
REMOTE = "remote-m"
TIMEOUT = 5.0  # timeouts.request.standard.total here
USAGE_EVENT = (b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,'
               b'"total_tokens":7}}\n\n')


def by_user(handlers: dict[str, Handler], default: Handler) -> Handler:
    """Answer each request with the handler named by its body's ``user`` field."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await handlers.get(req.json().get("user", ""), default)(req, w)

    return handler


class Parked:
    """The SSE head and two events, then wait until the client has gone."""

    def __init__(self) -> None:
        self.arrived = trio.Event()

    async def __call__(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for event in sse_events(3)[:2]:
            await w.chunk(event)
        self.arrived.set()
        await w.stall()


async def setup(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Path,
                parked: Parked) -> RunningGateway:
    local = FakeUpstream(models=[LOCAL], unix_path=str(short_tmp / "local.sock"))
    stream = sse_stream([*sse_events(3)[:-1], USAGE_EVENT, sse_events(3)[-1]])
    local.on("POST", CHAT, by_user({
        "stream": stream, "park": parked, "stall": stall_before_head(),
        "bad": status(400, {"error": {"message": "bad", "type": "invalid_request_error"}}),
    }, json_completion()))
    await nursery.start(local.serve)
    gw = await start_gateway([("fake", local.url)], standard_total=TIMEOUT,
                             failure_threshold=1)
    a = await start_node(nursery, str(short_tmp / "node-a.sock"), [REMOTE],
                         answer=by_user({"fail": status(500)}, json_completion()))
    b = await start_node(nursery, str(short_tmp / "node-b.sock"), [REMOTE],
                         answer=sse_stream(sse_events(2)))
    configure(gw, (node("node-a", a.url, 2), node("node-b", b.url, 1)), enabled=True)
    await trio.sleep(0.1)
    assert [e.status for e in gw.gateway.ctx.nodes.endpoints] == ["online", "online"]
    return gw


async def chat(gw: RunningGateway, model: str, user: str = "", *, stream: bool = False,
               transport: str = "unix") -> Any:
    return await request(gw.address(transport), "POST", CHAT,
                         chat_body(model, stream=stream, user=user))


async def scrape(gw: RunningGateway, transport: str = "unix") -> dict[Any, float]:
    reply = await request(gw.address(transport), "GET", "/metrics")
    assert reply.status == 200
    assert reply.header("content-type") == "text/plain; version=0.0.4; charset=utf-8"
    return parse(reply.body)[1]


async def until(check: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not check():
            await trio.sleep(0.01)


def requests_counted(gw: RunningGateway) -> int:
    samples = parse(gw.gateway.ctx.metrics.render())[1]
    return int(sum(series(samples, "sluice_requests_total").values()))


async def test_a_known_sequence_end_to_end(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    parked = Parked()
    gw = await setup(nursery, start_gateway, short_tmp, parked)
    assert (await chat(gw, LOCAL)).status == 200  # local, whole
    reply = await chat(gw, LOCAL, "stream", stream=True, transport="tcp")  # local, streamed
    assert (reply.status, reply.complete) == (200, True)
    reply = await chat(gw, REMOTE)  # forwarded, whole
    assert reply.header("x-sluice-served-by") == "node:node-a"
    reply = await chat(gw, REMOTE, "fail", stream=True)  # failed over, streamed
    assert (reply.status, reply.header("x-sluice-served-by")) == (200, "node:node-b")
    # Aborted: the client leaves in the middle of a stream; while it is held, it is in flight.
    client = await Client.open(gw.unix)
    await client.send_request("POST", CHAT, chat_body(LOCAL, stream=True, user="park"))
    assert (await client.read_head()).status_code == 200
    await read_events(client, 2)
    await parked.arrived.wait()
    samples = await scrape(gw, "tcp")
    assert series(samples, "sluice_upstream_active_requests") == {
        labels(upstream="local:fake"): 1, labels(upstream="node:node-a"): 0,
        labels(upstream="node:node-b"): 0}
    assert series(samples, "sluice_client_connections") == {
        labels(transport="unix"): 1, labels(transport="tcp"): 1}  # the held one; the scrape
    await client.aclose()
    await until(lambda: requests_counted(gw) == 5)
    reply = await chat(gw, LOCAL, "stall")  # timed out
    assert (reply.status, reply.json()["error"]["code"]) == (504, "upstream_timeout")
    assert (await chat(gw, LOCAL, "bad")).status == 400  # the upstream's 4xx, relayed
    not_found = await request(gw.unix, "GET", "/v1/models/nobody")  # refused before routing
    assert not_found.status == 404
    assert (await chat(gw, "nobody-has-it")).status == 503  # no upstream holds it
    samples = await scrape(gw)

    assert series(samples, "sluice_requests_total") == {
        labels(model=LOCAL, served_by="local:fake", api="openai", code="200"): 3,
        labels(model=LOCAL, served_by="local:fake", api="openai", code="504"): 1,
        labels(model=LOCAL, served_by="local:fake", api="openai", code="400"): 1,
        labels(model=REMOTE, served_by="node:node-a", api="openai", code="200"): 1,
        labels(model=REMOTE, served_by="node:node-b", api="openai", code="200"): 1,
        labels(model="none", served_by="none", api="openai", code="404"): 1,
        labels(model="none", served_by="none", api="openai", code="503"): 1,
    }
    # Under the autojump clock every hop takes no time but the timeout: exactly 5 s.
    durations = {
        (LOCAL, "local:fake", "false"): [0.0, TIMEOUT, 0.0],
        (LOCAL, "local:fake", "true"): [0.0, 0.0],
        (REMOTE, "node:node-a", "false"): [0.0],
        (REMOTE, "node:node-b", "true"): [0.0],
        ("none", "none", "false"): [0.0, 0.0],
    }
    for (model, served_by, stream), values in durations.items():
        pairs = {"model": model, "served_by": served_by, "stream": stream}
        for name, bounds in (("sluice_request_duration_seconds", DURATION_BUCKETS),
                             ("sluice_time_to_first_byte_seconds", TTFB_BUCKETS)):
            buckets, count, total = histogram(samples, name, bounds, **pairs)
            assert (buckets, count) == (expected_buckets(bounds, values), len(values)), (
                name, pairs)
            # A deadline is start + 5 on the mock clock's floats: 5 within a rounding error.
            assert total == pytest.approx(sum(values), abs=1e-9), (name, pairs)
    assert len(series(samples, "sluice_request_duration_seconds_count")) == len(durations)
    assert series(samples, "sluice_stream_events_total") == {
        labels(model=LOCAL, served_by="local:fake"): 5 + 2,  # 3 events, usage, [DONE]; 2
        labels(model=REMOTE, served_by="node:node-a"): 0,
        labels(model=REMOTE, served_by="node:node-b"): 3,  # 2 events and [DONE]
        labels(model="none", served_by="none"): 0,
    }
    assert series(samples, "sluice_tokens_total") == {
        labels(model=LOCAL, served_by="local:fake", type="prompt"): 5 + 4,
        labels(model=LOCAL, served_by="local:fake", type="completion"): 1 + 3,
        labels(model=REMOTE, served_by="node:node-a", type="prompt"): 5,
        labels(model=REMOTE, served_by="node:node-a", type="completion"): 1,
        labels(model=REMOTE, served_by="node:node-b", type="prompt"): 0,
        labels(model=REMOTE, served_by="node:node-b", type="completion"): 0,
        labels(model="none", served_by="none", type="prompt"): 0,
        labels(model="none", served_by="none", type="completion"): 0,
    }
    assert series(samples, "sluice_upstream_attempts_total") == {
        labels(upstream="local:fake", outcome="success"): 2,  # whole, stream
        labels(upstream="local:fake", outcome="refused"): 1,  # the upstream's 400
        labels(upstream="local:fake", outcome="aborted"): 1,
        labels(upstream="local:fake", outcome="failure"): 1,
        labels(upstream="node:node-a", outcome="success"): 1,
        labels(upstream="node:node-a", outcome="failure"): 1,
        labels(upstream="node:node-b", outcome="success"): 1,
    }
    assert series(samples, "sluice_failovers_total") == {labels(): 1}
    routing = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()
    assert routing["failovers"] == 1  # the same count, from the router's own side
    assert series(samples, "sluice_upstream_active_requests") == {
        labels(upstream="local:fake"): 0, labels(upstream="node:node-a"): 0,
        labels(upstream="node:node-b"): 0}
    assert series(samples, "sluice_node_up") == {labels(node="node-a"): 1,
                                                 labels(node="node-b"): 1}
    assert set(series(samples, "sluice_node_latency_seconds")) == {
        labels(node="node-a"), labels(node="node-b")}
    # failure_threshold 1: node-a's 500 opened its circuit.
    assert series(samples, "sluice_circuit_state") == {labels(node="node-a"): 2,
                                                       labels(node="node-b"): 0}
    assert series(samples, "sluice_client_connections") == {
        labels(transport="unix"): 1, labels(transport="tcp"): 0}
    await trio.sleep(gw.gateway.settings.config.circuit_breaker.reset_timeout)
    samples = await scrape(gw, "tcp")
    assert series(samples, "sluice_circuit_state")[labels(node="node-a")] == 1  # half-open
    assert series(samples, "sluice_client_connections") == {
        labels(transport="unix"): 0, labels(transport="tcp"): 1}
    assert samples["sluice_build_info", labels(version=(await request(
        gw.unix, "GET", "/api/v1/node/identity")).json()["version"])] == 1


async def test_a_node_going_offline_is_down(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([], interval=1.0, hc_timeout=0.5)
    a = await start_node(nursery, str(short_tmp / "node-a.sock"), [REMOTE])
    configure(gw, (node("node-a", a.url, 1),), enabled=True)
    index = gw.gateway.ctx.nodes
    await until(lambda: [e.online for e in index.endpoints] == [True])
    samples = await scrape(gw)
    assert series(samples, "sluice_node_up") == {labels(node="node-a"): 1}
    await a.stop()
    await until(lambda: [e.online for e in index.endpoints] == [False])
    samples = await scrape(gw)
    assert series(samples, "sluice_node_up") == {labels(node="node-a"): 0}
    assert series(samples, "sluice_node_latency_seconds") == {}
    # Disabled in the config: still listed (a configured name), never up.
    settings = gw.gateway.settings
    configure(gw, (attrs.evolve(settings.config.nodes[0], enabled=False),))
    samples = await scrape(gw)
    assert series(samples, "sluice_node_up") == {labels(node="node-a"): 0}


async def test_the_access_rule_of_other_gets(start_gateway: StartGateway) -> None:
    gw = await start_gateway([], require_auth=True)
    admin = gw.gateway.settings.secrets.admin_token
    made = await request(gw.unix, "POST", "/api/v1/access-keys", None,
                         [("authorization", f"Bearer {admin}")])
    key = made.json()["key"]
    refused = await request(gw.tcp, "GET", "/metrics")
    assert (refused.status, refused.json()["error"]["code"]) == (401, "missing_api_key")
    assert (await request(gw.tcp, "GET", "/metrics", None,
                          [("authorization", f"Bearer {key}")])).status == 200
    assert (await request(gw.unix, "GET", "/metrics")).status == 200  # the socket needs none
    wrong = await request(gw.unix, "POST", "/metrics")
    assert (wrong.status, wrong.header("allow")) == (405, "GET")
