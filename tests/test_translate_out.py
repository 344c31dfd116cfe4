"""The writer of a translated answer (proxy/translated_out.py) on its own, with a recording
Downstream: the keep-alive pings while the prompt is read (trio's MockClock), and that the
relay's writes never interleave with one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from protocol.response import Response
from protocol.translate import messages
from proxy.translated import PING_EVERY
from proxy.translated_out import State, TranslatedOut


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
