"""Fake network nodes for the routing tests: :class:`FakeUpstream` servers (on 127.0.0.1 TCP,
or a Unix socket for in-process gateways) that look like another sluice gateway from the
outside and misbehave on demand.

A :class:`FakeNode` lists its models on ``GET /v1/models`` (optionally after a delay, to
look slow to the ``fastest`` strategy; a model named in ``states`` with ``"sluice": {"state":
S}``, as a sluice gateway lists its managed models; with ``extra`` entries after them; or,
while its ``status`` is not 200, an error such as a 503 "loading model"), answers
``GET /api/v1/node/identity`` with its fingerprint, and answers chat completions with a
swappable handler, by default :func:`chat_answer` naming the node, so every reply says who
produced it.  ``stop()`` closes its listener and connections: the port then refuses
connections.  :func:`start_node` starts one on a Unix socket, for the in-process tests
under the autojump clock (node URLs in a validated config must be ``http://``).

Handlers: :func:`chat_answer` (a whole JSON answer or an SSE stream, whichever the request
asked for), :func:`reset_now` (a TCP reset before any byte), :func:`delayed`,
:func:`in_turn` (one handler per request, the last one repeating) and :class:`Hold`
(park a request, optionally after the SSE head and first event, until ``release()``).

:class:`ThreadedUpstream` runs a fake in its own thread and trio loop, for fixtures that
outlive one test (a real gateway process's local backend shared by a module).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from tests.client import CHAT
from tests.fakeupstream import (
    CREATED,
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    Handler,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
    sse_stream,
)


def chat_answer(text: str) -> Handler:
    """A llama.cpp-like answer: JSON with ``text`` as the message, or (``"stream": true``)
    the SSE events of :func:`stream_events`, one chunk each."""
    whole = json_completion(text)
    streamed = sse_stream(stream_events(text))

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await (streamed if _wants_stream(req) else whole)(req, w)

    return handler


def stream_events(text: str) -> list[bytes]:
    """A role chunk, one chunk whose content is ``text`` (plain ASCII, nothing to escape),
    a finish chunk, then ``data: [DONE]``."""
    evs = sse_events(3)
    evs[1] = evs[1].replace(b'"tok1 "', b'"' + text.encode() + b'"')
    return evs


def _wants_stream(req: ReceivedRequest) -> bool:
    try:
        return bool(req.json().get("stream"))
    except ValueError:
        return False


def reset_now() -> Handler:
    """Reads the request, then resets the connection (RST) without sending a byte."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.reset()

    return handler


def close_now() -> Handler:
    """A clean close (FIN) at once: before the head, or mid-stream after a Hold."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.close()

    return handler


def finish_stream() -> Handler:
    """The end of a stream a :class:`Hold` started: ``data: [DONE]`` and the last chunk."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.chunk(b"data: [DONE]\n\n")
        await w.end()

    return handler


def delayed(seconds: float, inner: Handler) -> Handler:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await trio.sleep(seconds)
        await inner(req, w)

    return handler


def in_turn(*handlers: Handler) -> Handler:
    """The first request gets ``handlers[0]``, the second ``handlers[1]``...; the last one
    answers every request after that."""
    served = 0

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        nonlocal served
        inner = handlers[min(served, len(handlers) - 1)]
        served += 1
        await inner(req, w)

    return handler


