"""A fault-injecting fake OpenAI-compatible (llama.cpp-like) upstream for integration tests.

It is a real server on raw trio sockets (TCP on 127.0.0.1 with an ephemeral port, or a Unix
socket; the listener, accept loop and h11 reading are tools/serve_loop.py's, shared with the
fault-injection upstream), deterministic, and safe under
``trio.testing.MockClock(autojump_threshold=0)``: it only ever waits on sockets,
``trio.sleep`` and events.

Every connection has exactly one reader task.  It drains the socket into a buffer that the
connection's request loop feeds to h11 (so pipelined requests and close detection never steal
bytes from each other), and when it sees the peer close (EOF or reset) it records the time in
``closed_at``, wakes ``wait_connection_closed`` and cancels the running handler.

Usage: ``up = FakeUpstream(); up.on("POST", "/v1/chat/completions", sse_stream(sse_events(3)))``
then ``await nursery.start(up.serve)`` (or ``async with up.running():``) and use ``up.url``.
A handler that raises anything but a peer-gone error crashes ``serve`` (loud test failure).
Connection ids count from 1.  ``closed_at`` holds only closes by the peer (``ended_at``: any).
A request complete before the peer closed is recorded but its handler is not started.
``never_read`` connections still drain (and discard) bytes, so the peer's close is seen.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any, NoReturn

import h11
import trio

from tools.serve_loop import BadRequest, Request, ServeLoop, serve_requests

CREATED = 1_700_000_000  # fixed "created" timestamp: responses are byte-for-byte deterministic
LLAMA_JSON_HEADERS: list[tuple[str, str]] = [("Server", "llama.cpp"),
                                             ("Keep-Alive", "timeout=5, max=100")]
LLAMA_SSE_HEADERS: list[tuple[str, str]] = [*LLAMA_JSON_HEADERS, ("Content-Type",
                                            "text/event-stream"), ("X-Accel-Buffering", "no")]
_DONE = b"data: [DONE]\n\n"


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class ReceivedRequest:
    """One complete request as the fake received it."""

    method: str
    target: str
    headers: list[tuple[bytes, bytes]]  # names lowercased, in wire order
    body: bytes
    conn_id: int
    http_version: str = "1.1"
    received_at: float = 0.0  # trio.current_time() when the request was complete

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        """First value of a header (case-insensitive), or None."""
        key = name.lower().encode()
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[ReceivedRequest, "ResponseWriter"], Awaitable[None]]


class _Conn:
    def __init__(self, stream: trio.SocketStream, conn_id: int, never_read: bool) -> None:
        self.stream = stream
        self.conn_id = conn_id
        self.never_read = never_read
        self.buf = bytearray()
        self.eof = False  # the peer closed / reset the connection
        self.eof_event = trio.Event()
        self.we_closed = False  # this side closed it (reset/close/end of keep-alive)
        self.wakeup = trio.Event()
        self.handler_scope: trio.CancelScope | None = None

    async def take(self, head: h11.Request | None) -> bytes | None:
        """What the reader task has buffered, once there is some; None once the peer left."""
        while not self.buf:
            if self.eof:
                return None
            self.wakeup = trio.Event()
            await self.wakeup.wait()
        data = bytes(self.buf)
        self.buf.clear()
        return data


class ResponseWriter:
    """Low-level control over one response.  All sends go straight to the socket."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn
        self.bytes_sent = 0
        self.head_sent = False
        self.ended = False  # a framed body is complete (end() / json() / content-length met)
        self.closed = False  # close() or reset() was called
        self._remaining: int | None = None
        self._close_after = False

    @property
    def conn_id(self) -> int:
        return self._c.conn_id

    async def _send(self, data: bytes) -> None:
        if data:
            await self._c.stream.send_all(data)
            self.bytes_sent += len(data)

    async def send_raw(self, data: bytes) -> None:
        """Send exact bytes; you write the framing.  Counts toward a Content-Length body."""
        await self._send(data)
        if self.head_sent and self._remaining is not None:
            self._remaining -= len(data)
            if self._remaining <= 0:
                self.ended = True

    def _head_bytes(self, status: int, headers: Sequence[tuple[str, str]], chunked: bool,
                    content_length: int | None) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        lines = [f"HTTP/1.1 {status} {reason}"]
        names = {k.lower() for k, _ in headers}
        lines += [f"{k}: {v}" for k, v in headers]
        if content_length is not None:
            if "content-length" not in names:
                lines.append(f"Content-Length: {content_length}")
            self._remaining = content_length
            self.ended = content_length == 0
        elif chunked and "transfer-encoding" not in names:
            lines.append("Transfer-Encoding: chunked")
        for k, v in headers:
            if k.lower() == "connection" and "close" in v.lower():
                self._close_after = True
        self.head_sent = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def head(self, status: int, headers: Sequence[tuple[str, str]] = (), *,
                   chunked: bool = True, content_length: int | None = None) -> None:
        """Status line + headers.  Adds Content-Length if given, else Transfer-Encoding:
        chunked if ``chunked``; with neither the body is close-delimited."""
        await self._send(self._head_bytes(status, headers, chunked, content_length))

    async def chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (size line, data, CRLF) in a single send."""
        if not data:
            raise ValueError("an empty chunk would terminate the body; use end()")
        await self._send(b"%x\r\n%b\r\n" % (len(data), data))

    async def end(self) -> None:
        """The terminating zero-length chunk."""
        await self._send(b"0\r\n\r\n")
        self.ended = True

    async def json(self, status: int, obj: Any,
                   extra_headers: Sequence[tuple[str, str]] = ()) -> None:
        """A whole JSON response with Content-Length, head and body in one send."""
        body = _compact(obj)
        headers = [*extra_headers, ("Content-Type", "application/json; charset=utf-8")]
        head = self._head_bytes(status, headers, False, len(body))
        await self._send(head + body)
        self.ended = True

    async def reset(self) -> None:
        """Abortive close: SO_LINGER 0 then close, so a TCP peer sees ECONNRESET.
        (Unix sockets have no RST; there this is the same as close().)"""
        self._c.we_closed = self.closed = True
        if self._c.stream.socket.family in (socket.AF_INET, socket.AF_INET6):
            self._c.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
        await trio.aclose_forcefully(self._c.stream)

    async def close(self) -> None:
        """Clean close (FIN), whatever state the response is in."""
        self._c.we_closed = self.closed = True
        await trio.aclose_forcefully(self._c.stream)

    async def wait_next_request(self) -> None:
        """Until bytes of a next request arrive on this connection (or the peer closes)."""
        c = self._c
        while not c.buf and not c.eof:
            c.wakeup = trio.Event()
            await c.wakeup.wait()

    async def stall(self) -> NoReturn:
        """Wait forever: until the peer closes the connection or the server is cancelled."""
        await trio.sleep_forever()

    def keep_alive_ok(self) -> bool:
        if self.closed or self._close_after or self.bytes_sent == 0:
            return False
        if not self.head_sent:  # raw bytes only: the handler owns the framing
            return True
        return self.ended


# --------------------------------------------------------------------------- the server


class FakeUpstream:
    def __init__(self, *, models: Sequence[str] = ("fake-model",), unix_path: str | None = None,
                 never_read: bool = False) -> None:
        self.models: list[str] = list(models)
        self.unix_path = unix_path
        self.never_read = never_read  # applies to connections accepted while it is set
        self.requests: list[ReceivedRequest] = []
        self.closed_at: dict[int, float] = {}  # conn id -> when the server saw the peer close
        self.ended_at: dict[int, float] = {}  # conn id -> when the connection ended, any cause
        self._closed_events: dict[int, trio.Event] = {}
        self._routes: dict[tuple[str, str], Handler] = {}
        self._loop = ServeLoop(self._run_conn)
        self.on("GET", "/v1/models", self._models_handler)
        self.on("GET", "/health", _health)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` or ``unix:/path`` once serving, else ``""``."""
        return self._loop.url

    @property
    def connections_opened(self) -> int:
        """Connections accepted so far (the last one's id)."""
        return self._loop.accepted

    def on(self, method: str, path: str, handler: Handler) -> None:
        """Route ``method path`` (query string ignored) to ``handler``; replaces earlier ones."""
        self._routes[(method.upper(), path)] = handler

    def requests_to(self, path: str) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path == path]

    async def wait_connection_closed(self, conn_id: int) -> float:
        """trio time at which the peer closed connection ``conn_id`` (waits until it does)."""
        if conn_id not in self.closed_at:
            await self._closed_event(conn_id).wait()
        return self.closed_at[conn_id]

    def _closed_event(self, conn_id: int) -> trio.Event:
        return self._closed_events.setdefault(conn_id, trio.Event())

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeUpstream]:
        """``async with up.running(): ...`` serves for the duration of the block."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.serve)
            yield self
            nursery.cancel_scope.cancel()

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listen = "127.0.0.1:0" if self.unix_path is None else f"unix:{self.unix_path}"
        await self._loop.serve(listen, task_status=task_status)

    # ------------------------------------------------------------------- per connection

    async def _run_conn(self, stream: trio.SocketStream, conn_id: int) -> None:
        c = _Conn(stream, conn_id, self.never_read)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, c)
                if c.never_read:
                    await c.eof_event.wait()
                else:
                    await self._serve_requests(c)
                nursery.cancel_scope.cancel()
        finally:
            if not c.eof:
                c.we_closed = True
            self.ended_at[conn_id] = trio.current_time()
            stream.socket.close()

    async def _reader(self, c: _Conn) -> None:
        """The only task that receives on the socket."""
        try:
            while True:
                data = await c.stream.receive_some(65536)
                if not data:
                    break
                if not c.never_read:
                    c.buf += data
                c.wakeup.set()
        except trio.ClosedResourceError:  # this side closed the socket
            return
        except (trio.BrokenResourceError, OSError):  # reset by the peer
            pass
        self._peer_closed(c)

    def _peer_closed(self, c: _Conn) -> None:
        if c.eof or c.we_closed:
            return
        c.eof = True
        self.closed_at[c.conn_id] = trio.current_time()
        self._closed_event(c.conn_id).set()
        c.eof_event.set()
        c.wakeup.set()
        if c.handler_scope is not None:
            c.handler_scope.cancel()

    async def _serve_requests(self, c: _Conn) -> None:
        try:
            await serve_requests(c.take, partial(self._answer, c))
        except BadRequest:
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await c.stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0"
                                        b"\r\nConnection: close\r\n\r\n")

    async def _answer(self, c: _Conn, request: Request) -> bool:
        """Records the request and runs its handler; True to read the next one."""
        head = request.head
        req = ReceivedRequest(
            head.method.decode("ascii"), head.target.decode("latin-1"),
            [(k, v) for k, v in head.headers], request.body, c.conn_id,
            head.http_version.decode("ascii"), trio.current_time())
        self.requests.append(req)
        if c.eof:  # the peer already left: record the request, don't answer it
            return False
        handler = self._routes.get((req.method, req.path), _not_found)
        w = ResponseWriter(c)
        with trio.CancelScope() as scope:
            c.handler_scope = scope
            try:
                await handler(req, w)
            except trio.BrokenResourceError:
                self._peer_closed(c)
            except trio.ClosedResourceError:
                pass
            finally:
                c.handler_scope = None
        return not (c.eof or c.we_closed or not w.keep_alive_ok() or _wants_close(req))

    async def _models_handler(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        ollama = [{"name": m, "model": m, "type": "model", "capabilities": ["completion"]}
                  for m in self.models]
        data = [{"id": m, "object": "model", "created": CREATED, "owned_by": "llamacpp"}
                for m in self.models]
        await w.json(200, {"models": ollama, "object": "list", "data": data},
                     LLAMA_JSON_HEADERS)


def _wants_close(req: ReceivedRequest) -> bool:
    tokens = {t.strip().lower() for k, v in req.headers if k == b"connection"
              for t in v.split(b",")}
    if req.http_version == "1.0":
        return b"keep-alive" not in tokens
    return b"close" in tokens


async def _health(req: ReceivedRequest, w: ResponseWriter) -> None:
    await w.json(200, {"status": "ok"}, LLAMA_JSON_HEADERS)


async def _not_found(req: ReceivedRequest, w: ResponseWriter) -> None:
    err = {"code": 404, "message": "File Not Found", "type": "not_found_error"}
    await w.json(404, {"error": err}, LLAMA_JSON_HEADERS)


# --------------------------------------------------------------------------- ready-made


def _chunk_event(delta: dict[str, Any], finish: str | None, model: str) -> bytes:
    obj = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
           "created": CREATED, "id": "chatcmpl-fake", "model": model,
           "system_fingerprint": "b0-fake", "object": "chat.completion.chunk"}
    return b"data: " + _compact(obj) + b"\n\n"


def sse_events(n: int, model: str = "fake-model") -> list[bytes]:
    """``n`` llama.cpp-style chat.completion.chunk events, then ``data: [DONE]``.

    Event 0 is the role chunk (``"content": null``); with n >= 2 the last one is the finish
    chunk (``"delta": {}``, ``"finish_reason": "stop"``); those between carry the content
    ``"tok1 "``, ``"tok2 "``, ...  Result length is n + 1.
    """
    events = [_chunk_event({"content": f"tok{i} "}, None, model) for i in range(n)]
    if n >= 1:
        events[0] = _chunk_event({"role": "assistant", "content": None}, None, model)
    if n >= 2:
        events[-1] = _chunk_event({}, "stop", model)
    return [*events, _DONE]


def json_completion(text: str = "hi", model: str = "fake-model") -> Handler:
    """A non-streaming llama.cpp-like chat.completion response."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        choice = {"finish_reason": "stop", "index": 0,
                  "message": {"role": "assistant", "content": text}}
        await w.json(200, {
            "choices": [choice], "created": CREATED, "model": model,
            "system_fingerprint": "b0-fake", "object": "chat.completion",
            "usage": {"completion_tokens": 1, "prompt_tokens": 5, "total_tokens": 6},
            "id": "chatcmpl-fake"}, LLAMA_JSON_HEADERS)

    return handler


