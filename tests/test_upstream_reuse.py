"""Requests that follow a streamed answer at once (issue 21), against fake upstreams that
close their connection after streams always, sometimes or never, at the worst moment: only
once the next request's bytes have arrived, as llama.cpp's FIN sometimes does."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from protocol.stream_reuse import PROBES_AT_ONCE, PROBES_TO_TRUST, Verdict
from proxy.upstream.pool import ConnectionPool
from tests.client import CHAT, Client, chat_body, request
from tests.conftest import RunningGateway, StartGateway
from tests.cycles import SHAPES, CycleResult, run_transitions
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
    sse_stream,
)
from tests.waits import settled
from tools.faults.server import FaultServer

MODEL = "fake-model"


def chat_answers(closes: Callable[[int], bool], *, late: bool = True) -> Callable:
    """A llama.cpp-like chat endpoint: whole answers keep the connection; after the n-th
    stream (from 1) it closes the connection when ``closes(n)`` — ``late``: only once the
    next request's bytes have arrived (the race at its worst), else at once."""
    streams = 0
    whole = json_completion()
    stream = sse_stream(sse_events(3))

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        nonlocal streams
        if not req.json().get("stream"):
            await whole(req, w)
            return
        streams += 1
        await stream(req, w)
        if closes(streams):
            if late:
                await w.wait_next_request()
            await w.close()

    return handler


def pool_of(gw: RunningGateway) -> ConnectionPool:
    return gw.gateway.connections


def probes_done(pool: ConnectionPool) -> bool:
    """No probe of a connection is running (each one pooled or closed its connection)."""
    holder = pool._probes.nursery
    return holder is None or not holder.child_tasks


@pytest.fixture(params=["tcp", "unix"])
def any_upstream(request: pytest.FixtureRequest, upstream: FakeUpstream,
                 unix_upstream: FakeUpstream) -> FakeUpstream:
    return upstream if request.param == "tcp" else unix_upstream


def assert_no_failures(results: dict[str, CycleResult], count: int) -> None:
    for shape in SHAPES:
        assert results[shape].requests == count
        assert results[shape].failed == 0, str(results[shape])