class Hold:
    """A handler that parks every request until :meth:`release`, then finishes it with
    ``then``. With ``first_event`` it sends the SSE head and that event before parking (a
    stream in progress; ``then`` continues it, e.g. :func:`finish_stream` or
    :func:`reset_now`). ``arrived`` counts parked requests; :meth:`wait_arrived` waits for
    a number of them."""

    def __init__(self, then: Handler, first_event: bytes | None = None) -> None:
        self.then = then
        self.first_event = first_event
        self.arrived = 0
        self._released = trio.Event()
        self._changed = trio.Event()

    def release(self) -> None:
        self._released.set()

    async def wait_arrived(self, count: int) -> None:
        while self.arrived < count:
            await self._changed.wait()

    async def __call__(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        if self.first_event is not None:
            await w.head(200, LLAMA_SSE_HEADERS)
            await w.chunk(self.first_event)
        self.arrived += 1
        self._changed.set()
        self._changed = trio.Event()
        await self._released.wait()
        await self.then(req, w)


class FakeNode(FakeUpstream):
    """A fake sluice gateway seen as a network node (see the module docstring)."""

    def __init__(self, fingerprint: str, models: Sequence[str], *,
                 unix_path: str | None = None, models_delay: float = 0.0,
                 extra: Sequence[dict[str, Any]] = (), answer: Handler | None = None) -> None:
        super().__init__(models=models, unix_path=unix_path)
        self.fingerprint = fingerprint
        self.models_delay = models_delay
        self.models_gate: trio.Event | None = None  # when set: /v1/models waits for it
        self.status = 200  # what GET /v1/models answers; not 200: an error ("loading model")
        self.extra = list(extra)  # listed after the models (e.g. the node's own remotes)
        self.states: dict[str, str] = {}  # model -> its "sluice": {"state": S} (SPEC §11)
        self.slots: dict[str, tuple[int, int]] = {}  # model -> (busy, total) it reports (§15)
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()
        self.on("GET", "/v1/models", self._node_models)
        self.on("GET", "/api/v1/node/identity", self._identity)
        self.answer(answer or chat_answer(f"from {fingerprint}"))

    def __repr__(self) -> str:
        return f"FakeNode({self.fingerprint!r}, {self.url})"

    def answer(self, handler: Handler) -> None:
        """How chat completions are answered from now on."""
        self.on("POST", CHAT, handler)

    def chats(self) -> list[ReceivedRequest]:
        return self.requests_to(CHAT)

    async def start(self, nursery: trio.Nursery) -> FakeNode:
        async def run(task_status: trio.TaskStatus[str]) -> None:
            try:
                with self._scope:
                    await self.serve(task_status=task_status)
            finally:
                self._stopped.set()

        await nursery.start(run)
        return self

    async def stop(self) -> None:
        """Close the listener and every connection; the port refuses from now on."""
        self._scope.cancel()
        await self._stopped.wait()

    async def _node_models(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        if self.models_delay:
            await trio.sleep(self.models_delay)
        if self.models_gate is not None:
            await self.models_gate.wait()
        if self.status != 200:
            await w.json(self.status, {"error": {"message": "loading model"}})
            return
        data: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": CREATED, "owned_by": "llamacpp"}
            for m in self.models]
        for entry in data:
            extra: dict[str, Any] = {}
            if entry["id"] in self.states:
                extra["state"] = self.states[entry["id"]]
            if entry["id"] in self.slots:
                busy, total = self.slots[entry["id"]]
                extra["slots"] = {"busy": busy, "total": total}
            if extra:
                entry["sluice"] = extra
        await w.json(200, {"object": "list", "data": [*data, *self.extra]})

    async def _identity(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, {"fingerprint": self.fingerprint, "version": "fake"})


async def start_node(nursery: trio.Nursery, path: str, models: Sequence[str],
                     extra: Sequence[dict[str, Any]] = (), *, answer: Handler | None = None,
                     fingerprint: str | None = None) -> FakeNode:
    """A :class:`FakeNode` on the Unix socket ``path`` (for tests under the autojump clock),
    serving; its fingerprint is the socket file's name without ``.sock`` unless given."""
    node = FakeNode(fingerprint or Path(path).stem, models, unix_path=path, extra=extra,
                    answer=answer)
    return await node.start(nursery)


class ThreadedUpstream:
    """Serve ``up`` from a thread with its own trio loop (``start()`` / ``stop()`` are
    blocking calls made from outside any trio loop, e.g. in a module-scoped fixture)."""

    def __init__(self, up: FakeUpstream) -> None:
        self.up = up
        self._ready = threading.Event()
        self._token: Any = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="fake-upstream", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.up.serve)
                    self._ready.set()

        try:
            trio.run(run)
        except BaseException as exc:  # reported by stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> FakeUpstream:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None or not self.up.url:
            raise RuntimeError(f"the threaded fake upstream did not start: {self._error!r}")
        return self.up

    def stop(self) -> None:
        if self._scope is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)
        if self._error is not None:
            raise RuntimeError("the threaded fake upstream crashed") from self._error
