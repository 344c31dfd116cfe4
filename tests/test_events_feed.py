"""The live feed end to end (SPEC §9.3): what the owners publish reaches a trio-websocket
subscriber of ``/api/v1/events`` over TCP and over the Unix socket — a circuit opening,
going half-open and closing, the requests that moved it, a node going offline — in order,
each frame the same as the GET body it stands for. Under the autojump clock (every hop but
the subscriber's a Unix socket), so the breaker's reset timeout passes at once."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
import trio_websocket

from tests.client import CHAT, chat_body, connect, request
from tests.conftest import StartGateway
from tests.fakenode import chat_answer, in_turn
from tests.fakeupstream import status
from tests.test_forwarding import MODEL, pool

RESET = 10.0  # circuit_breaker.reset_timeout here


class Feed:
    """The frames one subscriber received, read in order."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.texts: list[str] = []
        self.unread: list[dict[str, Any]] = []  # frames passed over by next()

    async def next(self, *kinds: str) -> dict[str, Any]:
        """The oldest frame not yet returned of one of these types."""
        for i, frame in enumerate(self.unread):
            if frame["type"] in kinds:
                return self.unread.pop(i)
        with trio.fail_after(60):
            while True:
                self.texts.append(str(await self.ws.get_message()))
                frame = json.loads(self.texts[-1])
                if frame["type"] in kinds:
                    return frame
                self.unread.append(frame)


async def test_circuit_and_node_events_reach_a_subscriber(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway, transport: str) -> None:
    answer = in_turn(status(500), status(500), chat_answer("back"))
    gw, (a,) = await pool(nursery, start_gateway, short_tmp, answer,
                          breaker={"failure_threshold": 2, "reset_timeout": RESET})
    stream = await connect(gw.address(transport))
    async with trio.open_nursery() as client:
        ws = await trio_websocket.wrap_client_stream(client, stream, "localhost",
                                                     "/api/v1/events")
        feed = Feed(ws)
        hello = await feed.next("hello")
        assert hello["data"]["pool"]["endpoints"][0]["status"] == "online"

        for _ in range(2):
            reply = await request(gw.unix, "POST", CHAT, chat_body(MODEL))
            assert reply.status == 500
            finished = await feed.next("request")
            assert (finished["data"]["id"], finished["data"]["outcome"]) == (
                reply.header("x-sluice-request-id"), "failure")
        opened = await feed.next("circuit")
        assert opened["data"] == {"fingerprint": "node-a", "state": "open",
                                  "consecutiveFailures": 2}
        refused = await request(gw.unix, "POST", CHAT, chat_body(MODEL))
        assert refused.json()["error"]["code"] == "all_circuits_open"

        await trio.sleep(RESET)
        half = await feed.next("circuit")
        assert half["data"]["state"] == "half_open"
        assert (await request(gw.unix, "POST", CHAT, chat_body(MODEL))).status == 200
        closed = await feed.next("circuit")
        assert closed["data"] == {"fingerprint": "node-a", "state": "closed",
                                  "consecutiveFailures": 0}
        stats = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()
        assert stats["nodes"][0]["circuitState"] == "closed"

        await a.stop()
        while (entry := (await feed.next("node"))["data"])["status"] != "offline":
            pass
        pool_now = (await request(gw.unix, "GET", "/api/v1/pool/distributed-status")).json()
        assert entry == pool_now["endpoints"][0]
        await ws.aclose()
        await stream.aclose()
    kinds = [json.loads(t)["type"] for t in feed.texts]
    assert kinds[0] == "hello"
    assert "resync" not in kinds
    assert gw.gateway.settings.secrets.admin_token not in "".join(feed.texts)
    assert "key-of-node-a" not in "".join(feed.texts)
