"""The real llama.cpp on a long prompt (issue 31): with a keep-alive comment every 2 s
(``--sse-ping-interval 2``) and ``chunk_interval: 1s`` a stream used to be cut a second after
the first comment; now the comments are relayed, ``first_byte`` waits for the first event
with data, and the answer completes in every dialect llama.cpp serves."""

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
from tests.conftest import StartGateway
from tests.llama_server import llama_server
from tests.test_e2e_llama import gguf  # noqa: F401 (fixture)

pytest.importorskip("xllamacpp")

PING = 3  # seconds between llama.cpp's comments (more than the chunk_interval below)
WORDS = 200  # ~2200 prompt tokens: a prefill of several pings on one thread here
CHUNK_INTERVAL = 2.5  # a comment counted as a chunk would trip it; a token gap of a loaded
# machine (both cores busy with the suite's other worker) does not


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


def long_prompt() -> str:
    """Words no earlier request had, so llama.cpp's prompt cache cannot shorten the prefill."""
    seed = random.randrange(10**9)
    return f"{seed} " + " ".join(f"word{seed + i} apple" for i in range(WORDS))


def body_for(path: str) -> bytes:
    text = long_prompt()
    if path == "/v1/responses":
        doc: dict[str, Any] = {"input": text, "max_output_tokens": 8}
    else:
        doc = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return json.dumps({"model": "smol", "stream": True, **doc}).encode()


ENDS = {"/v1/chat/completions": b"data: [DONE]\n\n",
        "/v1/messages": b"event: message_stop\n",
        "/v1/responses": b"event: response.completed\n"}


async def test_a_long_prefill_completes_behind_llama_cpps_comments(
        llama: str, start_gateway: StartGateway) -> None:
    """One dialect after the other: at once, one slot's prefill would hold the others'
    generation longer than the chunk_interval (a real gap, not a keep-alive)."""
    gw = await start_gateway([("llama", llama)], first_byte=90,
                             chunk_interval=CHUNK_INTERVAL, stream_total=180)
    for path, end in ENDS.items():
        with trio.fail_after(120):
            reply = await request(gw.unix, "POST", path, body_for(path),
                                  [("anthropic-version", "2023-06-01")])
        assert (reply.status, reply.complete) == (200, True), (path, reply.body[-300:])
        before = reply.body[:reply.body.index(b"data:")]
        assert before.startswith(b":"), (path, before)  # the prefill sent comments...
        assert b"error" not in reply.body, path
        assert end in reply.body, path  # ...and the answer came whole after them
        log = (await request(gw.unix, "GET", "/api/v1/requests?limit=1")).json()["requests"]
        entry = log[0]
        assert (entry["path"], entry["outcome"]) == (path, "success")
        assert entry["ttftMs"] > entry["ttfbMs"] + 1000 * (PING - 1), entry
        assert entry["events"] > 0
