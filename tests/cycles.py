"""Request cycles on one client connection, as agents and chat front ends send them: an
answer, and the moment it ends, the next request on the same connection (issue 21).

A cycle is two requests of a shape: ``stream-whole`` (a streamed answer, then a whole one),
``stream-stream`` or ``whole-stream``. Every answer must be a complete 200; anything else is
counted as a failure with what the client saw, and the cycles go on (a broken connection is
replaced by a fresh one)."""

from __future__ import annotations

import json
from collections import Counter

import attrs
import trio

from tests.client import Client, Reply

SHAPES = ("stream-whole", "stream-stream", "whole-stream")
CHAT = "/v1/chat/completions"


def cycle_body(model: str, stream: bool, max_tokens: int) -> bytes:
    doc = {"model": model, "messages": [{"role": "user", "content": "Say hi"}],
           "stream": stream, "max_tokens": max_tokens, "temperature": 0}
    return json.dumps(doc).encode()


@attrs.define
class CycleResult:
    shape: str
    cycles: int = 0
    requests: int = 0
    failures: Counter[str] = attrs.Factory(Counter)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def __str__(self) -> str:
        detail = ", ".join(f"{n} x {what}" for what, n in self.failures.most_common())
        return (f"{self.shape}: {self.failed} of {self.requests} requests failed"
                + (f" ({detail})" if detail else ""))


def _verdict(reply: Reply, stream: bool) -> str | None:
    if reply.status != 200:
        try:
            code = reply.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "?"
        return f"{reply.status} {code}"
    if not reply.complete:
        return "incomplete body"
    if stream and not reply.body.endswith(b"data: [DONE]\n\n"):
        return "stream without [DONE]"
    return None


async def run_cycles(address: str, shape: str, count: int, model: str, *,
                     max_tokens: int = 2, time_limit: float = 300) -> CycleResult:
    """``count`` cycles of ``shape`` on one client connection to ``address`` (bounded by
    ``time_limit`` seconds in all: running out of time fails loudly)."""
    first, second = (part == "stream" for part in shape.split("-"))
    bodies = {s: cycle_body(model, s, max_tokens) for s in (False, True)}
    result = CycleResult(shape)
    client = await Client.open(address)
    try:
        with trio.fail_after(time_limit):
            for _ in range(count):
                result.cycles += 1
                for stream in (first, second):
                    result.requests += 1
                    try:
                        reply = await client.request("POST", CHAT, bodies[stream],
                                                     [("content-type", "application/json")])
                        what = _verdict(reply, stream)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        what = f"connection lost ({type(exc).__name__})"
                    if what is not None:
                        result.failures[what] += 1
                        await client.aclose()
                        client = await Client.open(address)
    finally:
        await client.aclose()
    return result
