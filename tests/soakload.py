"""The soak's parts (tests/test_e2e_soak.py): a fake model server whose behaviour each request
chooses, the clients that load a real gateway process, and what /proc says about it.

Every chat request carries ``"soak": {"id": ..., "act": ...}`` in its JSON body (the gateway
forwards the body byte for byte); :class:`SoakUpstream` reads it:

- ``"ok"``: a whole SSE stream (:data:`EVENTS` events ``soak.gap`` seconds apart, then
  ``data: [DONE]``); the client must get exactly those bytes;
- ``"abort"``: the head and two events, then the stream is held until the gateway closes the
  connection (the client closes mid-stream, so the abort always lands mid-stream);
- ``"reset"`` (an injected fault): the head and two events, then a TCP reset; the client
  must get those events, one SSE error event and a connection ended without the last chunk;
- ``"status"`` (an injected fault): a 500 before any head; the client must get a 5xx.

Each client (:func:`client_loop`) keeps one keep-alive connection, opens a new one after an
abort or a fault, and draws its acts from its own seeded ``random.Random``: the run is the
same every time for the same parameters (only how many requests fit in the time varies).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
from collections import Counter
from pathlib import Path

import attrs
import h11
import trio

from tests.client import CHAT, Client, read_events
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    sse_events,
    status,
)

EVENTS = 6  # chat.completion.chunk events per stream (then data: [DONE])
GAP = 0.02  # seconds between two events of a stream, unless the request says otherwise
HEAD_EVENTS = 2  # events sent before an abort hold or a reset
ABORT_RATE = 0.10
FAULT_RATE = 0.05
REQUEST_LIMIT = 30.0  # one request's client-side bound (a hang is an unexpected outcome)
WARM_PREFIX = "w-1-"  # the soak ids of the warm-up client (worker -1)
STREAM = sse_events(EVENTS)
WHOLE = b"".join(STREAM)


class SoakUpstream(FakeUpstream):
    """A FakeUpstream answering chats by the request's ``soak.act`` (module docstring);
    ``attempts`` counts requests per soak id (the gateway's tries of one client request)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: Counter[str] = Counter()
        self.acts: Counter[str] = Counter()
        self._status = status(500)
        self.on("POST", CHAT, self._chat)

    def open_connections(self) -> int:
        """Connections accepted and not ended yet (read from another thread: a snapshot)."""
        return self.connections_opened - len(self.ended_at)

    async def _chat(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        soak = req.json()["soak"]
        act = soak["act"]
        gap = float(soak.get("gap", GAP))
        self.attempts[soak["id"]] += 1
        self.acts[act] += 1
        if act == "status":
            await self._status(req, w)
            return
        await w.head(200, LLAMA_SSE_HEADERS)
        for i, event in enumerate(STREAM):
            if i == HEAD_EVENTS and act in ("abort", "reset"):
                if act == "reset":
                    await w.reset()
                    return
                await w.stall()  # until the gateway closes: the handler is cancelled
            if i:
                await trio.sleep(gap)
            await w.chunk(event)
        await w.end()


@attrs.define
class Tally:
    """What the clients saw, summed over all of them."""

    requests: int = 0
    ok: int = 0
    aborts: int = 0
    injected: Counter[str] = attrs.Factory(Counter)  # fault -> requests that carried it
    as_expected: Counter[str] = attrs.Factory(Counter)  # fault -> the expected client outcome
    client_errors: int = 0  # requests that did not end in a whole 200 stream (aborts aside)
    unexpected: list[str] = attrs.Factory(list)  # what went wrong, first few
    unexpected_count: int = 0
    connections: int = 0
    streaming: int = 0  # clients mid-stream right now
    streams_held: int = 0  # the most at once

    def wrong(self, what: str) -> None:
        self.unexpected_count += 1
        if len(self.unexpected) < 10:
            self.unexpected.append(what)


def act_for(rng: random.Random) -> str:
    draw = rng.random()
    if draw < ABORT_RATE:
        return "abort"
    if draw < ABORT_RATE + FAULT_RATE:
        return rng.choice(("reset", "status"))
    return "ok"


def body_for(soak_id: str, act: str, gap: float = GAP) -> bytes:
    return json.dumps({"model": "fake-model", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}],
                       "soak": {"id": soak_id, "act": act, "gap": gap}}).encode()


