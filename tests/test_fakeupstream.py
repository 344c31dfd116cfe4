"""Tests of the fake upstream itself, with a minimal raw-socket h11 client."""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trio.testing

from tests.client import connect
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    close_mid_stream,
    json_completion,
    reset_mid_stream,
    sse_events,
    sse_stream,
    stall_before_first_chunk,
    stall_before_head,
    stall_between_chunks,
    status,
)

T = 5  # generous bound on every wait; real runs take milliseconds


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    chunks: list[bytes] = field(default_factory=list)  # HTTP chunks, as framed on the wire
    body: bytes = b""
    complete: bool = False

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One HTTP/1.1 connection driven by h11 in the client role."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str) -> Client:
        return cls(await connect(url))

    async def send_request(self, method: str, target: str, body: bytes = b"",
                           headers: list[tuple[str, str]] | None = None) -> None:
        if self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
        hdrs = [("Host", "fake"), ("Content-Length", str(len(body))), *(headers or [])]
        data = self.h.send(h11.Request(method=method, target=target, headers=hdrs)) or b""
        if body:
            data += self.h.send(h11.Data(data=body)) or b""
        data += self.h.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)

    async def read_response(self, resp: Response | None = None) -> Response:
        """Read until the response ends.  On EOF mid-body returns it with complete=False;
        pass ``resp`` to collect into an object you can inspect if this raises."""
        while True:
            event = self.h.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                if not data and resp is not None and resp.status:
                    return resp
                self.h.receive_data(data)
            elif isinstance(event, h11.Response):
                hdrs = {k.decode(): v.decode() for k, v in event.headers}
                resp = resp or Response(0, {})
                resp.status, resp.headers = event.status_code, hdrs
            elif isinstance(event, h11.Data):
                assert resp is not None
                resp.body += event.data
                if event.chunk_start or not resp.chunks:
                    resp.chunks.append(b"")
                resp.chunks[-1] += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert resp is not None
                resp.complete = True
                return resp
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def request(self, method: str, target: str, body: bytes = b"",
                      headers: list[tuple[str, str]] | None = None) -> Response:
        await self.send_request(method, target, body, headers)
        return await self.read_response()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def test_models_list_and_keepalive_reuse() -> None:
    up = FakeUpstream(models=["a", "b"])
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("GET", "/v1/models")
            assert r.status == 200
            assert r.headers["content-type"].startswith("application/json")
            body = r.json()
            assert body["object"] == "list"
            assert [m["id"] for m in body["data"]] == ["a", "b"]
            assert {m["owned_by"] for m in body["data"]} == {"llamacpp"}
            up.models = ["c"]
            r2 = await c.request("GET", "/v1/models?x=1")
            assert [m["id"] for m in r2.json()["data"]] == ["c"]
        await c.aclose()
    assert up.connections_opened == 1
    assert [r.conn_id for r in up.requests] == [1, 1]
    assert up.requests[1].target == "/v1/models?x=1"


async def test_unknown_route_is_404_and_routes_are_replaced() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", status(500))
    up.on("POST", "/v1/chat/completions", json_completion("hello"))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("GET", "/nope")
            assert r.status == 404
            assert r.json()["error"]["code"] == 404
            r = await c.request("POST", "/v1/chat/completions", b'{"model":"x"}')
            assert r.status == 200
            assert r.json()["choices"][0]["message"]["content"] == "hello"
            assert r.json()["object"] == "chat.completion"
        await c.aclose()


async def test_requests_are_recorded() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", json_completion())
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            await c.request("POST", "/v1/chat/completions", b'{"stream":false}',
                            [("X-Trace", "Abc")])
        await c.aclose()
    (req,) = up.requests
    assert isinstance(req, ReceivedRequest)
    assert (req.method, req.target, req.body) == ("POST", "/v1/chat/completions",
                                                  b'{"stream":false}')
    assert (b"x-trace", b"Abc") in req.headers
    assert req.header("X-TRACE") == "Abc"
    assert req.json() == {"stream": False}


async def test_error_status() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", status(503, {"error": {"code": 503, "message": "x"}}))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("POST", "/v1/chat/completions", b"{}")
        await c.aclose()
    assert r.status == 503
    assert r.json() == {"error": {"code": 503, "message": "x"}}


async def test_sse_stream_one_chunk_per_event() -> None:
    events = sse_events(2)
    assert len(events) == 3
    assert events[-1] == b"data: [DONE]\n\n"
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", sse_stream(events))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("POST", "/v1/chat/completions", b'{"stream":true}')
            r2 = await c.request("GET", "/health")  # still keep-alive after the stream
        await c.aclose()
    assert r.complete
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["x-accel-buffering"] == "no"
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.chunks == events
    assert r2.json() == {"status": "ok"}
    assert up.connections_opened == 1


