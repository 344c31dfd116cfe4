"""The behaviours of the fault-injection upstream, one row each in :data:`TABLE`.

A request picks one with the header ``x-fault: <name>[;param=value...]`` or the model
``fault:<name>`` (parsed in :mod:`tools.faults.specs`: ``fault:reset-after-3`` gives the
behaviour's main parameter, here ``after``, the value 3). Without either the server's
default applies (normally ``ok``). Every behaviour bends the answer a well-behaved llama.cpp
would give to that request (:mod:`tools.faults.wire`): a stream (``"stream": true``) is SSE
in HTTP chunks; a whole answer is JSON with Content-Length, or, for the behaviours that cut
or bend chunks, the same JSON sent chunked in 64-byte pieces. "Chunk" means an HTTP chunk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from tools.faults import wire
from tools.faults.writer import Writer

PIECE = 64  # bytes per chunk when a whole JSON answer is sent chunked


@dataclass(frozen=True)
class FaultSpec:
    name: str
    params: dict[str, float] = field(default_factory=dict)

    def get(self, param: str) -> float:
        if param in self.params:
            return self.params[param]
        return TABLE[self.name].defaults[param]


class Server(Protocol):
    """What a behaviour may see of the server."""

    listed: list[str]  # the model ids /v1/models lists
    refuse_next: int


@dataclass
class Call:
    """One request, read whole, and what answers it."""

    server: Server
    writer: Writer
    spec: FaultSpec
    method: bytes
    path: str
    stream: bool  # the body asked for "stream": true
    chat: bool  # /v1/chat/completions (else the answer is a text completion)
    model: str  # the model id echoed in answers
    problem: str | None = None  # the fault named could not be parsed: answered 400


Run = Callable[[Call], Awaitable[None]]


@dataclass(frozen=True)
class Behaviour:
    name: str
    doc: str
    run: Run
    defaults: dict[str, float] = field(default_factory=dict)
    main: str | None = None  # the parameter a ``fault:<name>-<N>`` model sets
    level: str = "request"  # "connection": as the server default, acts at accept


# ------------------------------------------------------------------- the good answer


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]  # without framing headers
    payloads: list[bytes]  # stream: the HTTP chunks; whole: the one body
    stream: bool


def good_answer(call: Call) -> Answer:
    """What llama.cpp would answer to this request."""
    tokens = int(call.spec.get("tokens"))
    json_headers = wire.JSON_HEADERS
    if call.method == b"GET" and call.path == "/health":
        return Answer(200, json_headers, [wire.compact({"status": "ok"})], False)
    if call.method == b"GET" and call.path == "/v1/models":
        body = wire.compact(wire.models(call.server.listed))
        return Answer(200, json_headers, [body], False)
    if call.method == b"POST" and call.path in ("/v1/chat/completions", "/v1/completions"):
        if call.stream:
            return Answer(200, wire.SSE_HEADERS,
                          wire.stream_chunks(call.chat, call.model, tokens), True)
        body = wire.compact(wire.completion(call.chat, call.model, tokens))
        return Answer(200, json_headers, [body], False)
    body = wire.compact(wire.error_body(404, "File Not Found", "not_found_error"))
    return Answer(404, json_headers, [body], False)


def _chunked(answer: Answer) -> list[bytes]:
    if answer.stream:
        return answer.payloads
    body = answer.payloads[0]
    return [body[i:i + PIECE] for i in range(0, len(body), PIECE)]


def _chunked_head(answer: Answer, extra: list[tuple[str, str]] | None = None) -> bytes:
    return wire.head(answer.status, [*answer.headers, *(extra or []),
                                     ("Transfer-Encoding", "chunked")])


async def send_whole(call: Call, answer: Answer) -> None:
    """The answer as a well-behaved llama.cpp sends it (closing after a stream)."""
    writer = call.writer
    if not answer.stream:
        body = answer.payloads[0]
        headers = [*answer.headers, ("Content-Length", str(len(body)))]
        await writer.send(wire.head(answer.status, headers) + body)
        return
    await writer.send(_chunked_head(answer))
    for payload in answer.payloads:
        await writer.send(wire.chunk(payload))
    await writer.send(wire.LAST_CHUNK)
    await writer.close()  # llama.cpp ends the connection after a streamed answer


# ------------------------------------------------------------------- the behaviours


async def ok(call: Call) -> None:
    await send_whole(call, good_answer(call))


async def refuse(call: Call) -> None:
    call.server.refuse_next += int(call.spec.get("count"))
    await call.writer.reset()


async def never_answer(call: Call) -> None:
    await call.writer.silence()


async def reset(call: Call) -> None:
    await call.writer.reset()


async def _wait(call: Call) -> bool:
    """Stall: ``seconds`` then go on (True), or for good (0: until the peer leaves)."""
    seconds = call.spec.get("seconds")
    if seconds <= 0:
        await call.writer.silence()
        return False
    await trio.sleep(seconds)
    return True


async def stall_head(call: Call) -> None:
    if await _wait(call):
        await ok(call)


async def _partial(call: Call, after: int, finale: Callable[[Call], Awaitable[bool]]) -> None:
    """The head and ``after`` chunks, then ``finale``; when it returns True, the rest."""
    answer = good_answer(call)
    chunks = _chunked(answer)
    writer = call.writer
    writer.keep_alive = False
    await writer.send(_chunked_head(answer))
    for payload in chunks[:after]:
        await writer.send(wire.chunk(payload))
    if not await finale(call):
        return
    for payload in chunks[after:]:
        await writer.send(wire.chunk(payload))
    await writer.send(wire.LAST_CHUNK)
    await writer.close()


async def _reset(call: Call) -> bool:
    await call.writer.reset()
    return False


async def _close(call: Call) -> bool:
    await call.writer.close()
    return False


async def silent_after_head(call: Call) -> None:
    await _partial(call, 0, _wait)


async def stall_after(call: Call) -> None:
    await _partial(call, int(call.spec.get("after")), _wait)


async def reset_after(call: Call) -> None:
    await _partial(call, int(call.spec.get("after")), _reset)


async def close_after_head(call: Call) -> None:
    await _partial(call, 0, _close)


async def close_after(call: Call) -> None:
    await _partial(call, int(call.spec.get("after")), _close)


async def status(call: Call) -> None:
    code = int(call.spec.get("code"))
    message = {500: "Internal Server Error", 502: "Bad Gateway",
               503: "Service Unavailable"}.get(code, f"error {code}")
    await call.writer.send(wire.whole(code, wire.error_body(code, message)))


async def rate_limit(call: Call) -> None:
    retry = call.spec.get("retry_after")
    body = wire.error_body(429, "Too many requests, retry later", "rate_limit_error")
    await call.writer.send(wire.whole(429, body, [("Retry-After", f"{retry:g}")]))


async def loading(call: Call) -> None:
    await call.writer.send(wire.whole(503, wire.LOADING))


async def cl_and_te(call: Call) -> None:
    answer = good_answer(call)
    chunks = _chunked(answer)
    length = sum(len(c) for c in chunks)
    call.writer.keep_alive = False
    await call.writer.send(_chunked_head(answer, [("Content-Length", str(length))]))
    for payload in chunks:
        await call.writer.send(wire.chunk(payload))
    await call.writer.send(wire.LAST_CHUNK)
    await call.writer.close()


BAD_SIZE = b"zz\r\ndata: {}\n\n\r\n"  # a chunk whose size line is not hex
_LONG = b"data: {\"overrun\":true}\n\n"
OVERRUN = b"%x\r\n%b\r\n" % (len(_LONG) - 8, _LONG)  # 8 bytes more than announced


async def _broken(call: Call, broken: bytes) -> None:
    """The head and ``after`` good chunks, the last of them in one write with ``broken``
    (so a reader gets the good chunk and the break in the same read), then close."""
    answer = good_answer(call)
    good = [wire.chunk(p) for p in _chunked(answer)[:int(call.spec.get("after"))]]
    writer = call.writer
    writer.keep_alive = False
    await writer.send(_chunked_head(answer))
    for data in good[:-1]:
        await writer.send(data)
    await writer.send(b"".join(good[-1:]) + broken)
    await writer.close()


async def bad_chunk_size(call: Call) -> None:
    await _broken(call, BAD_SIZE)


async def chunk_overrun(call: Call) -> None:
    await _broken(call, OVERRUN)


async def error_event(call: Call) -> None:
    if not call.stream:
        await status(call)
        return
    answer = good_answer(call)
    writer = call.writer
    await writer.send(_chunked_head(answer))
    await writer.send(wire.chunk(answer.payloads[0]))
    await writer.send(wire.chunk(wire.error_event("the model failed mid-stream")))
    await writer.send(wire.LAST_CHUNK)
    await writer.close()


async def big_event(call: Call) -> None:
    size = int(call.spec.get("size"))
    answer = good_answer(call)
    if not answer.stream:
        body = wire.compact(wire.completion(call.chat, call.model, 1))
        body = body.replace(b'"tok1 "', b'"' + b"x" * max(size - len(body), 0) + b'"')
        await send_whole(call, Answer(answer.status, answer.headers, [body], False))
        return
    big = wire.big_event(call.chat, call.model, size)
    payloads = [answer.payloads[0], big, *answer.payloads[1:]]
    await send_whole(call, Answer(answer.status, answer.headers, payloads, True))


def _row(name: str, doc: str, run: Run, main: str | None = None, level: str = "request",
         **defaults: float) -> Behaviour:
    return Behaviour(name, doc, run, {"tokens": 4, **defaults}, main, level)


ROWS = [
    _row("ok", "behave well: llama.cpp's answer (tokens=N tokens)", ok),
    _row("refuse", "reset the connection at once; as the server default every connection "
         "is reset at accept; count=N also resets the next N", refuse, "count", "connection",
         count=0),
    _row("never-answer", "accept, read the head, never answer (as the server default: "
         "never read at all)", never_answer, level="connection"),
    _row("stall-head", "read the request, wait seconds=S before the head (0: forever)",
         stall_head, "seconds", seconds=0),
    _row("silent-after-head", "send the head, then nothing for seconds=S (0: forever)",
         silent_after_head, "seconds", seconds=0),
    _row("stall-after", "send the head and after=K chunks, then stall seconds=S (0: forever)",
         stall_after, "after", after=1, seconds=0),
    _row("reset", "reset the connection (SO_LINGER 0) before any byte", reset),
    _row("reset-after", "send the head and after=K chunks, then reset", reset_after, "after",
         after=1),
    _row("close-after-head", "send the head, then close cleanly (no body)", close_after_head),
    _row("close-after", "send the head and after=K chunks, then close cleanly",
         close_after, "after", after=1),
    _row("status", "answer code=N (500, 502, 503...) with llama.cpp's error body", status,
         "code", code=500),
    _row("rate-limit", "answer 429 with Retry-After: retry_after=S", rate_limit,
         "retry_after", retry_after=7),
    _row("loading", "answer 503 \"Loading model\" (see --loading-seconds/--loading-requests)",
         loading),
    _row("cl-and-te", "frame the answer with Content-Length and Transfer-Encoding together",
         cl_and_te),
    _row("bad-chunk-size", "after=K good chunks, a chunk with a size line that is not hex",
         bad_chunk_size, "after", after=0),
    _row("chunk-overrun", "after=K good chunks, a chunk longer than its size line says",
         chunk_overrun, "after", after=0),
    _row("error-event", "stream: a valid first chunk, then data: {\"error\":...}, then the "
         "end (a whole answer gets a 500)", error_event),
    _row("big-event", "a stream with one event of size=N bytes (default 1 MiB) after the "
         "first chunk; a whole answer of about that size", big_event, "size",
         size=1024 * 1024),
    _row("slow-reader", "read the request body bytes=N at a time, delay=S between reads "
         "(header only), then behave well", ok, "bytes", bytes=16, delay=0.01),
]
TABLE: dict[str, Behaviour] = {b.name: b for b in ROWS}
