"""Cache-aware routing through a real gateway (SPEC §15): in-process, under the autojump
clock, with fake nodes that keep a prompt cache of their own (:class:`PromptCache`: the
tokens it reports reused are the longest prefix it has already seen, as llama.cpp does).

The conversations here are long enough for several prefix blocks (512 characters each):
a shared system prompt, a private document per conversation, then turns."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio.testing

from protocol.slots import Slots
from tests.client import CHAT, request
from tests.conftest import RunningGateway, StartGateway, admin_headers, configure, node
from tests.fakenode import FakeNode, Hold, start_node
from tests.fakeupstream import LLAMA_JSON_HEADERS, FakeUpstream, ReceivedRequest, ResponseWriter
from tests.test_forwarding import MODEL, pool

SYSTEM = "You are a careful assistant who answers briefly. " * 40  # ~2,000 characters
REQUESTS = "/api/v1/requests"


def document(n: int) -> str:
    """Conversation ``n``'s private document: ~1,500 characters of its own."""
    return " ".join(f"fact-{n}-{i}" for i in range(150))


def conversation(n: int, turns: int) -> list[dict[str, str]]:
    """The messages of conversation ``n`` at its turn ``turns`` (1 = the first question)."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": document(n) + " What is fact 1?"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {t}"},
                     {"role": "user", "content": f"And fact {t + 1}?"}]
    return messages


def prompt_of(req: ReceivedRequest) -> str:
    doc = json.loads(req.body)
    return "".join(f"{m['role']}:{m['content']}|" for m in doc.get("messages", []))


class PromptCache:
    """A chat handler that remembers every prompt it answered and reports, as llama.cpp
    does, the prompt tokens it could reuse (here: characters of the longest common prefix
    with a prompt it saw, over 4) in ``usage.prompt_tokens_details.cached_tokens``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[str] = []
        self.reused: list[int] = []
        self.forgetful = False  # True: reports nothing reused (its cache was cleared)

    async def __call__(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        prompt = prompt_of(req)
        best = 0 if self.forgetful else max(
            (_common(prompt, old) for old in self.seen), default=0)
        self.seen.append(prompt)
        cached = best // 4
        self.reused.append(cached)
        await w.json(200, {
            "choices": [{"finish_reason": "stop", "index": 0,
                         "message": {"role": "assistant", "content": f"from {self.name}"}}],
            "object": "chat.completion", "model": MODEL,
            "usage": {"completion_tokens": 1, "prompt_tokens": len(prompt) // 4,
                      "total_tokens": len(prompt) // 4 + 1,
                      "prompt_tokens_details": {"cached_tokens": cached}}},
            LLAMA_JSON_HEADERS)


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def ask(gw: RunningGateway, messages: list[dict[str, str]],
              headers: list[tuple[str, str]] | None = None, **extra: Any) -> Any:
    body = json.dumps({"model": MODEL, "messages": messages, **extra}).encode()
    reply = await request(gw.unix, "POST", CHAT, body, headers=headers)
    assert reply.status == 200, reply.body
    return reply


def affinity_of(reply: Any) -> str | None:
    value = reply.header("x-sluice-affinity")
    return None if value is None else str(value)


async def log(gw: RunningGateway) -> list[dict[str, Any]]:
    reply = await request(gw.unix, "GET", REQUESTS, headers=admin_headers(gw))
    entries: list[dict[str, Any]] = reply.json()["requests"]
    return entries


async def cache_pool(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Any,
                     *handlers: Any, **lb: Any) -> tuple[RunningGateway, list[FakeNode]]:
    return await pool(nursery, start_gateway, short_tmp, *handlers,
                      lb={"strategy": "cache-aware", **lb})


async def busy_pool(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Any
                    ) -> tuple[RunningGateway, Hold, PromptCache]:
    """Two nodes with a prompt cache each; node-a's requests are parked by the Hold."""
    b = PromptCache("node-b")
    hold = Hold(PromptCache("node-a"))
    gw, _ = await cache_pool(nursery, start_gateway, short_tmp, hold, b)
    return gw, hold, b


async def while_a_is_busy(gw: RunningGateway, hold: Hold,
                          then: Callable[[], Awaitable[None]]) -> None:
    """Run ``then`` while one request is parked on node-a, then let it finish."""
    async with trio.open_nursery() as inner:
        inner.start_soon(ask, gw, [{"role": "user", "content": "park"}])
        await hold.wait_arrived(1)
        await then()
        hold.release()


async def test_a_conversation_stays_where_it_is_warm(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """Two conversations start at once: the second goes to the idle node (least busy, as
    both are cold). Every later turn of each goes back to its node: ``hit``, in the header
    and the log, with the node's reused tokens as ``cachedTokens``; priority alone would
    have sent them all to node-a."""
    a, b = PromptCache("node-a"), PromptCache("node-b")
    hold = Hold(a)
    gw, (_node_a, _node_b) = await cache_pool(nursery, start_gateway, short_tmp, hold, b)
    async with trio.open_nursery() as inner:
        inner.start_soon(ask, gw, conversation(1, 1))
        await hold.wait_arrived(1)
        second = await ask(gw, conversation(2, 1))  # node-a is busy: node-b
        assert second.header("x-sluice-served-by") == "node:node-b"
        assert affinity_of(second) == "miss"
        hold.release()
    for turn in range(2, 5):
        for n, home in ((1, "node:node-a"), (2, "node:node-b")):
            reply = await ask(gw, conversation(n, turn))
            assert reply.header("x-sluice-served-by") == home, (n, turn)
            assert affinity_of(reply) == "hit", (n, turn)
    assert len(a.seen) == len(b.seen) == 4
    assert all(r > 0 for r in a.reused[1:] + b.reused[1:])  # every later turn reused
    await trio.sleep(0.1)  # the hub's batch
    entries = await log(gw)
    hits = [e for e in entries if e["affinity"] == "hit"]
    assert len(hits) == 6
    assert all(e["cachedTokens"] and e["cachedTokens"] > 400 for e in hits)
    stats = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()
    rates = {n["fingerprint"]: n["cacheHitRate"] for n in stats["nodes"]}
    assert 0.5 < rates["node-a"] < 1
    assert 0.5 < rates["node-b"] < 1
    metrics = (await request(gw.unix, "GET", "/metrics")).body.decode()
    assert 'sluice_routing_affinity_total{result="hit"} 6' in metrics
    assert 'sluice_prompt_tokens_cached_total{model="remote-m",upstream="node:node-b"}' \
        in metrics


async def test_a_warm_node_too_busy_is_passed_over(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """node-a holds the conversation but has requests waiting (in flight beyond its one
    slot, as it reports none) more than load_bound beyond node-b's: ``miss`` to node-b.
    With one waiting fewer it is within the bound again: ``hit``."""
    a, b = PromptCache("node-a"), PromptCache("node-b")
    gw, (node_a, _) = await cache_pool(nursery, start_gateway, short_tmp, a, b)
    await ask(gw, conversation(1, 1))  # node-a, by priority (both idle, no match)
    hold = Hold(a)
    node_a.answer(hold)
    async with trio.open_nursery() as inner:
        for n in (7, 8):  # two other conversations parked on node-a: in flight 2, waiting 1
            inner.start_soon(ask, gw, conversation(n, 1), [("x-sluice-session", f"s{n}")])
        await hold.wait_arrived(2)
        # waiting 1 - 0 <= bound 1: still node-a (its cache), parked too
        inner.start_soon(ask, gw, conversation(1, 2))
        await hold.wait_arrived(3)
        # node-a: in flight 3, waiting 2 > 0 + 1: passed over for node-b
        reply = await ask(gw, conversation(1, 3))
        assert reply.header("x-sluice-served-by") == "node:node-b"
        assert affinity_of(reply) == "miss"
        hold.release()


async def test_a_session_key_pins_a_conversation_before_its_prefix_is_long(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """Short, changing prompts share no block; the session key (header, else OpenAI's
    ``user``) keeps them on the node that served the session last."""
    gw, hold, _ = await busy_pool(nursery, start_gateway, short_tmp)

    async def meanwhile() -> None:
        first = await ask(gw, [{"role": "user", "content": "hello"}],
                          [("x-sluice-session", "chat-42")])
        assert first.header("x-sluice-served-by") == "node:node-b"
        by_user = await ask(gw, [{"role": "user", "content": "hi"}], user="alice")
        assert by_user.header("x-sluice-served-by") == "node:node-b"

    await while_a_is_busy(gw, hold, meanwhile)
    for i in range(3):
        again = await ask(gw, [{"role": "user", "content": f"question {i}"}],
                          [("x-sluice-session", "chat-42")])
        assert again.header("x-sluice-served-by") == "node:node-b"
        assert affinity_of(again) == "session"
        alice = await ask(gw, [{"role": "user", "content": f"other {i}"}], user="alice")
        assert alice.header("x-sluice-served-by") == "node:node-b"
        assert affinity_of(alice) == "session"
    stranger = await ask(gw, [{"role": "user", "content": "new"}])
    assert stranger.header("x-sluice-served-by") == "node:node-a"  # no session: by priority
    assert affinity_of(stranger) == "miss"


async def test_a_predicted_hit_that_reused_nothing_is_forgotten(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """node-b held the conversation (8 blocks), then lost its cache: its answer reuses 0
    tokens, so the index drops what it believed, and the next turn is no longer a hit."""
    gw, hold, b = await busy_pool(nursery, start_gateway, short_tmp)

    async def meanwhile() -> None:
        first = await ask(gw, conversation(3, 1))
        assert first.header("x-sluice-served-by") == "node:node-b"

    await while_a_is_busy(gw, hold, meanwhile)
    b.forgetful = True
    reply = await ask(gw, conversation(3, 2))
    assert (reply.header("x-sluice-served-by"), affinity_of(reply)) == ("node:node-b", "hit")
    assert b.reused[-1] == 0
    after = await ask(gw, conversation(3, 3))
    assert affinity_of(after) == "miss"  # nothing recorded anywhere: by load, then priority
    assert after.header("x-sluice-served-by") == "node:node-a"


async def test_one_candidate_has_no_affinity_and_other_strategies_none(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    gw, _ = await cache_pool(nursery, start_gateway, short_tmp, PromptCache("node-a"))
    reply = await ask(gw, conversation(1, 1))
    assert reply.header("x-sluice-affinity") is None
    await trio.sleep(0.1)
    entry = (await log(gw))[0]
    assert entry["affinity"] is None
    assert entry["cachedTokens"] == 0
    (short_tmp / "rr").mkdir()
    gw2, _ = await pool(nursery, start_gateway, short_tmp / "rr", PromptCache("node-a"),
                        PromptCache("node-b"), lb={"strategy": "round-robin"})
    assert (await ask(gw2, conversation(1, 1))).header("x-sluice-affinity") is None


def spill(gw: RunningGateway, on: bool) -> None:
    """load_balancing.spill_over, in the live config."""
    cfg = gw.gateway.settings.config
    gw.gateway.settings.config = attrs.evolve(cfg, load_balancing=attrs.evolve(
        cfg.load_balancing, spill_over=on))


async def test_spill_over_to_a_node_with_a_free_slot(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    """The local llama.cpp has one slot, busy: with spill_over on, the next request goes to
    the node that reports a free slot (``spill``); off, it stays local (local first: sent
    to the full server, as with ``scheduling.queue: false``; with the queue it waits in
    sluice instead, tests/test_queue.py)."""
    hold = Hold(PromptCache("local"))
    local = FakeUpstream(models=[MODEL], unix_path=str(short_tmp / "local.sock"))
    local.on("POST", CHAT, hold)

    async def slots(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, [{"id": 0, "n_ctx": 1024, "is_processing": hold.arrived > 0}])

    local.on("GET", "/slots", slots)
    await nursery.start(local.serve)
    gw = await start_gateway([("mine", local.url)])
    node_a = await start_node(nursery, str(short_tmp / "a.sock"), [MODEL],
                              answer=PromptCache("node-a"))
    node_a.slots[MODEL] = (1, 2)
    cfg = gw.gateway.settings.config
    gw.gateway.settings.config = attrs.evolve(
        cfg, scheduling=attrs.evolve(cfg.scheduling, queue=False))
    spill(gw, True)
    configure(gw, (node("node-a", node_a.url, 1),), enabled=True)
    await trio.sleep(0.1)
    assert gw.gateway.backends.backends[0].slots == Slots(total=1, busy=0)
    assert gw.gateway.nodes.endpoints[0].slots[MODEL] == Slots(total=2, busy=1)
    async with trio.open_nursery() as inner:
        inner.start_soon(ask, gw, conversation(1, 1))
        await hold.wait_arrived(1)
        spilled = await ask(gw, conversation(2, 1))
        assert spilled.header("x-sluice-served-by") == "node:node-a"
        assert affinity_of(spilled) == "spill"
        spill(gw, False)
        inner.start_soon(ask, gw, conversation(3, 1))
        await hold.wait_arrived(2)  # local first: it waits for the local server
        hold.release()
    node_a.slots[MODEL] = (2, 2)  # the node is full too: stays local even with spill-over
    spill(gw, True)
    await trio.sleep(6)  # the next node check
    assert gw.gateway.nodes.endpoints[0].slots[MODEL] == Slots(total=2, busy=2)
    hold2 = Hold(PromptCache("local"))
    local.on("POST", CHAT, hold2)
    async with trio.open_nursery() as inner:
        inner.start_soon(ask, gw, conversation(4, 1))
        await hold2.wait_arrived(1)
        inner.start_soon(ask, gw, conversation(5, 1))
        await hold2.wait_arrived(2)
        hold2.release()
