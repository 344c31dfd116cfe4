"""A client that leaves once it has read a stream's last event got the whole answer (issue 39):
the Codex CLI closes its connection at ``response.completed``, the OpenAI SDKs at ``data:
[DONE]``, an Ollama app at the line with ``done: true``; the upstream's chunked body has not
ended yet. That request is a success in the request log, the routing stats and the metrics;
a client that leaves before the last event is still an abort.

In-process, under the autojump clock: a fake model server sends each event as a chunk of
its own and then holds the body open (no terminating chunk) until the gateway closes the
connection; the client reads up to the event it is to leave at and closes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from tests.client import CHAT, Client, chat_body, read_events, read_until, request
from tests.conftest import RunningGateway, StartGateway
from tests.fakeupstream import LLAMA_SSE_HEADERS, ReceivedRequest, ResponseWriter, sse_events
from tests.test_dialects import MESSAGES, RESPONSES, anthropic_stream, responses_stream
from tests.test_forwarding import MODEL
from tests.test_request_log import entries, local_gateway

HOLD = 600.0  # the upstream's body stays open this long after its last event


def _responses_ending(name: str) -> list[bytes]:
    """The Responses stream with its last event renamed ``name`` (failed, incomplete)."""
    events = responses_stream(MODEL)
    last = events[-1].replace(b"response.completed", name.encode())
    return [*events[:-1], last]


# (its name, the path, the request body, the upstream's events; the last one is the end)
GRAMMARS: list[tuple[str, str, bytes, list[bytes]]] = [
    ("chat [DONE]", CHAT, chat_body(MODEL, stream=True), sse_events(3)),
    ("messages message_stop", MESSAGES,
     json.dumps({"model": MODEL, "max_tokens": 8, "stream": True,
                 "messages": [{"role": "user", "content": "hi"}]}).encode(),
     anthropic_stream("a b c", MODEL)),
    *((f"responses {name}", RESPONSES,
       json.dumps({"model": MODEL, "stream": True, "input": "hi"}).encode(),
       _responses_ending(name))
      for name in ("response.completed", "response.failed", "response.incomplete")),
]


def held(events: list[bytes], pause_before: int | None = None) -> Any:
    """Each event as one chunk (after a pause before event ``pause_before``), then the body
    held open: no terminating chunk until the gateway goes away."""
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for i, event in enumerate(events):
            if i == pause_before:
                await trio.sleep(5)
            await w.chunk(event)
        await trio.sleep(HOLD)
        await w.end()

    return handler


async def leave_after(gw: RunningGateway, path: str, body: bytes,
                      read_to_leave: Callable[[Client], Awaitable[bytes]]) -> bytes:
    """One request whose client reads with ``read_to_leave`` and then closes; well before the
    upstream's body would end."""
    client = await Client.open(gw.unix)
    try:
        await client.send_request("POST", path, body)
        with trio.fail_after(HOLD / 2):  # the last event never came before the body's end
            assert (await client.read_head()).status_code == 200
            got = await read_to_leave(client)
    finally:
        await client.aclose()
    await trio.sleep(1)
    return got


async def outcomes(gw: RunningGateway) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """The request log's outcomes (oldest first), the local backend's routing stats and the
    metrics' attempts by outcome."""
    log = [e["outcome"] for e in reversed(await entries(gw))]
    local = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()["local"]
    metrics = (await request(gw.unix, "GET", "/metrics")).body.decode()
    attempts = {line.partition('outcome="')[2].partition('"')[0]: int(line.rpartition(" ")[2])
                for line in metrics.splitlines()
                if line.startswith("sluice_upstream_attempts_total{")}
    return log, {k: local[k] for k in ("successCount", "abortedCount")}, attempts


@pytest.mark.parametrize(("path", "body", "events"),
                         [g[1:] for g in GRAMMARS], ids=[g[0] for g in GRAMMARS])
async def test_a_client_that_leaves_at_the_last_event_got_the_whole_answer(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway, path: str, body: bytes, events: list[bytes]) -> None:
    # apis native: the fake gets its Messages and Responses routes after the start, so the
    # health check's probe would find them missing and translate (SPEC §17.1)
    gw, up = await local_gateway(nursery, short_tmp, start_gateway, apis="native")
    # Leaves at the last event, the body still open: the whole answer.
    up.on("POST", path, held(events))
    got = await leave_after(gw, path, body, lambda c: read_events(c, len(events)))
    assert got == b"".join(events)  # byte for byte, the last event included
    assert up.closed_at  # the gateway let the held upstream connection go
    # Leaves one event short (the upstream pauses before its last one): an abort.
    up.on("POST", path, held(events, pause_before=len(events) - 1))
    await leave_after(gw, path, body, lambda c: read_events(c, len(events) - 1))
    log, stats, attempts = await outcomes(gw)
    assert log == ["success", "aborted"]
    assert stats == {"successCount": 1, "abortedCount": 1}
    assert attempts == {"success": 1, "aborted": 1}


async def read_ollama_lines(client: Client, count: int | None = None) -> bytes:
    """An Ollama stream's bytes until its line with ``done: true`` (or ``count`` lines)."""

    def enough(got: bytes) -> bool:
        lines = [json.loads(line) for line in got.split(b"\n")[:-1]]
        return bool((lines and lines[-1].get("done"))
                    or (count is not None and len(lines) >= count))

    return await read_until(client, enough)


async def test_an_ollama_client_that_leaves_at_done_got_the_whole_answer(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    """An OpenAI stream translated to Ollama's: the line with ``done: true`` goes out when the
    model server's ``[DONE]`` comes, not when its body ends; a client that leaves after it
    got the whole answer, one that leaves before it did not."""
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    events = sse_events(3)
    up.on("POST", CHAT, held(events))
    got = await leave_after(gw, "/api/chat", body, read_ollama_lines)
    last = json.loads(got.split(b"\n")[-2])
    assert (last["done"], last["done_reason"]) == (True, "stop")
    assert [json.loads(x)["message"]["content"] for x in got.split(b"\n")[:-2]] == ["tok1 "]
    # The upstream pauses before [DONE]: the client leaves with the text but no last line.
    up.on("POST", CHAT, held(events, pause_before=len(events) - 1))
    await leave_after(gw, "/api/chat", body, lambda c: read_ollama_lines(c, 1))
    log, stats, attempts = await outcomes(gw)
    assert log == ["success", "aborted"]
    assert stats == {"successCount": 1, "abortedCount": 1}
    assert attempts == {"success": 1, "aborted": 1}
