"""The writer of a translated answer (proxy/translated_out.py) on its own, with a recording
Downstream: the keep-alive pings while the prompt is read (trio's MockClock), and that the
relay's writes never interleave with one; a whole stream in one read (its fast path) gives
the same bytes as event by event. Through a gateway: the pinger beside a translated relay."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from protocol.ollama.text_delta import TextDelta
from protocol.response import Response
from protocol.translate import messages, responses, responses_stream
from proxy.translated import PING_EVERY
from proxy.translated_out import State, TranslatedOut
from tests.client import request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    KEEP_ALIVE,
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
)


class Recorder:
    """What TranslatedOut uses of a Downstream: every write recorded, each taking a while."""

    def __init__(self) -> None:
        self.response = Response()
        self.closing = False
        self.error_code: str | None = None
        self.writes: list[tuple[float, bytes]] = []
        self.busy = False

    def frame(self, data: bytes) -> bytes:
        return data

    async def _write(self, data: bytes) -> None:
        assert not self.busy, "two writes at once"
        self.busy = True
        await trio.sleep(0.5)  # a slow client
        self.busy = False
        self.writes.append((trio.current_time(), data))

    async def send_head(self, status: int, headers: list[Any], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        await self._write(body)

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        await self._write(data)

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        await self._write(data)

    async def send_broken(self, data: bytes, code: str | None) -> None:
        self.error_code = code
        self.response.broken()
        await self._write(data)


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text},
                                               "finish_reason": None}]}).encode() + b"\n\n"


async def test_pings_while_the_prompt_is_read_then_none(
        autojump_clock: trio.testing.MockClock) -> None:
    real = Recorder()
    out = TranslatedOut(real, messages, "m", stream=True, prompt_chars=0)  # type: ignore[arg-type]
    assert await out.ping()  # no answer yet: nothing sent, asked again later
    await out.send_head(200, [], b"OK", b"", end=False)
    assert out.state is State.STREAMING

    async def pinger() -> None:
        while True:
            await trio.sleep(PING_EVERY)
            if not await out.ping():
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pinger)
        await trio.sleep(PING_EVERY * 2 + 0.7)  # two pings; the second being written now
        await out.send_body(chunk("Hello"))  # waits for that ping, never interleaves
        await trio.sleep(PING_EVERY * 3)
        assert not nursery.child_tasks  # content began: the pinger stopped
    kinds = [data.split(b"\n", 1)[0] for _, data in real.writes]
    assert kinds == [b"event: message_start", b"event: ping", b"event: ping",
                     b"event: content_block_start"]
    times = [at for at, _ in real.writes]
    assert times[1] - times[0] >= PING_EVERY
    await out.end(b"data: [DONE]\n\n")
    assert not await out.ping()


# ------------------------------------------------- a whole stream in one read (bench S3T)

def usage_chunk(n: int) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                             "total_tokens": n + 7}}).encode() + b"\n\n"


def compact(text: str) -> bytes:  # llama.cpp's shape, which the fast path learns
    return b"data: " + json.dumps({"choices": [{"finish_reason": None, "index": 0, "delta": {
        "content": text}}], "created": 1, "object": "chat.completion.chunk"},
        separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
TEXTS = ["Hello", " w\u00f6rld", ' "quoted"', " line\nbreak", " and", " more", " text"]
STREAMS = {
    "text": [compact(t) for t in TEXTS if '"' not in t and "\n" not in t]
    + [usage_chunk(5), b"data: [DONE]\n\n"],
    "role first, escapes": [ROLE, *map(compact, TEXTS), usage_chunk(7), b"data: [DONE]\n\n"],
    "no [DONE]": [*map(chunk, TEXTS[:4]), usage_chunk(4)],
    "reasoning, text, a tool call": [
        ROLE, *(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {
            "reasoning_content": t}}]}, separators=(",", ":")).encode() + b"\n\n"
            for t in ("Let", " me", " think")),
        *map(compact, TEXTS[:3]),
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
        b'"type":"function","function":{"name":"read","arguments":"{\\"p\\":"}}]}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"1}"}}]}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        usage_chunk(9), b"data: [DONE]\n\n"],
    "cut": [ROLE, *map(chunk, TEXTS[:4])],
    "error midway": [chunk("a"), chunk("b"),
                     b'data: {"error":{"message":"boom","code":500}}\n\n', chunk("c")],
}


async def _written(translator: Any, reads: list[bytes]) -> tuple[bytes, int, Recorder]:
    real = Recorder()
    out = TranslatedOut(real, translator, "m", stream=True, prompt_chars=9)  # type: ignore[arg-type]
    await out.send_head(200, [], b"OK", reads[0], end=len(reads) == 1)
    for data in reads[1:-1]:
        await out.send_body(data)
    if len(reads) > 1:
        await out.end(reads[-1])
    return b"".join(data for _, data in real.writes), len(real.writes), real


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("translator", [messages, responses], ids=["messages", "responses"])
async def test_a_stream_in_one_read_is_the_same_bytes_in_one_write(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
        translator: Any, name: str) -> None:
    """The whole chat stream in the head's read (the bench's: a fast local server) gives
    the bytes it gives event by event or cut anywhere, in one write when it ends well; its
    text chunks after the first take the many-events path (TextDelta.many)."""
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: "ab" * n)  # the ids, pinned
    monkeypatch.setattr(responses_stream, "new_id", lambda prefix: prefix + "x")
    events = STREAMS[name]
    whole = b"".join(events)
    many_calls: list[int] = []
    real_many = TextDelta.many

    def counted(self: TextDelta, piece: bytes) -> tuple[list[bytes], bytes] | None:
        got = real_many(self, piece)
        many_calls.append(0 if got is None else len(got[0]))
        return got

    monkeypatch.setattr(TextDelta, "many", counted)
    one, writes, real = await _written(translator, [whole])
    taken = sum(many_calls)
    many_calls.clear()
    by_event, _, _ = await _written(translator, events)
    assert one == by_event
    for size in (1, 7, 50):
        cut, _, _ = await _written(translator, [whole[i:i + size]
                                                for i in range(0, len(whole), size)])
        assert cut == one
    ends_well = name not in ("cut", "error midway")
    assert writes == (1 if ends_well else 2)
    assert real.error_code == (None if ends_well else "upstream_error")
    if name == "text":  # every text chunk after the one learned, in one pass
        assert taken == len(events) - 3


# ------------------------------------------------------------ the pinger beside the relay

def after_prefill(first: bytes, prefill: float, events: list[bytes]) -> Any:
    """A server on a long prompt: its head and ``first`` at once (vLLM's role chunk, or
    llama.cpp's keep-alive comment), the ``events`` ``prefill`` seconds later."""

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        await w.chunk(first)
        await trio.sleep(prefill)
        for event in events:
            await w.chunk(event)
        await w.end()

    return handler


@pytest.mark.parametrize(("path", "ping"), [
    ("/v1/messages", b'event: ping\ndata: {"type":"ping"}\n\n'), ("/v1/responses", b": ping\n\n")])
@pytest.mark.parametrize(("first", "prefill", "pings"), [
    (ROLE, 25, 2), (KEEP_ALIVE, 25, 3), (ROLE, 0, 0)], ids=["role", "comment", "at-once"])
async def test_a_translated_stream_pings_every_10s_while_the_prompt_is_read(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway, path: str, ping: bytes, first: bytes, prefill: float,
        pings: int) -> None:
    """Through a gateway (proxy.translated.Way.relay): the server's head and a first chunk
    with no content at once, its content ``prefill`` seconds later: the client's stream
    has a ping at 10 s and at 20 s before the content (and one for llama.cpp's keep-alive
    comment at once); none when the content follows at once."""
    events = [compact("Hi"), compact(" there"), usage_chunk(2), b"data: [DONE]\n\n"]
    unix_upstream.on("POST", "/v1/chat/completions", after_prefill(first, prefill, events))
    gw = await start_gateway([("fake", unix_upstream.url)], apis="translate")
    body: dict[str, Any] = {"model": "fake-model", "max_tokens": 16, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/responses":
        body = {"model": "fake-model", "stream": True, "input": "hi"}
    started = trio.current_time()
    reply = await request(gw.unix, "POST", path, json.dumps(body).encode())
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body.count(ping) == pings
    content = reply.body.index(b'"Hi"')
    if pings:
        first_ping = reply.body.index(ping)
        assert reply.body[first_ping:content].count(ping) == pings  # all before the content
        assert trio.current_time() - started == pytest.approx(prefill, abs=0.01)
    assert reply.body.count(b"there") >= 1
