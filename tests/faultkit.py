"""Helpers for the tests of tools/faults: the kit served in-process, and what a well-behaved
answer of it looks like on the wire (for byte-for-byte comparisons)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import trio

from tools.faults import wire
from tools.faults.server import FaultServer

MODEL = "faulty"


async def start_kit(nursery: trio.Nursery, listen: str, **options: Any) -> FaultServer:
    """A FaultServer on ``listen`` (``127.0.0.1:0`` or ``unix:/path``), running until the
    nursery ends."""
    kit = FaultServer(**options)
    await nursery.start(partial(kit.serve, listen))
    return kit


def stream_chunks(tokens: int = 4) -> list[bytes]:
    """The HTTP chunk payloads of the kit's good chat stream."""
    return wire.stream_chunks(True, MODEL, tokens)


def body(stream: bool = False, model: str = MODEL, size: int = 0) -> bytes:
    doc: dict[str, Any] = {"model": model, "stream": stream,
                           "messages": [{"role": "user", "content": "hi" + "." * size}]}
    return json.dumps(doc).encode()


def fault(spec: str) -> list[tuple[str, str]]:
    return [("x-fault", spec)]


def error_events(data: bytes) -> list[dict[str, Any]]:
    """The ``error`` objects of the SSE error events in a streamed body."""
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: {\"error\""):
            out.append(json.loads(event[len(b"data: "):])["error"])
    return out