def sse_stream(events: Sequence[bytes], gap: float = 0,
               chunked_groups: Sequence[Sequence[int]] | None = None, *,
               then_close: bool = False) -> Handler:
    """A 200 text/event-stream chunked response: one HTTP chunk per event, or per group of
    event indexes in ``chunked_groups``; ``trio.sleep(gap)`` between chunks.  Events are sent
    as given (include ``data: [DONE]\\n\\n`` if wanted).  ``then_close`` closes the connection
    after the terminating chunk, as llama.cpp does after a streamed response."""
    groups = chunked_groups if chunked_groups is not None else [[i] for i in range(len(events))]
    chunks = [b"".join(events[i] for i in g) for g in groups]

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for i, data in enumerate(chunks):
            if i and gap:
                await trio.sleep(gap)
            await w.chunk(data)
        await w.end()
        if then_close:
            await w.close()

    return handler


def stall_before_head() -> Handler:
    """Reads the request, never answers."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.stall()

    return handler


def never_read() -> Handler:
    """Route-level "never answers" (the body was already read).  For a connection whose
    requests are never read at all use ``FakeUpstream(never_read=True)``."""
    return stall_before_head()


def _partial_stream(after: int, events: Sequence[bytes] | None,
                    finale: Callable[[ResponseWriter], Awaitable[None]]) -> Handler:
    """SSE head and the first ``after`` events (one chunk each), then ``finale``."""
    evs = list(events) if events is not None else sse_events(after + 1)[:-1]
    if after > len(evs):
        raise ValueError(f"after={after} but only {len(evs)} events")

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for data in evs[:after]:
            await w.chunk(data)
        await finale(w)

    return handler


def stall_before_first_chunk() -> Handler:
    """Sends the SSE head, then stalls."""
    return _partial_stream(0, None, ResponseWriter.stall)


def stall_between_chunks(after: int, events: Sequence[bytes] | None = None) -> Handler:
    """SSE head and ``after`` event chunks (default: from ``sse_events``), then stalls."""
    return _partial_stream(after, events, ResponseWriter.stall)


def reset_mid_stream(after: int, events: Sequence[bytes] | None = None) -> Handler:
    """SSE head and ``after`` event chunks, then an abortive close (RST)."""
    return _partial_stream(after, events, ResponseWriter.reset)


def close_mid_stream(after: int, events: Sequence[bytes] | None = None) -> Handler:
    """SSE head and ``after`` event chunks, then a clean FIN without the final chunk."""
    return _partial_stream(after, events, ResponseWriter.close)


def status(code: int, body_obj: Any = None) -> Handler:
    """A JSON response with status ``code``; by default a llama.cpp-style error body
    ``{"error": {"code": <int>, "message": ..., "type": "server_error"}}``."""
    if body_obj is None:
        try:
            message = HTTPStatus(code).phrase
        except ValueError:
            message = "error"
        body_obj = {"error": {"code": code, "message": message, "type": "server_error"}}

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(code, body_obj, LLAMA_JSON_HEADERS)

    return handler


KEEP_ALIVE = b":\n\n"  # llama.cpp's keep-alive comment while it processes a long prompt


def prefill_stream(prefill: float, events: Sequence[bytes], *, every: float = 30,
                   comment: bytes = KEEP_ALIVE, gaps: Sequence[float] = (),
                   then: Callable[[ResponseWriter], Awaitable[None]] | None = None) -> Handler:
    """llama.cpp on a long prompt: the SSE head at once, then ``comment`` every ``every``
    seconds until ``prefill`` seconds have passed, then ``events`` (one chunk each; before
    event i+1 it sleeps ``gaps[i]`` when given) and the end. ``then`` replaces what follows
    the comments (e.g. ``ResponseWriter.close``)."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        began = trio.current_time()
        while trio.current_time() + every - began < prefill:
            await trio.sleep(every)
            await w.chunk(comment)
        await trio.sleep_until(began + prefill)
        if then is not None:
            await then(w)
            return
        for i, event in enumerate(events):
            if i and i - 1 < len(gaps):
                await trio.sleep(gaps[i - 1])
            await w.chunk(event)
        await w.end()

    return handler
