"""Cache-aware routing learns a conversation as soon as its answer's last event is read from
the upstream, not when the upstream's body ends (issue 39 item 5; SPEC §15): a client that
sends its next turn the moment it reads ``data: [DONE]`` finds its conversation where it was
answered.

In-process, under the autojump clock: two fake nodes behind a cache-aware gateway. Each
first turn is streamed, ``[DONE]`` included, and then the node holds the body's terminating
chunk until that conversation's second turn has arrived at a node (an event, set by the
second turn's handler: the second turn is always routed while the first one's body is still
open). Every other conversation runs while a request of no conversation is parked on
node-a, so its first turn goes to node-b (the less busy); the second turn then finds both
nodes equally busy, and only what the index knows sends it back to node-b.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from tests.client import CHAT, Client, read_events, request
from tests.conftest import StartGateway
from tests.fakenode import stream_events
from tests.fakeupstream import LLAMA_SSE_HEADERS, ReceivedRequest, ResponseWriter, json_completion
from tests.test_cache_aware import cache_pool, document
from tests.test_forwarding import MODEL

CONVERSATIONS = 20
SERVED_BY = "x-sluice-served-by"
PARK = "park"


def conversation(n: int, turns: int) -> list[dict[str, str]]:
    """Conversation ``n``'s messages at turn ``turns`` (1 or 2): ~3,000 characters of its
    own (several prefix blocks, none shared with another conversation)."""
    messages = [{"role": "user", "content": document(n) * 2 + " What is fact 1?"}]
    if turns > 1:
        messages += [{"role": "assistant", "content": "answer 1"},
                     {"role": "user", "content": "And fact 2?"}]
    return messages


class HeldEnds:
    """The nodes' handler: a first turn streamed with ``[DONE]``, its terminating chunk held
    until the same conversation's second turn arrives; a second turn answered whole."""

    def __init__(self, name: str, turns: dict[int, trio.Event], parked: Park) -> None:
        self.name = name
        self.turns = turns  # conversation -> set when its second turn arrived (anywhere)
        self.parked = parked

    async def __call__(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        doc = req.json()
        text = doc["messages"][0]["content"]
        if text == PARK:
            await self.parked(req, w)
            return
        n = next(i for i in range(CONVERSATIONS) if document(i) in text)
        if len(doc["messages"]) > 1:  # a second turn
            self.turns[n].set()
            await json_completion(f"turn 2 from {self.name}", MODEL)(req, w)
            return
        await w.head(200, LLAMA_SSE_HEADERS)
        for event in stream_events(f"from {self.name}"):
            await w.chunk(event)
        await self.turns[n].wait()
        await w.end()


class Park:
    """A request parked until ``released`` is set: it keeps its node busy. :meth:`renew`
    readies it for the next one."""

    def __init__(self) -> None:
        self.arrived = trio.Event()
        self.released = trio.Event()

    def renew(self) -> None:
        self.arrived = trio.Event()
        self.released = trio.Event()

    async def __call__(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        self.arrived.set()
        await self.released.wait()
        await json_completion("parked", MODEL)(req, w)


async def test_the_next_turn_sent_at_done_finds_its_conversation(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Any) -> None:
    turns = {n: trio.Event() for n in range(CONVERSATIONS)}
    parked = Park()
    gw, _ = await cache_pool(nursery, start_gateway, short_tmp,
                             HeldEnds("node-a", turns, parked), HeldEnds("node-b", turns, parked))
    served: dict[int, tuple[str, str]] = {}  # conversation -> (turn 1's node, turn 2's)

    async def talk(n: int) -> None:
        """Turn 1 streamed, read up to [DONE]; turn 2 sent at once, on a new connection (the
        first one's answer has not ended); then the rest of turn 1."""
        first = await Client.open(gw.unix)
        try:
            body = {"model": MODEL, "messages": conversation(n, 1), "stream": True}
            await first.send_request("POST", CHAT, json.dumps(body).encode())
            head = await first.read_head()
            assert head.status_code == 200
            got = await read_events(first, len(stream_events("x")))
            assert got.endswith(b"data: [DONE]\n\n")
            assert not turns[n].is_set()  # the body's last chunk is still held
            body = {"model": MODEL, "messages": conversation(n, 2)}
            second = await request(gw.unix, "POST", CHAT, json.dumps(body).encode())
            assert second.status == 200, second.body
            rest = await first.read_reply(head)
            assert rest.complete
        finally:
            await first.aclose()
        served[n] = (dict(head.headers)[SERVED_BY.encode()].decode(),
                     str(second.header(SERVED_BY)))

    async def park() -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": PARK}]}
        reply = await request(gw.unix, "POST", CHAT, json.dumps(body).encode())
        assert reply.header(SERVED_BY) == "node:node-a"

    for n in range(CONVERSATIONS):
        if n % 2:  # node-a busy: the first turn goes to node-b
            parked.renew()
            async with trio.open_nursery() as inner:
                inner.start_soon(park)
                await parked.arrived.wait()
                await talk(n)
                parked.released.set()
        else:
            await talk(n)
    assert [served[n][0] for n in range(CONVERSATIONS)] == (
        ["node:node-a", "node:node-b"] * (CONVERSATIONS // 2))
    elsewhere = {n: pair for n, pair in served.items() if pair[0] != pair[1]}
    assert not elsewhere, f"{len(elsewhere)} of {CONVERSATIONS} second turns went elsewhere"

