"""The fault-injection upstream's server: a listener (TCP on 127.0.0.1 or a Unix socket),
one task per connection reading requests with h11, and for each request the behaviour its
``x-fault`` header or its ``fault:<name>`` model picks (:mod:`tools.faults.behaviours`).

Run in-process (``await nursery.start(server.serve, "127.0.0.1:0")``, then ``server.url``)
or as ``python -m tools.faults``. Only waits on sockets and ``trio.sleep``, so it runs under
trio's MockClock. Not imported by the gateway.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from contextlib import suppress
from dataclasses import dataclass, field

import h11
import trio

from tools.faults import behaviours
from tools.faults.behaviours import Call, FaultSpec
from tools.faults.specs import fault_models, parse_spec, spec_from_model
from tools.faults.wire import LOADING, error_body, whole
from tools.faults.writer import READ_SIZE, Writer

MAX_BODY = 64 * 1024 * 1024  # a request body larger than this is answered 413


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
        self.url = ""
        self.requests: list[Seen] = []
        self.connections = 0
        self._started = 0.0
        self._answered = 0

    def loading(self) -> bool:
        """Counts this request: True while the server plays a model that is loading."""
        self._answered += 1
        if self._answered <= self.loading_requests:
            return True
        return trio.current_time() - self._started < self.loading_seconds

    async def serve(self, listen: str, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` (127.0.0.1 only) or ``unix:/path``; runs until cancelled."""
        sock, unix_path = await _bind(listen)
        self._started = trio.current_time()
        name = sock.getsockname()
        self.url = f"unix:{unix_path}" if unix_path else f"http://{name[0]}:{name[1]}"
        listener = trio.SocketListener(sock)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self.url)
                while True:
                    stream = await listener.accept()
                    self.connections += 1
                    nursery.start_soon(self._connection, stream, self.connections)
        finally:
            sock.close()
            if unix_path:
                with suppress(FileNotFoundError):
                    os.unlink(unix_path)

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
        leftover = b""
        while not writer.closed and writer.keep_alive:
            h = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
            if leftover:
                h.receive_data(leftover)
            call = await self._read(h, writer, conn_id)
            if call is None:
                return
            if call.problem is not None:
                await writer.send(whole(400, error_body(400, call.problem,
                                                        "invalid_request_error")))
            elif self.loading():
                await writer.send(whole(503, LOADING))
            else:
                await behaviours.TABLE[call.spec.name].run(call)
            leftover = h.trailing_data[0]

    async def _read(self, h: h11.Connection, writer: Writer, conn_id: int) -> Call | None:
        """One whole request, or None when the peer left (or sent garbage: 400, close)."""
        request: h11.Request | None = None
        spec: FaultSpec | None = None
        problem: str | None = None
        body = bytearray()
        size, delay = READ_SIZE, 0.0
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError:
                bad = error_body(400, "bad request", "invalid_request_error")
                await writer.send(whole(400, bad, [("Connection", "close")]))
                return None
            if event is h11.NEED_DATA:
                if request is not None and spec is not None and spec.name == "never-answer":
                    await writer.silence()
                    return None
                data = await _receive(writer.stream, size if request else None)
                if delay:
                    await trio.sleep(delay)
                h.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
                header = _header(event, b"x-fault")
                try:
                    spec = parse_spec(header) if header is not None else None
                except ValueError as exc:
                    spec, problem = FaultSpec("ok"), str(exc)
                if spec is not None and spec.name == "slow-reader":
                    size, delay = int(spec.get("bytes")), spec.get("delay")
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await writer.send(whole(413, error_body(413, "request too large")))
                    return None
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return self._call(request, bytes(body), spec, problem, writer, conn_id)
            else:  # ConnectionClosed
                return None

    def _call(self, request: h11.Request, body: bytes, spec: FaultSpec | None,
              problem: str | None, writer: Writer, conn_id: int) -> Call:
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
        path = request.target.decode("latin-1").split("?", 1)[0]
        self.requests.append(Seen(request.method.decode("ascii"), path, spec.name, body,
                                  conn_id, list(request.headers)))
        served = model if isinstance(model, str) and not model.startswith("fault:") \
            else self.models[0]
        return Call(server=self, writer=writer, spec=spec, method=request.method, path=path,
                    stream=stream is True, chat=path.endswith("/chat/completions"),
                    model=served, problem=problem)


async def _receive(stream: trio.SocketStream, size: int | None) -> bytes:
    """``size`` bytes at most; ``None``: up to the end of a request head and no further
    (peeked first), so a slow reader still finds the body in the socket."""
    if size is not None:
        return await stream.receive_some(size)
    peek = await stream.socket.recv(READ_SIZE, socket.MSG_PEEK)
    if not peek:
        return b""
    end = peek.find(b"\r\n\r\n")
    return await stream.receive_some(len(peek) if end < 0 else end + 4)


def check_listen(listen: str) -> None:
    """ValueError unless ``listen`` is ``127.0.0.1:PORT``, ``localhost:PORT`` or ``unix:/path``."""
    if listen.startswith("unix:"):
        if not listen[5:]:
            raise ValueError("--listen unix: needs a path")
        return
    host, _, port = listen.removeprefix("http://").rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError(f"--listen: only 127.0.0.1:PORT or unix:/path, not {listen!r}")


def _header(request: h11.Request, name: bytes) -> str | None:
    for key, value in request.headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def _bind(listen: str) -> tuple[trio.socket.SocketType, str | None]:
    if listen.startswith("unix:"):
        path = listen[5:]
        with suppress(FileNotFoundError):  # a stale socket file would make bind fail
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: object = path
    else:
        check_listen(listen)
        port = listen.rpartition(":")[2]
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        address = ("127.0.0.1", int(port))
        path = None
    try:
        await sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock, path