async def test_sse_events_are_llama_like() -> None:
    events = sse_events(4, model="m")
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert all(b"\r" not in e and b": " not in e[6:] for e in events)  # compact JSON
    objs = [json.loads(e[6:]) for e in events[:-1]]
    assert [o["object"] for o in objs] == ["chat.completion.chunk"] * 4
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [o["choices"][0]["delta"].get("content") for o in objs[1:3]] == ["tok1 ", "tok2 "]
    assert objs[-1]["choices"][0] == {"finish_reason": "stop", "index": 0, "delta": {}}
    assert {o["model"] for o in objs} == {"m"}


async def test_sse_stream_grouped_chunks_and_then_close() -> None:
    events = sse_events(3)
    up = FakeUpstream()
    up.on("POST", "/s", sse_stream(events, chunked_groups=[[0, 1], [2, 3]], then_close=True))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("POST", "/s")
            assert await c.stream.receive_some(10) == b""  # the server closed after it
        await c.aclose()
    assert r.chunks == [events[0] + events[1], events[2] + events[3]]


async def test_pipelined_requests_are_answered_in_order() -> None:
    up = FakeUpstream()
    up.on("POST", "/a", json_completion("one"))
    up.on("POST", "/b", json_completion("two"))
    async with up.running():
        stream = await connect(up.url)
        raw = (b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
               b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n[1]")
        await stream.send_all(raw)
        c = Client(stream)
        c.h.send(h11.Request(method="POST", target="/a", headers=[("Host", "x")]))
        c.h.send(h11.EndOfMessage())
        with trio.fail_after(T):
            r1 = await c.read_response()
            c.h.start_next_cycle()
            c.h.send(h11.Request(method="POST", target="/b", headers=[("Host", "x")]))
            c.h.send(h11.EndOfMessage())
            r2 = await c.read_response()
        await stream.aclose()
    assert r1.json()["choices"][0]["message"]["content"] == "one"
    assert r2.json()["choices"][0]["message"]["content"] == "two"
    assert [(r.path, r.body) for r in up.requests] == [("/a", b"{}"), ("/b", b"[1]")]


async def test_connection_close_request_closes() -> None:
    up = FakeUpstream()
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("GET", "/health", headers=[("Connection", "close")])
            assert await c.stream.receive_some(10) == b""
            assert 1 in up.ended_at
        await c.aclose()
    assert r.status == 200
    assert up.closed_at == {}  # the server closed it, not the peer


async def test_reset_mid_stream_gives_connection_reset() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", reset_mid_stream(after=2))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T), pytest.raises(trio.BrokenResourceError):
            await c.request("POST", "/v1/chat/completions", b"{}")
        await c.aclose()
    assert up.closed_at == {}


async def test_close_mid_stream_is_a_clean_eof_without_last_chunk() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", close_mid_stream(after=2))
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            await c.send_request("POST", "/v1/chat/completions", b"{}")
            r = await c.read_response(Response(0, {}))
        await c.aclose()
    assert r.status == 200
    assert not r.complete
    assert r.chunks == sse_events(3)[:2]


async def test_handler_without_a_response_closes_connection() -> None:
    async def nothing(req: ReceivedRequest, w: ResponseWriter) -> None:
        return None

    up = FakeUpstream()
    up.on("GET", "/x", nothing)
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            await c.send_request("GET", "/x")
            assert await c.stream.receive_some(10) == b""
        await c.aclose()


async def read_head_and_chunks(c: Client, n: int) -> list[bytes]:
    """Read the response head and then ``n`` complete chunks."""
    chunks: list[bytes] = []
    head = chunk_done = False
    while not head or len(chunks) < n or (chunks and not chunk_done):
        event = c.h.next_event()
        if event is h11.NEED_DATA:
            c.h.receive_data(await c.stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            head = True
        elif isinstance(event, h11.Data):
            if event.chunk_start:
                chunks.append(b"")
            chunks[-1] += event.data
            chunk_done = event.chunk_end
    return chunks


@pytest.mark.parametrize(("handler", "n_chunks"), [
    (stall_before_head(), None), (stall_before_first_chunk(), 0), (stall_between_chunks(2), 2),
])
async def test_stall_then_client_close_is_recorded(handler: Any, n_chunks: int | None) -> None:
    started, cancelled = trio.Event(), trio.Event()

    async def wrapped(req: ReceivedRequest, w: ResponseWriter) -> None:
        started.set()
        try:
            await handler(req, w)
        finally:
            cancelled.set()

    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", wrapped)
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            await c.send_request("POST", "/v1/chat/completions", b"{}")
            await started.wait()
            if n_chunks is not None:
                assert len(await read_head_and_chunks(c, n_chunks)) == n_chunks
            t0 = trio.current_time()
            await c.aclose()
            t_closed = await up.wait_connection_closed(1)
            await cancelled.wait()
    assert 0 <= t_closed - t0 < 0.1
    assert up.closed_at == {1: t_closed}
    assert len(up.requests) == 1


# Under the autojump clock the fake listens on a Unix socket: its bytes (and a close) are at
# the peer when the call returns, so the clock never jumps ahead of them.


async def test_never_read_connection(autojump_clock: trio.testing.MockClock,
                                     short_tmp: Path) -> None:
    up = FakeUpstream(never_read=True, unix_path=str(short_tmp / "up.sock"))
    async with up.running():
        c = await Client.open(up.url)
        await c.send_request("GET", "/v1/models")
        with trio.move_on_after(30) as scope:
            await c.stream.receive_some(10)
        assert scope.cancelled_caught  # no answer
        t0 = trio.current_time()
        await c.aclose()
        with trio.fail_after(T):
            assert await up.wait_connection_closed(1) == t0
        up.never_read = False  # later connections are served again
        c2 = await Client.open(up.url)
        with trio.fail_after(T):
            assert (await c2.request("GET", "/health")).status == 200
        await c2.aclose()
    assert [r.conn_id for r in up.requests] == [2]
    assert up.connections_opened == 2


async def test_unix_socket(tmp_path: Any) -> None:
    path = str(tmp_path / "up.sock")
    up = FakeUpstream(unix_path=path, models=["u"])
    async with up.running():
        assert up.url == f"unix:{path}"
        c = await Client.open(up.url)
        with trio.fail_after(T):
            r = await c.request("GET", "/v1/models")
        await c.aclose()
        with trio.fail_after(T):
            await up.wait_connection_closed(1)
    assert [m["id"] for m in r.json()["data"]] == ["u"]
    assert not await trio.Path(path).exists()


async def test_unix_socket_stale_file_is_replaced(tmp_path: Any) -> None:
    path = str(tmp_path / "stale.sock")
    async with FakeUpstream(unix_path=path).running():
        pass
    async with FakeUpstream(unix_path=path).running() as up:
        c = await Client.open(up.url)
        with trio.fail_after(T):
            assert (await c.request("GET", "/health")).status == 200
        await c.aclose()


async def test_mock_clock_gaps_and_close(autojump_clock: trio.testing.MockClock,
                                        short_tmp: Path) -> None:
    up = FakeUpstream(unix_path=str(short_tmp / "up.sock"))
    up.on("POST", "/s", sse_stream(sse_events(3), gap=10))
    up.on("POST", "/stall", stall_between_chunks(1))
    async with up.running():
        c = await Client.open(up.url)
        t0 = trio.current_time()
        with trio.fail_after(100):
            r = await c.request("POST", "/s")
        assert trio.current_time() - t0 == pytest.approx(30)
        assert len(r.chunks) == 4
        await c.send_request("POST", "/stall")
        await trio.sleep(1000)  # virtual: the fake stalls the whole time
        t1 = trio.current_time()
        await c.aclose()
        with trio.fail_after(1):
            assert await up.wait_connection_closed(1) == t1
    assert len(up.requests) == 2


async def test_close_during_gap_cancels_handler(autojump_clock: trio.testing.MockClock,
                                                short_tmp: Path) -> None:
    finished = trio.Event()
    stream_handler = sse_stream(sse_events(5), gap=10)

    async def wrapped(req: ReceivedRequest, w: ResponseWriter) -> None:
        try:
            await stream_handler(req, w)
        finally:
            finished.set()

    up = FakeUpstream(unix_path=str(short_tmp / "up.sock"))
    up.on("POST", "/s", wrapped)
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(100):
            await c.send_request("POST", "/s")
            assert await read_head_and_chunks(c, 2) == sse_events(5)[:2]
            t0 = trio.current_time()
            await c.aclose()
            assert await up.wait_connection_closed(1) == t0
            await finished.wait()
            assert trio.current_time() == t0  # cancelled mid-gap, not after it


async def test_client_reset_is_recorded() -> None:
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", stall_before_first_chunk())
    async with up.running():
        c = await Client.open(up.url)
        with trio.fail_after(T):
            await c.send_request("POST", "/v1/chat/completions", b"{}")
            await read_head_and_chunks(c, 0)
            c.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            t0 = trio.current_time()
            await c.aclose()
            assert await up.wait_connection_closed(1) - t0 < 0.1
