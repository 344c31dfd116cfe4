"""A fake llama.cpp with a fixed number of slots, for the queue's tests (SPEC §18).

Like llama.cpp, a request beyond its slots waits *inside the server* for one (its time
counts toward the client's first byte); ``GET /slots`` reports one object per slot with
``is_processing`` for the busy ones. Each chat request names itself in ``user`` (its
label) and how long it takes in ``max_tokens`` (seconds, under the test's clock); a stream
sends its first event once it has a slot. The server records the order requests arrived
in and the order they got a slot, and the most it ever had in flight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from tests.fakeupstream import (
    LLAMA_JSON_HEADERS,
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
)

MODEL = "slot-model"


class SlotServer:
    def __init__(self, path: Path, total: int, *, model: str = MODEL,
                 report: bool = True) -> None:
        self.up = FakeUpstream(models=[model], unix_path=str(path))
        self.model = model
        self.total = total
        self.slots = trio.Semaphore(total)
        self.arrived: list[str] = []  # labels, in the order they reached the server
        self.started: list[str] = []  # labels, in the order they got a slot
        self.in_flight = 0  # requests inside the server (waiting or processing)
        self.most = 0  # the most ever inside the server at once
        self.busy = 0
        self.up.on("POST", "/v1/chat/completions", self.chat)
        if report:
            self.up.on("GET", "/slots", self.slots_doc)

    @property
    def url(self) -> str:
        return self.up.url

    async def start(self, nursery: trio.Nursery) -> SlotServer:
        await nursery.start(self.up.serve)
        return self

    async def slots_doc(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, [{"id": i, "is_processing": i < self.busy}
                           for i in range(self.total)], LLAMA_JSON_HEADERS)

    async def chat(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        doc = json.loads(req.body)
        label = str(doc.get("user", "?"))
        seconds = float(doc.get("max_tokens", 1))
        self.arrived.append(label)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            async with self.slots:
                self.busy += 1
                self.started.append(label)
                try:
                    if doc.get("stream"):
                        await w.head(200, LLAMA_SSE_HEADERS)
                        await w.chunk(_event(label))
                        await trio.sleep(seconds)
                        await w.chunk(b"data: [DONE]\n\n")
                        await w.end()
                    else:
                        await trio.sleep(seconds)
                        await w.json(200, _answer(label, self.model), LLAMA_JSON_HEADERS)
                finally:
                    self.busy -= 1
        finally:
            self.in_flight -= 1


def _event(label: str) -> bytes:
    chunk = {"choices": [{"delta": {"content": label}, "index": 0}],
             "object": "chat.completion.chunk"}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _answer(label: str, model: str) -> dict[str, Any]:
    return {"choices": [{"finish_reason": "stop", "index": 0,
                         "message": {"role": "assistant", "content": label}}],
            "object": "chat.completion", "model": model,
            "usage": {"completion_tokens": 1, "prompt_tokens": 1, "total_tokens": 2}}


def body(label: str, seconds: float, *, model: str = MODEL, stream: bool = False,
         **extra: Any) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "user": label, "max_tokens": seconds, "stream": stream,
                       **extra}).encode()
