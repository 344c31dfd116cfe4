"""The live events WebSocket ``GET /api/v1/events`` (SPEC §9.3) on a real gateway, with
trio-websocket clients over TCP and over the Unix socket, and a raw wsproto client where a
test must see (or withhold) what trio-websocket does by itself: pings, pongs, reading."""

from __future__ import annotations

import itertools
import json
import logging
import re
import statistics
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import pytest
import trio
import trio.lowlevel
import trio_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage

from protocol.http1 import build_request_head
from protocol.request_record import RequestRecord
from proxy.observe import event_socket, feed
from proxy.observe.feed import CLOSE_TIMEOUT, QUEUE_FRAMES
from proxy.replay_stream import ReplayStream
from tests.client import Client, chat_body, connect, raw, request
from tests.conftest import REMOTE, RunningGateway, StartGateway
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.figures import Figures
from tests.waits import settled

PATH = "/api/v1/events"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
WAIT = 10  # seconds: a generous bound for things that take milliseconds


# ------------------------------------------------------------------------------ clients

@asynccontextmanager
async def subscribe(gw: RunningGateway, transport: str,
                    headers: list[tuple[bytes, bytes]] | None = None
                    ) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client of the feed over TCP or over the Unix socket. (On a stream
    of its own: trio-websocket leaves a client's stream open when the server closes.)"""
    stream = await connect(gw.address(transport))
    try:
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(nursery, stream, "localhost", PATH,
                                                         extra_headers=headers)
            try:
                yield ws
            finally:
                with trio.move_on_after(WAIT):
                    await ws.aclose()
    finally:
        await stream.aclose()


async def refusal(stream: trio.SocketStream, headers: list[tuple[bytes, bytes]]
                  ) -> trio_websocket.ConnectionRejected:
    """The refusal a trio-websocket client gets for this handshake (the stream is closed
    here: trio-websocket leaves a refused one open)."""
    refused: list[BaseException] = []
    try:
        async with trio.open_nursery() as nursery:
            await trio_websocket.wrap_client_stream(nursery, stream, "localhost", PATH,
                                                    extra_headers=headers)
    except* trio_websocket.ConnectionRejected as group:
        refused.extend(group.exceptions)
    finally:
        await stream.aclose()
    assert len(refused) == 1, "a WebSocket was opened"
    assert isinstance(refused[0], trio_websocket.ConnectionRejected)
    return refused[0]


async def frame(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(WAIT):
        doc: dict[str, Any] = json.loads(await ws.get_message())
    return doc


async def frame_of(ws: trio_websocket.WebSocketConnection, kind: str) -> dict[str, Any]:
    """The next frame of this type (the gateway may publish others meanwhile)."""
    while (doc := await frame(ws))["type"] != kind:
        pass
    return doc


async def read_until_closed(ws: trio_websocket.WebSocketConnection,
                            into: list[dict[str, Any]] | None = None
                            ) -> trio_websocket.CloseReason:
    """Read frames (kept in ``into``) until the server closes; its close reason."""
    reason = None
    try:
        while True:
            doc = await frame(ws)
            if into is not None:
                into.append(doc)
    except trio_websocket.ConnectionClosed as closed:
        reason = closed.reason
    assert reason is not None
    return reason


class RawFeed:
    """A wsproto client on a plain stream: it reads only when told to, and answers pings
    only when asked (``pong``)."""

    def __init__(self, stream: trio.SocketStream, pong: bool) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.pending: deque[object] = deque()
        self.pong = pong
        self.pings = 0

    @classmethod
    async def open(cls, address: str, *, pong: bool = True) -> RawFeed:
        feed = cls(await connect(address), pong)
        await feed.stream.send_all(feed.ws.send(Request(host="localhost", target=PATH)))
        assert isinstance(await feed.event(), AcceptConnection)
        return feed

    async def _read(self) -> bool:
        """Read once: pings are counted (and answered if ``pong``), other events kept.
        False at the end of the stream."""
        data = await self.stream.receive_some(65536)
        if not data:
            return False
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, Ping):
                self.pings += 1
                if self.pong:
                    await self.stream.send_all(self.ws.send(event.response()))
            else:
                self.pending.append(event)
        return True

    async def event(self) -> object:
        """The next WebSocket event but a ping; None at the end of the stream."""
        while not self.pending:
            if not await self._read():
                return None
        return self.pending.popleft()

    async def wait_pings(self, count: int) -> None:
        while self.pings < count:
            assert await self._read(), "the connection ended"

    async def frame(self) -> dict[str, Any] | None:
        """The next text frame as JSON; None when the connection ends."""
        parts: list[str] = []
        while True:
            event = await self.event()
            if event is None or isinstance(event, CloseConnection):
                return None
            if isinstance(event, TextMessage):  # a message may come in pieces
                parts.append(event.data)
                if event.message_finished:
                    doc: dict[str, Any] = json.loads("".join(parts))
                    return doc


async def subscribed(gw: RunningGateway, count: int) -> None:
    """Wait until the gateway has ``count`` events subscribers."""
    await settled(lambda: len(gw.gateway.ctx.events) == count, f"{count} subscribers", WAIT)


def record(n: int = 1) -> RequestRecord:
    return RequestRecord(
        id=f"req-{n}", started_at=1_700_000_000.25, method="POST", path="/v1/chat/completions",
        model="fake-model", stream=True, transport="tcp", served_by="local:fake", status=200,
        outcome="success", failover=None, ttfb=0.012, duration=0.5, bytes_out=1234, events=7,
        usage={"prompt_tokens": 5, "completion_tokens": 6}, error=None,
        attempts=(("local:fake", "success"),), routed=True)


# ------------------------------------------------------------------------------ hello, events

async def test_hello_comes_first_with_every_field(start_gateway: StartGateway,
                                                  upstream: FakeUpstream, transport: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice.access")
    gw = await start_gateway([("fake", upstream.url)])
    gets = {path: (await request(gw.unix, "GET", path)).json() for path in (
        "/api/v1/node/identity", "/api/v1/inference/status", "/api/v1/pool/distributed-status",
        "/api/v1/pool/routing-stats", "/api/v1/settings/load-balancing",
        "/api/v1/settings/timeouts", "/api/v1/settings/api", "/api/v1/settings/aliases",
        "/api/v1/settings/discovery", "/api/v1/notifications", "/api/v1/models/local")}
    async with subscribe(gw, transport) as ws:
        hello = await frame(ws)
        assert hello["type"] == "hello", hello
        assert ISO.match(hello["at"])
        data = hello["data"]
        assert set(data) == {"fingerprint", "version", "identity", "status", "pool", "stats",
                             "settings", "notifications", "localModels"}
        assert {"fingerprint": data["fingerprint"], "version": data["version"],
                "identity": data["identity"]} == gets["/api/v1/node/identity"]
        assert data["status"] == gets["/api/v1/inference/status"]
        assert data["status"]["loadedModels"] == 1
        assert data["pool"] == gets["/api/v1/pool/distributed-status"]
        assert data["stats"] == gets["/api/v1/pool/routing-stats"]
        assert data["settings"] == {"loadBalancing": gets["/api/v1/settings/load-balancing"],
                                    "aliases": gets["/api/v1/settings/aliases"],
                                    "timeouts": gets["/api/v1/settings/timeouts"],
                                    "api": gets["/api/v1/settings/api"],
                                    "discovery": gets["/api/v1/settings/discovery"]}
        assert data["notifications"] == gets["/api/v1/notifications"]["notifications"]
        # SPEC §9.3: the Local models screen draws from the hello after every reconnect.
        assert data["localModels"] == gets["/api/v1/models/local"]
        assert set(data["localModels"]) >= {"models", "memoryBudget", "memoryInUse"}
        assert any(name == b"x-sluice-request-id" for name, _ in ws.handshake_headers)
        gw.gateway.hub.drain()  # access lines are written in the hub's batches
        assert any("GET /api/v1/events" in line and "status=101" in line
                   for line in caplog.messages)
        # The WebSocket is a client connection like any other.
        assert gw.gateway.ctx.connection_count == 1
    await settled(lambda: not gw.gateway.ctx.connection_count, "the connection closed", WAIT)


async def test_published_events_arrive(start_gateway: StartGateway, transport: str) -> None:
    gw = await start_gateway([])
    hub = gw.gateway.ctx.hub
    async with subscribe(gw, transport) as ws:
        await frame_of(ws, "hello")
        note = {"code": "test_note", "level": "warning", "message": "über", "createdAt": "x"}
        hub.publish("notification", note)
        got = await frame_of(ws, "notification")
        assert got["data"] == note
        assert ISO.match(got["at"])
        hub.publish("request", record(7))
        got = await frame_of(ws, "request")
        assert got["data"] == record(7).to_json()
        for kind in ("node", "circuit", "settings", "stats", "model"):
            hub.publish(kind, {"kind": kind})
            assert (await frame_of(ws, kind))["data"] == {"kind": kind}


async def test_a_burst_of_events_goes_out_in_order_as_separate_messages(
        start_gateway: StartGateway, transport: str) -> None:
    """Events published together are written together (one socket write for the batch),
    each still its own WebSocket message, in order."""
    gw = await start_gateway([])
    hub = gw.gateway.ctx.hub
    async with subscribe(gw, transport) as ws:
        await frame_of(ws, "hello")
        (subscriber,) = gw.gateway.ctx.events.subscribers
        sent_before = subscriber.sent
        for n in range(50):  # in one step: the sender takes them all at once
            hub.publish("notification", {"code": f"burst_{n}"})
        got = [await frame_of(ws, "notification") for _ in range(50)]
        assert [g["data"]["code"] for g in got] == [f"burst_{n}" for n in range(50)]
        assert subscriber.sent - sent_before == 50
        hub.publish("notification", {"code": "after"})  # and the one after it, alone
        assert (await frame_of(ws, "notification"))["data"] == {"code": "after"}


async def test_a_finished_request_arrives(start_gateway: StartGateway,
                                          transport: str) -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", sse_stream(sse_events(3)))
    async with trio.open_nursery() as nursery:
        await nursery.start(up.serve)
        gw = await start_gateway([("fake", up.url)])
        async with subscribe(gw, transport) as ws:
            await frame_of(ws, "hello")
            reply = await request(gw.address(transport), "POST", "/v1/chat/completions",
                                  chat_body(stream=True))
            assert reply.status == 200
            got = (await frame_of(ws, "request"))["data"]
            assert got["id"] == reply.header("x-sluice-request-id")
            assert (got["path"], got["status"], got["servedBy"], got["transport"]) == \
                ("/v1/chat/completions", 200, "local:fake", transport)
        nursery.cancel_scope.cancel()


async def test_the_replay_stream_gives_the_head_then_the_socket() -> None:
    """What the connection hands over: the rebuilt head and the bytes read after it, then
    the socket's bytes; writes go to the socket. (The WebSocket itself ignores a client's
    bytes sent before our 101, as RFC 6455 §4.1 has clients wait for it.)"""
    a, b = trio.socket.socketpair()
    ours, theirs = trio.SocketStream(a), trio.SocketStream(b)
    head = build_request_head(b"GET", b"/api/v1/events?x=1", [(b"host", b"localhost"),
                                                                (b"upgrade", b"websocket")])
    assert head == (b"GET /api/v1/events?x=1 HTTP/1.1\r\nhost: localhost\r\n"
                    b"upgrade: websocket\r\n\r\n")
    stream = ReplayStream(ours, head + b"early", eof=False)
    assert await stream.receive_some(10) == head[:10]
    assert await stream.receive_some() == head[10:] + b"early"
    await theirs.send_all(b"later")
    assert await stream.receive_some(100) == b"later"
    await stream.send_all(b"answer")
    assert await theirs.receive_some(100) == b"answer"
    await stream.aclose()
    assert await theirs.receive_some(100) == b""
    await theirs.aclose()
    ended = ReplayStream(theirs, b"last", eof=True)  # the client had closed its side
    assert await ended.receive_some() == b"last"
    assert await ended.receive_some() == b""


async def test_hundred_subscribers_all_get_an_event(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    ready = 0
    got: list[dict[str, Any]] = []
    all_ready = trio.Event()

    async def one(i: int) -> None:
        nonlocal ready
        async with subscribe(gw, "tcp" if i % 2 else "unix") as ws:
            await frame_of(ws, "hello")
            ready += 1
            if ready == 100:
                all_ready.set()
            got.append(await frame_of(ws, "notification"))

    async with trio.open_nursery() as nursery:
        for i in range(100):
            nursery.start_soon(one, i)
        with trio.fail_after(WAIT * 3):
            await all_ready.wait()
        assert len(gw.gateway.ctx.events) == 100
        gw.gateway.ctx.hub.publish("notification", {"code": "all"})
    assert len(got) == 100
    assert all(g["data"] == {"code": "all"} for g in got)
    await subscribed(gw, 0)


# ------------------------------------------------------------------------------ slow readers

async def test_a_subscriber_that_never_reads_slows_nobody_then_gets_resync(
        start_gateway: StartGateway, figures: Figures) -> None:
    """A stream's chunk gaps, with a healthy subscriber reading while events are published,
    then the same with a second subscriber that never reads (its queue overflows): the gaps
    stay about the same (a ratio: the machine is shared), the healthy subscriber loses
    nothing, and the stuck one, once it reads, gets ``resync`` then the newest frames."""
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", sse_stream(sse_events(40), gap=0.01))
    async with trio.open_nursery() as nursery:
        await nursery.start(up.serve)
        gw = await start_gateway([("fake", up.url)])
        hub = gw.gateway.ctx.hub
        seq = 0
        filler = "x" * 2000

        async def publish(stop: trio.Event, done: trio.Event) -> None:
            nonlocal seq
            while not stop.is_set():
                for _ in range(5):
                    hub.publish("notification", {"seq": seq, "filler": filler})
                    seq += 1
                await trio.sleep(0.005)  # the publisher's pace (part of the scenario)
            done.set()

        async def stream_gaps() -> list[float]:
            client = await Client.open(gw.tcp)
            try:
                await client.send_request("POST", "/v1/chat/completions",
                                          chat_body(stream=True))
                head = await client.read_head()
                assert head.status_code == 200
                times = []
                while True:
                    event = client.h11.next_event()
                    if isinstance(event, h11.EndOfMessage):
                        break
                    if isinstance(event, h11.Data):
                        times.append(trio.current_time())
                        continue
                    client.h11.receive_data(await client.stream.receive_some(65536))
                return [b - a for a, b in itertools.pairwise(times)]
            finally:
                await client.aclose()

        healthy: list[dict[str, Any]] = []

        async def read_healthy(ws: trio_websocket.WebSocketConnection) -> None:
            await read_until_closed(ws, healthy)

        async with subscribe(gw, "tcp") as ws:
            nursery.start_soon(read_healthy, ws)
            stop = trio.Event()
            nursery.start_soon(publish, stop, trio.Event())
            alone = await stream_gaps()
            stop.set()
            stuck = await RawFeed.open(gw.unix)  # reads its 101, then nothing
            await subscribed(gw, 2)
            stuck_sub = gw.gateway.ctx.events.subscribers[1]
            stop, stopped = trio.Event(), trio.Event()
            nursery.start_soon(publish, stop, stopped)
            beside = await stream_gaps()
            await settled(lambda: bool(stuck_sub.lost), "the stuck one's queue overflowed", WAIT)
            stop.set()
            await stopped.wait()
            hub.publish("notification", {"seq": "last"})
            await settled(lambda: bool(healthy) and healthy[-1]["data"].get("seq") == "last",
                          "the last event at the healthy subscriber", WAIT)
            # The stuck one now reads: what its kernel buffers held, then resync, then the
            # newest frames, up to the last.
            seen = []
            with trio.fail_after(WAIT):
                while (doc := await stuck.frame()) is not None:
                    seen.append(doc)
                    if doc["data"].get("seq") == "last":
                        break
            await stuck.stream.aclose()
        nursery.cancel_scope.cancel()
    ratio = statistics.median(beside) / statistics.median(alone)
    figures.note("events_stuck_subscriber_gap_ratio", {
        "median_gap_alone_ms": round(statistics.median(alone) * 1000, 2),
        "median_gap_beside_stuck_ms": round(statistics.median(beside) * 1000, 2),
        "published": seq, "stuck_frames_after_resync": len(seen) - 1})
    assert ratio < 3, (statistics.median(alone), statistics.median(beside))
    kinds = [d["type"] for d in healthy]
    assert "resync" not in kinds
    seqs = [d["data"]["seq"] for d in healthy if d["type"] == "notification"]
    assert seqs == [*range(seq), "last"]  # the healthy subscriber lost nothing
    assert [d["type"] for d in seen].count("resync") == 1, [d["type"] for d in seen][:5]
    cut = [d["type"] for d in seen].index("resync")
    before, after = seen[:cut], seen[cut + 1:]
    assert before[0]["type"] == "hello"
    assert len(after) <= QUEUE_FRAMES
    earlier = [d["data"]["seq"] for d in before if d["type"] == "notification"]
    numbers = [d["data"]["seq"] for d in after if d["type"] == "notification"][:-1]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # the newest ones
    assert numbers[-1] == seq - 1
    assert earlier[-1] < numbers[0] - 1  # the oldest were lost


# ------------------------------------------------------------------------------ access

async def test_foreign_origin_is_refused_at_the_handshake(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    refused = await refusal(await connect(gw.tcp), [(b"origin", b"http://evil.example")])
    assert refused.status_code == 403
    assert json.loads(refused.body or b"{}")["error"]["code"] == "forbidden_origin"
    assert len(gw.gateway.ctx.events) == 0
    origin = f"http://localhost:{gw.gateway.ctx.tcp_port}".encode()
    async with subscribe(gw, "tcp", [(b"origin", origin)]) as ws:
        assert (await frame(ws))["type"] == "hello"


@pytest.mark.usefixtures("remote_seam")
async def test_a_remote_client_needs_a_key(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])

    async def remote_stream() -> trio.SocketStream:
        return await connect(gw.tcp, source=REMOTE)

    refused = await refusal(await remote_stream(), [])
    assert refused.status_code == 401
    assert json.loads(refused.body or b"{}")["error"]["code"] == "missing_api_key"
    assert len(gw.gateway.ctx.events) == 0
    async with trio.open_nursery() as nursery:
        token = gw.gateway.settings.secrets.admin_token
        ws = await trio_websocket.wrap_client_stream(
            nursery, await remote_stream(), "localhost", PATH,
            extra_headers=[(b"authorization", f"Bearer {token}".encode())])
        assert (await frame(ws))["type"] == "hello"
        await ws.aclose()


async def test_requests_that_are_no_websocket_handshake(start_gateway: StartGateway,
                                                       transport: str) -> None:
    gw = await start_gateway([])
    address = gw.address(transport)
    plain = await request(address, "GET", PATH)
    assert plain.status == 426
    assert plain.header("upgrade") == "websocket"
    assert plain.json()["error"]["code"] == "upgrade_required"
    head = (b"GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\n")
    old = await raw(address, head + b"Sec-WebSocket-Version: 8\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert old.status == 426
    assert old.header("sec-websocket-version") == "13"
    keyless = await raw(address, head + b"Sec-WebSocket-Version: 13\r\n\r\n")
    assert keyless.status == 400
    assert json.loads(keyless.body)["error"]["code"] == "bad_websocket_handshake"
    post = await request(address, "POST", PATH, b"{}")
    assert post.status in (401, 405)
    assert len(gw.gateway.ctx.events) == 0


# ------------------------------------------------------------------------------ lifetime

async def test_a_closing_client_is_unsubscribed_at_once(start_gateway: StartGateway,
                                                        transport: str) -> None:
    gw = await start_gateway([])
    async with subscribe(gw, transport) as ws:
        await frame_of(ws, "hello")
        await subscribed(gw, 1)
        assert gw.gateway.ctx.hub.wants("node")
    await subscribed(gw, 0)
    assert not gw.gateway.ctx.hub.wants("node")  # nobody watches: the hub skips the feed
    feed = await RawFeed.open(gw.address(transport))
    await subscribed(gw, 1)
    await feed.stream.aclose()  # no close frame: the end of the stream is enough
    await subscribed(gw, 0)


async def test_gateway_shutdown_sends_1001(start_gateway: StartGateway,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # CLOSE_TIMEOUT shortened: the test waits it out in real time; the two answering clients'
    # close handshakes must fit in it on a machine busy with other test workers.
    close_timeout = 1.5
    assert close_timeout < CLOSE_TIMEOUT
    monkeypatch.setattr(feed, "CLOSE_TIMEOUT", close_timeout)
    gw = await start_gateway([], drain_timeout=60)
    state = gw.gateway.settings.data_dir / "state.json"
    async with subscribe(gw, "tcp") as tcp, subscribe(gw, "unix") as unix:
        await frame_of(tcp, "hello")
        await frame_of(unix, "hello")
        stuck = await RawFeed.open(gw.unix)  # never reads again
        await subscribed(gw, 3)
        for i in range(2000):  # fill its socket buffers and its queue
            gw.gateway.ctx.hub.publish("notification", {"n": i, "filler": "y" * 1000})
            if i % 50 == 0:
                await trio.lowlevel.checkpoint()
        gw.gateway.shutdown()
        for ws in (tcp, unix):
            assert (await read_until_closed(ws)).code == 1001
        # The stuck subscriber holds the stop for CLOSE_TIMEOUT at most, not the drain's 60 s.
        await settled(lambda: not state.exists(), "the gateway stopped", close_timeout + WAIT)
        await stuck.stream.aclose()


async def test_pings_and_a_client_that_never_answers(start_gateway: StartGateway,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With a short ping interval: a client that answers is pinged again and again; one
    that reads but never answers is dropped by the next ping."""
    # Short, but long enough for the answering client's pong on a busy machine (a pong
    # later than the next ping drops it too).
    monkeypatch.setattr(event_socket, "PING_INTERVAL", 0.25)
    gw = await start_gateway([])
    answering = await RawFeed.open(gw.tcp)
    silent = await RawFeed.open(gw.unix, pong=False)
    await subscribed(gw, 2)
    assert (await answering.frame() or {}).get("type") == "hello"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answering.wait_pings, 1_000_000)  # reads on, answering pings
        with trio.fail_after(WAIT):
            while (await silent.frame()) is not None:  # reads on (pings too) until dropped
                pass
        assert silent.pings >= 1
        await subscribed(gw, 1)
        await settled(lambda: answering.pings >= silent.pings + 5, "five pings more", WAIT)
        assert len(gw.gateway.ctx.events) == 1  # the answering one is still subscribed
        nursery.cancel_scope.cancel()
    await answering.stream.aclose()
    await silent.stream.aclose()
