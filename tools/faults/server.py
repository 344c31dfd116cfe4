"""The fault-injection upstream's server: for each request the behaviour its ``x-fault``
header or its ``fault:<name>`` model picks (:mod:`tools.faults.behaviours`). The listener,
one task per connection and the h11 reading are :mod:`tools.serve_loop`'s; how far a request
is read off the socket is this module's (the head whole and no further; the body as the
request's fault says: ``slow-reader`` a few bytes at a time, ``never-answer`` not at all).

Run in-process (``await nursery.start(server.serve, "127.0.0.1:0")``, then ``server.url``)
or as ``python -m tools.faults``. Only waits on sockets and ``trio.sleep``, so it runs under
trio's MockClock. Not imported by the gateway.
"""

from __future__ import annotations

import json
import socket
from contextlib import suppress
from dataclasses import dataclass, field

import h11
import trio

from tools.faults import behaviours
from tools.faults.behaviours import Call, FaultSpec
from tools.faults.specs import fault_models, parse_spec, spec_from_model
from tools.faults.wire import LOADING, error_body, whole
from tools.faults.writer import READ_SIZE, Writer
from tools.serve_loop import BadRequest, Request, ServeLoop, serve_requests

MAX_BODY = 64 * 1024 * 1024  # a request body larger than this is answered 413
MAX_HEAD = 64 * 1024  # the largest request head read


@dataclass
class Seen:
    """One request as the server received it (for tests and the log)."""

    method: str
    path: str
    fault: str
    body: bytes
    conn_id: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class FaultServer:
    """``models``: the ids /v1/models lists. ``default``: the fault for requests that name
    none (e.g. ``"refuse"`` or ``"never-answer"`` act on every connection at accept).
    ``loading_seconds`` / ``loading_requests``: answer every request 503 "Loading model"
    (/health and /v1/models too) for that long after start, or for that many requests."""

    def __init__(self, *, models: tuple[str, ...] = ("faulty",), default: str = "ok",
                 loading_seconds: float = 0, loading_requests: int = 0) -> None:
        self.models = list(models)
        self.listed = [*self.models, *fault_models()]
        self.default = parse_spec(default)
        self.loading_seconds = loading_seconds
        self.loading_requests = loading_requests
        self.refuse_next = 0  # connections to reset at accept (set by the refuse behaviour)
        self.requests: list[Seen] = []
        self._loop = ServeLoop(self._connection)
        self._started = 0.0
        self._answered = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` or ``unix:/path`` once serving, else ``""``."""
        return self._loop.url

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return self._loop.accepted

    def loading(self) -> bool:
        """Counts this request: True while the server plays a model that is loading."""
        self._answered += 1
        if self._answered <= self.loading_requests:
            return True
        return trio.current_time() - self._started < self.loading_seconds

    async def serve(self, listen: str, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` (127.0.0.1 only) or ``unix:/path``; runs until cancelled."""
        self._started = trio.current_time()
        await self._loop.serve(listen, task_status=task_status)

    async def _connection(self, stream: trio.SocketStream, conn_id: int) -> None:
        writer = Writer(stream)
        try:
            level = behaviours.TABLE[self.default.name].level
            if self.refuse_next or (level == "connection" and self.default.name == "refuse"):
                self.refuse_next = max(self.refuse_next - 1, 0)
                await writer.reset()
                return
            if level == "connection":  # never-answer
                await writer.silence()
                return
            await self._requests(writer, conn_id)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            stream.socket.close()

    async def _requests(self, writer: Writer, conn_id: int) -> None:
        reader = _Reader(writer)

        async def handle(request: Request) -> bool:
            call = self._call(request, *_named(request.head), writer, conn_id)
            if call.problem is not None:
                await writer.send(whole(400, error_body(400, call.problem,
                                                        "invalid_request_error")))
            elif self.loading():
                await writer.send(whole(503, LOADING))
            else:
                await behaviours.TABLE[call.spec.name].run(call)
            return not writer.closed and writer.keep_alive

        try:
            await serve_requests(reader.receive, handle, max_head=MAX_HEAD, max_body=MAX_BODY)
        except BadRequest as exc:
            if exc.too_large:
                await writer.send(whole(413, error_body(413, "request too large")))
            else:
                bad = error_body(400, "bad request", "invalid_request_error")
                await writer.send(whole(400, bad, [("Connection", "close")]))

    def _call(self, request: Request, spec: FaultSpec | None, problem: str | None,
              writer: Writer, conn_id: int) -> Call:
        head, body = request.head, request.body
        doc: object = None
        with suppress(ValueError):
            doc = json.loads(body) if body else None
        model = stream = None
        if isinstance(doc, dict):
            model, stream = doc.get("model"), doc.get("stream")
        if spec is None and isinstance(model, str):
            try:
                spec = spec_from_model(model)
            except ValueError as exc:
                spec, problem = FaultSpec("ok"), str(exc)
        if spec is None:
            spec = self.default
        path = head.target.decode("latin-1").split("?", 1)[0]
        self.requests.append(Seen(head.method.decode("ascii"), path, spec.name, body,
                                  conn_id, list(head.headers)))
        served = model if isinstance(model, str) and not model.startswith("fault:") \
            else self.models[0]
        return Call(server=self, writer=writer, spec=spec, method=head.method, path=path,
                    stream=stream is True, chat=path.endswith("/chat/completions"),
                    model=served, problem=problem)


class _Reader:
    """How far one connection's requests are read: a head whole and no further (peeked
    first, so a slow reader still finds the body in the socket), then the body as the
    fault its ``x-fault`` header names says."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self._head: h11.Request | None = None
        self._spec: FaultSpec | None = None

    async def receive(self, head: h11.Request | None) -> bytes | None:
        stream = self.writer.stream
        if head is None:
            return await _head_bytes(stream)
        if head is not self._head:
            self._head, self._spec = head, _named(head)[0]
        spec = self._spec
        if spec is not None and spec.name == "never-answer":
            await self.writer.silence()
            return None
        if spec is not None and spec.name == "slow-reader":
            data = await stream.receive_some(int(spec.get("bytes")))
            if delay := spec.get("delay"):
                await trio.sleep(delay)
            return data
        return await stream.receive_some(READ_SIZE)


async def _head_bytes(stream: trio.SocketStream) -> bytes:
    """Up to the end of a request head and no further (peeked first)."""
    peek = await stream.socket.recv(READ_SIZE, socket.MSG_PEEK)
    if not peek:
        return b""
    end = peek.find(b"\r\n\r\n")
    return await stream.receive_some(len(peek) if end < 0 else end + 4)


def _named(head: h11.Request) -> tuple[FaultSpec | None, str | None]:
    """The fault a request's ``x-fault`` header names (None: no header) and, when the
    header does not parse, why (the request is then answered 400)."""
    header = _header(head, b"x-fault")
    if header is None:
        return None, None
    try:
        return parse_spec(header), None
    except ValueError as exc:
        return FaultSpec("ok"), str(exc)


def _header(request: h11.Request, name: bytes) -> str | None:
    for key, value in request.headers:
        if key == name:
            return value.decode("latin-1")
    return None
