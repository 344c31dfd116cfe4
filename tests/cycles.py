"""Requests sent on one client connection the moment the previous answer ends, as agents and
chat front ends send them (issue 21).

A transition is a request and the one before it on the connection: ``stream-whole`` (a
streamed answer, then at once a whole one), ``stream-stream`` and ``whole-stream``. The
sequence stream, stream, whole, stream, stream, whole, ... makes each request after the
first one transition of each kind in turn, so ``n`` of each take ``3n + 1`` requests. Every
answer must be a complete 200; anything else is counted, by transition, as a failure with
what the client saw, and the requests go on on a fresh client connection (the request after
a failure counts for no transition)."""

from __future__ import annotations

import json
from collections import Counter

import attrs
import trio

from tests.client import CHAT, Client, Reply

SHAPES = ("stream-stream", "stream-whole", "whole-stream")  # in the sequence's order


def cycle_body(model: str, stream: bool, max_tokens: int) -> bytes:
    doc = {"model": model, "messages": [{"role": "user", "content": "Say hi"}],
           "stream": stream, "max_tokens": max_tokens, "temperature": 0}
    return json.dumps(doc).encode()


@attrs.define
class CycleResult:
    """The requests that followed a transition's first answer, and how they failed."""

    shape: str
    requests: int = 0
    failures: Counter[str] = attrs.Factory(Counter)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def __str__(self) -> str:
        detail = ", ".join(f"{n} x {what}" for what, n in self.failures.most_common())
        return (f"{self.shape}: {self.failed} of {self.requests} failed"
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


async def run_transitions(address: str, count: int, model: str, *, max_tokens: int = 2,
                          time_limit: float = 300) -> dict[str, CycleResult]:
    """``count`` transitions of each shape on one client connection to ``address``
    (bounded by ``time_limit`` seconds in all: running out of time fails loudly)."""
    bodies = {s: cycle_body(model, s, max_tokens) for s in (False, True)}
    results = {shape: CycleResult(shape) for shape in SHAPES}
    sequence = [True, True, False] * count + [True]
    failed_first = None
    previous_ok = False
    client = await Client.open(address)
    try:
        with trio.fail_after(time_limit):
            for i, stream in enumerate(sequence):
                try:
                    reply = await client.request("POST", CHAT, bodies[stream],
                                                 [("content-type", "application/json")])
                    what = _verdict(reply, stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    what = f"connection lost ({type(exc).__name__})"
                if previous_ok:  # after a failure it is no transition of its shape
                    result = results[f"{_kind(sequence[i - 1])}-{_kind(stream)}"]
                    result.requests += 1
                    if what is not None:
                        result.failures[what] += 1
                elif not i:
                    failed_first = what
                previous_ok = what is None
                if what is not None:
                    await client.aclose()
                    client = await Client.open(address)
    finally:
        await client.aclose()
    assert failed_first is None, f"the first request failed: {failed_first}"
    return results


def _kind(stream: bool) -> str:
    return "stream" if stream else "whole"