async def close_client(client: Client, abrupt: bool) -> None:
    """Close like a client that went away: RST on TCP when ``abrupt``, else a plain close."""
    sock = client.stream.socket
    if abrupt and sock.family == socket.AF_INET:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.aclose()


async def one_request(client: Client, soak_id: str, act: str, tally: Tally,
                      gap: float = GAP) -> bool:
    """Send one stream and check its outcome; True if the connection may be reused."""
    await client.send_request("POST", CHAT, body_for(soak_id, act, gap),
                              [("content-type", "application/json")])
    head = await client.read_head()
    if act == "abort":
        if head.status_code != 200:
            tally.wrong(f"{soak_id} abort: status {head.status_code}")
            return False
        tally.streaming += 1
        tally.streams_held = max(tally.streams_held, tally.streaming)
        try:
            got = await read_events(client, HEAD_EVENTS)
        finally:
            tally.streaming -= 1
        if got != b"".join(STREAM[:HEAD_EVENTS]):
            tally.wrong(f"{soak_id} abort: got {got[:120]!r}")
        tally.aborts += 1
        return False
    tally.streaming += 1
    tally.streams_held = max(tally.streams_held, tally.streaming)
    try:
        reply = await client.read_reply(head)
    finally:
        tally.streaming -= 1
    if act == "ok":
        if reply.status == 200 and reply.complete and reply.body == WHOLE:
            tally.ok += 1
            return True
        tally.client_errors += 1
        tally.wrong(f"{soak_id} ok: {reply!r} {reply.body[-160:]!r}")
        return False
    tally.client_errors += 1
    if act == "status":
        expected = 500 <= reply.status < 600 and reply.complete
    else:  # reset: the events sent, then one SSE error event, and no last chunk
        prefix = b"".join(STREAM[:HEAD_EVENTS])
        rest = reply.body[len(prefix):]
        expected = (reply.status == 200 and not reply.complete and reply.body.startswith(prefix)
                    and rest.startswith(b'data: {"error"') and rest.count(b"\n\n") == 1
                    and rest.endswith(b"\n\n"))
    if expected:
        tally.as_expected[act] += 1
    else:
        tally.wrong(f"{soak_id} {act}: {reply!r} {reply.body[-200:]!r}")
    return reply.complete and client.h11.our_state is h11.IDLE


async def client_loop(address: str, worker: int, seed: int, until: float, max_requests: int,
                      tally: Tally, *, plain: bool = False, gap: float = GAP) -> None:
    """One client: streams one after another until ``until`` (trio time) or
    ``max_requests``, on a keep-alive connection it replaces when it cannot be reused;
    ``plain``: whole streams only (no aborts, no faults); ``gap``: between two events."""
    rng = random.Random(seed * 100_003 + worker)
    client: Client | None = None
    try:
        for n in range(max_requests):
            if trio.current_time() >= until:
                break
            act = "ok" if plain else act_for(rng)
            if client is None:
                client = await Client.open(address)
                tally.connections += 1
            tally.requests += 1
            if act in ("reset", "status"):
                tally.injected[act] += 1
            reuse = False
            with trio.move_on_after(REQUEST_LIMIT) as scope:
                try:
                    reuse = await one_request(client, f"w{worker}-{n}", act, tally, gap)
                except (trio.BrokenResourceError, OSError, AssertionError) as exc:
                    tally.client_errors += act != "abort"
                    tally.wrong(f"w{worker}-{n} {act}: {exc!r}")
            if scope.cancelled_caught:
                tally.wrong(f"w{worker}-{n} {act}: no outcome in {REQUEST_LIMIT}s")
            if not reuse:
                await close_client(client, abrupt=rng.random() < 0.5)
                client = None
    finally:
        if client is not None:
            await client.aclose()


# ------------------------------------------------------------------------------ /proc


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")
