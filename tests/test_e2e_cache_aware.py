"""Cache-aware routing with the real llama.cpp (SPEC §15): two servers (one slot, one thread
each) that hold the same model behind one gateway. Two conversations start at once and go
to one server each; every later turn goes back to its own server (``hit``), which reuses
the conversation's prefix: the request log shows the tokens llama.cpp says it reused, from
its usage (Chat Completions with include_usage, the Messages API) or its timings (a stream
without usage). The gateway also reads each server's slots from ``/slots``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.client import request
from tests.conftest import RunningGateway, StartGateway
from tests.llama_server import llama_server
from tests.test_e2e_llama import gguf  # noqa: F401 (fixture)
from tests.waits import settled

pytest.importorskip("xllamacpp")

SYSTEM = ("You are a patient assistant for a small bakery. You answer questions about "
          "bread, opening hours and prices, in one short sentence. ") * 3  # ~400 chars:
# under one prefix block (block_chars 512), so each conversation's first block is its own


def doc_of(n: int) -> str:
    return " ".join(f"Note {n}.{i}: the rye loaf number {i} costs {n + i} coins." for i in
                    range(12))


def chat(n: int, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": f"{doc_of(n)} What does loaf 1 cost?"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"Loaf {t} costs {n + t} coins."},
                     {"role": "user", "content": f"And loaf {t + 1}?"}]
    return messages


def body(path: str, n: int, turns: int, stream: bool) -> bytes:
    doc: dict[str, Any] = {"model": "smol", "max_tokens": 4, "stream": stream}
    if path == "/v1/messages":
        doc.update(system=SYSTEM, messages=chat(n, turns))
    else:
        doc.update(messages=[{"role": "system", "content": SYSTEM}, *chat(n, turns)])
    return json.dumps(doc).encode()


async def ask(gw: RunningGateway, path: str, n: int, turns: int, stream: bool) -> Any:
    with trio.fail_after(90):
        reply = await request(gw.unix, "POST", path, body(path, n, turns, stream),
                              [("anthropic-version", "2023-06-01")])
    assert (reply.status, reply.complete) == (200, True), reply.body[-300:]
    return reply


async def test_turns_stay_on_the_llama_server_that_holds_them(
        short_tmp: Path, gguf: Path, start_gateway: StartGateway) -> None:  # noqa: F811
    options = ("--context", "2048", "--parallel", "1", "--threads", "1")
    async with llama_server(gguf, "smol", str(short_tmp / "one.sock"), *options) as (one, p1), \
            llama_server(gguf, "smol", str(short_tmp / "two.sock"), *options) as (two, p2):
        gw = await start_gateway([("one", one), ("two", two)])
        assert gw.gateway.ctx.config.load_balancing.strategy == "cache-aware"
        backends = gw.gateway.ctx.backends.backends
        assert [b.slots is not None and b.slots.total for b in backends] == [1, 1]
        home: dict[int, str] = {}
        async with trio.open_nursery() as nursery:  # two conversations at once: one each
            async def first(n: int) -> None:
                reply = await ask(gw, "/v1/chat/completions", n, 1, False)
                home[n] = str(reply.header("x-sluice-served-by"))

            nursery.start_soon(first, 1)
            router = gw.gateway.ctx.router
            await settled(lambda: sum(router.backend_in_flight(b.name) for b in backends) == 1,
                          "the first conversation on its server")
            nursery.start_soon(first, 2)
        assert sorted(home.values()) == ["local:one", "local:two"], home
        turns = [("/v1/chat/completions", False), ("/v1/chat/completions", True),
                 ("/v1/messages", False)]
        for turn, (path, stream) in enumerate(turns, start=2):
            for n in (1, 2):
                reply = await ask(gw, path, n, turn, stream)
                assert reply.header("x-sluice-served-by") == home[n], (n, turn, path)
                assert reply.header("x-sluice-affinity") == "hit", (n, turn, path)
        await trio.testing.wait_all_tasks_blocked()  # the last answer's record handed over
        gw.gateway.hub.drain()  # and the hub's batch written now
        log = (await request(gw.unix, "GET", "/api/v1/requests?limit=8")).json()["requests"]
        later = [e for e in log if e["affinity"] == "hit"]
        assert len(later) == 6, log
        for entry in later:  # every dialect and a stream without usage say what was reused
            assert entry["cachedTokens"] is not None, entry
            assert entry["cachedTokens"] > 100, entry
    for proc in (p1, p2):  # both servers gone, by pid
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)
