"""The real llama.cpp on a long prompt (issue 31): with a keep-alive comment every 2 s
(``--sse-ping-interval 2``) and ``chunk_interval: 1s`` a stream used to be cut a second after
the first comment; now the comments are relayed, ``first_byte`` waits for the first event
with data, and the answer completes in every dialect llama.cpp serves.

The prompt's length is measured for the machine (:func:`words_for_prefill`): long enough for
a prefill of a few comments, not minutes of one on a slow core."""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.client import request
from tests.conftest import RunningGateway, StartGateway
from tests.llama_server import llama_server
from tests.test_e2e_llama import gguf  # noqa: F401 (fixture)

pytest.importorskip("xllamacpp")

PING = 2  # seconds between llama.cpp's comments (more than the chunk_interval below)
CHUNK_INTERVAL = 1.5  # a comment counted as a chunk would trip it; a token gap does not (each
# test worker has a core of its own: tests/workers.py)
PREFILL = 3 * PING  # seconds of prefill wanted: comments before the first token, with room
CALIBRATION_WORDS = 20  # the first, short request's prompt: it times this machine's prefill
# (about 11 tokens a word; half the least prompt below, so half its prefill's time)
WORDS_RANGE = (40, 600)  # the prompt's words at most (a slow machine) and at least


@pytest.fixture
async def llama(short_tmp: Path, gguf: Path) -> AsyncIterator[str]:  # noqa: F811
    """A llama.cpp server that the gateway does not manage, sending its comments often."""
    async with llama_server(gguf, "smol", str(short_tmp / "llama.sock"), "--context", "4096",
                            "--parallel", "1", "--threads", "1",
                            "--sse-ping-interval", str(PING)) as (url, proc):
        yield url
    assert proc.returncode == 0
    with pytest.raises(ProcessLookupError):  # gone, by its pid
        os.kill(proc.pid, 0)


def long_prompt(words: int) -> str:
    """Words no earlier request had, so llama.cpp's prompt cache cannot shorten the prefill."""
    seed = random.randrange(10**9)
    return f"{seed} " + " ".join(f"word{seed + i} apple" for i in range(words))


def body_for(path: str, words: int) -> bytes:
    text = long_prompt(words)
    if path == "/v1/responses":
        doc: dict[str, Any] = {"input": text, "max_output_tokens": 8}
    else:
        doc = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return json.dumps({"model": "smol", "stream": True, **doc}).encode()


async def words_for_prefill(gw: RunningGateway) -> int:
    """The prompt's words for a prefill of about :data:`PREFILL` seconds on this machine,
    from the time to the first token of a short prompt (through the gateway, so the run's
    machine, load and core count are all in it)."""
    path = "/v1/chat/completions"
    with trio.fail_after(120):
        reply = await request(gw.unix, "POST", path, body_for(path, CALIBRATION_WORDS))
    assert (reply.status, reply.complete) == (200, True), reply.body[-300:]
    entry = (await request(gw.unix, "GET", "/api/v1/requests?limit=1")).json()["requests"][0]
    seconds = max(entry["ttftMs"] / 1000, 0.05)
    low, high = WORDS_RANGE
    return int(min(max(CALIBRATION_WORDS * PREFILL / seconds, low), high))


ENDS = {"/v1/chat/completions": b"data: [DONE]\n\n",
        "/v1/messages": b"event: message_stop\n",
        "/v1/responses": b"event: response.completed\n"}


async def test_a_long_prefill_completes_behind_llama_cpps_comments(
        llama: str, start_gateway: StartGateway) -> None:
    """One dialect after the other: at once, one slot's prefill would hold the others'
    generation longer than the chunk_interval (a real gap, not a keep-alive)."""
    gw = await start_gateway([("llama", llama)], first_byte=90,
                             chunk_interval=CHUNK_INTERVAL, stream_total=180)
    words = await words_for_prefill(gw)
    for path, end in ENDS.items():
        with trio.fail_after(120):
            reply = await request(gw.unix, "POST", path, body_for(path, words),
                                  [("anthropic-version", "2023-06-01")])
        assert (reply.status, reply.complete) == (200, True), (path, reply.body[-300:])
        before = reply.body[:reply.body.index(b"data:")]
        assert before.startswith(b":"), (path, words, before)  # the prefill sent comments...
        assert b"error" not in reply.body, path
        assert end in reply.body, path  # ...and the answer came whole after them
        log = (await request(gw.unix, "GET", "/api/v1/requests?limit=1")).json()["requests"]
        entry = log[0]
        assert (entry["path"], entry["outcome"]) == (path, "success")
        assert entry["ttftMs"] > entry["ttfbMs"] + 1000 * (PING - 1), (words, entry)
        assert entry["events"] > 0