async def test_an_upstream_that_closes_after_every_stream(
        any_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    any_upstream.on("POST", CHAT, chat_answers(lambda n: True))
    gw = await start_gateway([("fake", any_upstream.url)])
    assert_no_failures(await run_transitions(gw.unix, 40, MODEL, time_limit=60), 40)
    # Every request reached the server exactly once: nothing was sent twice.
    assert len(any_upstream.requests_to(CHAT)) == 3 * 40 + 1
    pool = pool_of(gw)
    assert pool.after_streams(gw.gateway.backends.backends[0].address) is Verdict.CLOSES
    # Learned from the first stream's connection (a second stream may end before that
    # probe is over), at no one's cost.
    assert 1 <= pool.probes <= PROBES_AT_ONCE


async def test_the_late_close_failed_requests_before(
        upstream: FakeUpstream, start_gateway: StartGateway,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake reproduces the defect: with connections after streams pooled as they were
    before the fix, every request after a stream is written into the closing connection."""
    from protocol.stream_reuse import Action, StreamReuse

    monkeypatch.setattr(StreamReuse, "after_stream", lambda self, **_: Action.POOL)
    upstream.on("POST", CHAT, chat_answers(lambda n: True))
    gw = await start_gateway([("fake", upstream.url)])
    results = await run_transitions(gw.tcp, 5, MODEL, time_limit=30)
    # Every stream -> stream fails; the stream -> whole after it is no transition (its
    # stream failed), and whole -> stream is fine (a whole answer's connection is sound).
    assert results["stream-stream"].failures == {"502 upstream_connection_error": 5}
    assert results["whole-stream"].failures == {}
    assert results["whole-stream"].requests == 5
    # The server never read them (as llama.cpp's log shows), and none was sent again.
    assert len(upstream.requests_to(CHAT)) == 3 * 5 + 1 - 5


async def test_an_upstream_that_closes_after_streams_only_sometimes(
        any_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    rng = random.Random(21)
    pattern = [rng.random() < 0.3 for _ in range(200)]
    assert any(pattern[:PROBES_TO_TRUST])  # a close comes before trust could be given
    any_upstream.on("POST", CHAT, chat_answers(lambda n: pattern[n - 1]))
    gw = await start_gateway([("fake", any_upstream.url)])
    assert_no_failures(await run_transitions(gw.tcp, 60, MODEL, time_limit=60), 60)
    assert len(any_upstream.requests_to(CHAT)) == 3 * 60 + 1
    address = gw.gateway.backends.backends[0].address
    assert pool_of(gw).after_streams(address) is Verdict.CLOSES


async def test_an_upstream_that_keeps_its_connections_still_gets_them_reused(
        any_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    any_upstream.on("POST", CHAT, chat_answers(lambda n: False))
    gw = await start_gateway([("fake", any_upstream.url)], interval=3600)  # no checks between
    address = gw.gateway.backends.backends[0].address
    pool = pool_of(gw)
    client = await Client.open(gw.unix)
    try:
        # Learning: each stream's connection is probed before it is pooled.
        for _ in range(50):
            if pool.after_streams(address) is not Verdict.UNKNOWN:
                break
            assert (await client.request("POST", CHAT, chat_body(stream=True))).complete
            await settled(lambda: probes_done(pool), "the probe")  # its connection pooled
        assert pool.after_streams(address) is Verdict.KEEPS
        probes = pool.probes
        assert PROBES_TO_TRUST <= probes < PROBES_TO_TRUST + PROBES_AT_ONCE
        await settled(lambda: probes_done(pool), "the probes")  # their connections back
        connects = pool.connects
        for stream in [True, True, False, True, False, False, True] * 5:
            reply = await client.request("POST", CHAT, chat_body(stream=stream))
            assert reply.status == 200
            assert reply.complete
    finally:
        await client.aclose()
    assert pool.connects == connects  # every one of them on a pooled connection
    assert pool.probes == probes  # and no more probes
    last = any_upstream.requests_to(CHAT)[-35:]
    assert len({r.conn_id for r in last}) == 1


async def test_trust_ends_when_a_connection_after_a_stream_is_found_closed(
        unix_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """An upstream that kept its connections and then starts to close them after streams:
    the first one found closed when taken ends the trust, and no request is lost."""
    closing = False
    unix_upstream.on("POST", CHAT, chat_answers(lambda n: closing, late=False))
    gw = await start_gateway([("fake", unix_upstream.url)])
    address = gw.gateway.backends.backends[0].address
    pool = pool_of(gw)
    for _ in range(50):
        if pool.after_streams(address) is Verdict.KEEPS:
            break
        assert (await request(gw.unix, "POST", CHAT, chat_body(stream=True))).complete
        await settled(lambda: probes_done(pool), "the probe")
    assert pool.after_streams(address) is Verdict.KEEPS
    closing = True
    before = len(unix_upstream.requests_to(CHAT))
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.complete
    conn_id = unix_upstream.requests_to(CHAT)[-1].conn_id
    await settled(lambda: conn_id in unix_upstream.ended_at, "the server's close")
    reply = await request(gw.unix, "POST", CHAT, chat_body())
    assert reply.status == 200
    assert pool.after_streams(address) is Verdict.CLOSES
    assert len(unix_upstream.requests_to(CHAT)) == before + 2


# ------------------------------------------------------------------ the fault kit


async def start_kit(nursery: trio.Nursery, listen: str) -> FaultServer:
    kit = FaultServer(models=(MODEL,))
    await nursery.start(kit.serve, listen)
    return kit


def kit_body(stream: bool) -> bytes:
    return json.dumps({"model": MODEL, "stream": stream, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize("fault", ["reset", "close-after-head", "reset-after;after=0"])
async def test_the_fault_kit_still_gets_one_attempt(
        nursery: trio.Nursery, short_tmp, start_gateway: StartGateway, fault: str) -> None:
    """After a stream and after a whole answer (a pooled connection), a request the kit
    resets or closes unanswered is that server's failure: sent once, never again."""
    kit = await start_kit(nursery, f"unix:{short_tmp}/kit.sock")
    gw = await start_gateway([("kit", kit.url)])
    client = await Client.open(gw.unix)
    try:
        for first in (True, False, True):
            reply = await client.request("POST", CHAT, kit_body(first))
            assert reply.status == 200
            assert reply.complete
            before = len([r for r in kit.requests if r.method == "POST"])
            reply = await client.request("POST", CHAT, kit_body(True),
                                         [("x-fault", fault)])
            assert reply.status == 502
            assert reply.json()["error"]["code"] == "upstream_connection_error"
            posts = [r for r in kit.requests if r.method == "POST"]
            assert len(posts) == before + 1  # one attempt
            await client.aclose()
            client = await Client.open(gw.unix)
    finally:
        await client.aclose()


# ------------------------------------------------------------------ the server's idle timeout


async def test_a_connection_near_the_announced_idle_timeout_is_not_reused(
        autojump_clock: trio.testing.MockClock, upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """llama.cpp says Keep-Alive: timeout=5 and closes an idle connection then: one idle
    for 4 s or more is not reused (a request then would race that close)."""
    upstream.on("POST", CHAT, json_completion())
    gw = await start_gateway([("fake", upstream.url)], interval=3600)
    conn_ids = []
    for pause in (0, 3.9, 3.9, 4.1, 0.5, 10):
        await trio.sleep(pause)
        assert (await request(gw.tcp, "POST", CHAT, chat_body())).status == 200
        conn_ids.append(upstream.requests_to(CHAT)[-1].conn_id)
    first = conn_ids[0]
    assert conn_ids[:3] == [first] * 3
    assert conn_ids[3] != first  # idled 4.1 s: a fresh connection
    assert conn_ids[4] == conn_ids[3]
    assert conn_ids[5] not in conn_ids[:5]


async def test_a_node_that_closes_after_streams_gets_no_strike(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    """The race with a network node was a failover and a breaker strike the node did not
    earn: none now (node-b would answer any request failed over from node-a)."""
    from tests.test_forwarding import MODEL as NODE_MODEL
    from tests.test_forwarding import STATS, pool

    gw, (_, b) = await pool(nursery, start_gateway, short_tmp, chat_answers(lambda n: True),
                            chat_answers(lambda n: True))
    results = await run_transitions(gw.unix, 20, NODE_MODEL, time_limit=60)
    assert_no_failures(results, 20)
    stats = (await request(gw.unix, "GET", STATS)).json()
    node_a = stats["nodes"][0]
    assert (node_a["fingerprint"], node_a["successCount"]) == ("node-a", 61)
    assert (node_a["failureCount"], node_a["consecutiveFailures"]) == (0, 0)
    assert stats["failovers"] == 0
    assert b.requests_to(CHAT) == []
