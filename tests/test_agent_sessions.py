"""What the coding agents send, routed by cache-aware routing (SPEC §15, §17.2): Codex's
``prompt_cache_key`` and ``session-id`` header, Claude Code's ``x-claude-code-session-id``
header keep a conversation on the node that served it (``affinity: session``); Claude Code's
billing system block, which changes with every request, does not make a request look new.

Two fake sluice nodes behind a balancing gateway, under the autojump clock, as in
tests/test_cache_aware.py; the bodies have the shapes UPSTREAMS.md recorded from the real
CLIs."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from tests.client import request
from tests.conftest import RunningGateway, StartGateway
from tests.fakenode import Hold
from tests.fakeupstream import LLAMA_JSON_HEADERS, ReceivedRequest, ResponseWriter
from tests.test_cache_aware import PromptCache, affinity_of, cache_pool, while_a_is_busy
from tests.test_forwarding import MODEL

RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
SESSION = "019a2b3c-4d5e-7f60-8a9b-0c1d2e3f4a5b"


async def answered(req: ReceivedRequest, w: ResponseWriter) -> None:
    """A Responses or Messages answer that says some prompt tokens were reused."""
    await w.json(200, {"id": "x", "usage": {"input_tokens": 900, "output_tokens": 1,
                                            "cache_read_input_tokens": 400,
                                            "input_tokens_details": {"cached_tokens": 400}}},
                 LLAMA_JSON_HEADERS)


def codex(turn: int, **extra: Any) -> bytes:
    """Codex's turn ``turn``: two developer messages, then the user's, growing; the key
    only where ``extra`` gives it."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": f"question {turn}"}]}]
    return json.dumps({"model": MODEL, "stream": False, "input": items, "store": False,
                       "tools": [], "tool_choice": "auto", **extra}).encode()


def claude(cch: str, text: str, **extra: Any) -> bytes:
    """A Claude Code Messages request: the billing block, then its system prompt."""
    system = [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.123; "
                                 f"cc_entrypoint=sdk-cli; cch={cch};"},
        {"type": "text", "text": "You are Claude Code, an agent. " * 40,
         "cache_control": {"type": "ephemeral"}}]
    return json.dumps({"model": MODEL, "max_tokens": 64, "system": system, "messages": [
        {"role": "user", "content": [{"type": "text", "text": text}]}], **extra}).encode()


async def post(gw: RunningGateway, path: str, body: bytes,
               headers: list[tuple[str, str]] | None = None) -> Any:
    reply = await request(gw.unix, "POST", path, body,
                          [("anthropic-version", "2023-06-01"), *(headers or [])])
    assert reply.status == 200, reply.body
    return reply


def where(reply: Any) -> tuple[str | None, str | None]:
    served = reply.header("x-sluice-served-by")
    return (None if served is None else str(served)), affinity_of(reply)


async def test_agent_sessions_stay_on_their_node(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """Each conversation starts while node-a is busy, so on node-b; its later turns (short,
    sharing no prefix block) come back to node-b by their session key alone, though node-a
    is idle and first by priority: Codex's ``prompt_cache_key``, Codex's ``session-id``
    header, Claude Code's ``x-claude-code-session-id`` header."""
    hold = Hold(PromptCache("node-a"))
    gw, nodes = await cache_pool(nursery, start_gateway, short_tmp, hold, PromptCache("node-b"))
    for node in nodes:
        node.on("POST", RESPONSES, answered)
        node.on("POST", MESSAGES, answered)
    conversations: list[tuple[str, Any, list[tuple[str, str]]]] = [
        (RESPONSES, lambda t: codex(t, prompt_cache_key=SESSION), []),
        (RESPONSES, codex, [("session-id", "codex-2"), ("thread-id", "codex-2")]),
        (MESSAGES, lambda t: claude("00000", f"question {t}"),
         [("X-Claude-Code-Session-Id", "claude-3")]),
    ]

    async def first_turns() -> None:
        for path, body, headers in conversations:
            assert where(await post(gw, path, body(1), headers))[0] == "node:node-b"

    await while_a_is_busy(gw, hold, first_turns)
    for turn in range(2, 5):
        for path, body, headers in conversations:
            reply = await post(gw, path, body(turn), headers)
            assert where(reply) == ("node:node-b", "session"), (path, headers, turn)
    stranger = await post(gw, RESPONSES, codex(9))  # no key: priority, node-a
    assert where(stranger) == ("node:node-a", "miss")


async def test_the_billing_block_does_not_make_a_request_new(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """Two Messages requests that differ only in the billing block's ``cch=``: the second is
    a ``hit`` on the node that answered the first; the billing block is still relayed."""
    gw, nodes = await cache_pool(nursery, start_gateway, short_tmp, answered, answered)
    for node in nodes:
        node.on("POST", MESSAGES, answered)
    first = await post(gw, MESSAGES, claude("a1b2c", "What does this repo do?"))
    assert where(first) == ("node:node-a", "miss")
    second = await post(gw, MESSAGES, claude("f9e8d", "What does this repo do?"))
    assert where(second) == ("node:node-a", "hit")
    sent = nodes[0].requests_to(MESSAGES)
    assert [json.loads(r.body)["system"][0]["text"][-10:] for r in sent] == \
        ["cch=a1b2c;", "cch=f9e8d;"]
