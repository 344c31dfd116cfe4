"""The state owners' events on the hub (SPEC §9.3): ``node``, ``circuit``, ``settings``,
``notification``, ``model`` and ``stats``, each the body or entry of its GET endpoint,
published on a change only; and no secret in any of them.

A callback subscribed to the gateway's own hub records each event with the trio time it
came at (its payload through a JSON round trip: it must be JSON-ready). Node, circuit,
backend and stats events run under the autojump clock (every hop a Unix socket, nodes put
into the live config directly); settings writes go through the real admin API over a
gateway's socket in real time, with a node on 127.0.0.1 TCP; one test reads them as a
trio-websocket client of ``GET /api/v1/events`` over TCP and over the Unix socket.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import trio_websocket

from protocol.config import Config, ModelConfig, NodeConfig, default_config
from protocol.errors import SluiceError
from proxy.models.ondemand import OnDemand
from proxy.models.specs import prepare
from proxy.notifications import Notifications
from proxy.observe.hub import TYPES, Hub
from proxy.observe.state_events import LATENCY_STEP_MS, NodeFeed, latency_moved
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import ONLINE, NodeIndex
from proxy.upstream.pool import ConnectionPool
from tests.client import CHAT, chat_body, connect, request
from tests.conftest import RunningGateway, StartGateway, admin, configure, free_port, node
from tests.fakenode import FakeNode, start_node
from tests.fakeupstream import FakeUpstream, Handler, json_completion, status
from tests.waits import settled

POOL = "/api/v1/pool/distributed-status"
STATS = "/api/v1/pool/routing-stats"
INTERVAL = 5.0  # the default health-check interval


class Recorder:
    """Every event of ``types`` on ``hub``: (type, trio time, payload as JSON data)."""

    def __init__(self, hub: Hub, types: tuple[str, ...] = TYPES) -> None:
        self.events: list[tuple[str, float, Any]] = []
        self.stop = hub.subscribe(self._on, types)

    def _on(self, kind: str, at: float, data: Any) -> None:
        if hasattr(data, "to_json"):  # a request record
            data = data.to_json()
        try:
            now = trio.current_time()
        except RuntimeError:  # published outside trio (a plain test)
            now = 0.0
        self.events.append((kind, now, json.loads(json.dumps(data))))

    def of(self, kind: str) -> list[Any]:
        return [data for k, _, data in self.events if k == kind]

    def times(self, kind: str) -> list[float]:
        return [at for k, at, _ in self.events if k == kind]

    def assert_no(self, *secrets: str) -> None:
        text = json.dumps([data for _, _, data in self.events])
        for secret in secrets:
            assert secret
            assert secret not in text


def hub_of(gw: RunningGateway) -> Hub:
    return gw.gateway.ctx.hub


async def get_json(gw: RunningGateway, path: str) -> Any:
    reply = await request(gw.unix, "GET", path)
    assert reply.status == 200, reply.body
    return reply.json()


# ----------------------------------------------------------------------------- node


async def test_node_events_follow_its_status(autojump_clock: trio.testing.MockClock,
                                             nursery: trio.Nursery, short_tmp: Path,
                                             start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    seen = Recorder(hub_of(gw), ("node",))
    path = str(short_tmp / "node-a.sock")
    up = await start_node(nursery, path, ["m"])
    configure(gw, (node("node-a", up.url, 1),), enabled=True)
    await trio.sleep(0.1)
    # Seen by the poll (not checked yet), then checked: each the distributed-status entry.
    assert [e["status"] for e in seen.of("node")] == ["unknown", "online"]
    online = seen.of("node")[-1]
    assert online == (await get_json(gw, POOL))["endpoints"][0]
    assert (online["fingerprint"], online["loadedModelCount"], online["lastError"]) == (
        "node-a", 1, None)

    await trio.sleep(INTERVAL * 3)
    assert len(seen.of("node")) == 2  # checked three more times, nothing changed

    up.status = 503  # loading a model
    await trio.sleep(INTERVAL)
    warming = seen.of("node")[-1]
    assert (warming["status"], warming["latencyMs"], warming["loadedModelCount"]) == (
        "warming", None, 0)
    assert "503" in warming["lastError"]
    assert warming == (await get_json(gw, POOL))["endpoints"][0]
    await trio.sleep(3)  # probed every second while warming: no new event
    assert len(seen.of("node")) == 3
    up.status = 200
    await trio.sleep(1.1)
    assert seen.of("node")[-1] == online

    await up.stop()
    await trio.sleep(INTERVAL)
    offline = seen.of("node")[-1]
    assert (offline["status"], offline["latencyMs"]) == ("offline", None)
    assert offline["lastError"]
    assert offline == (await get_json(gw, POOL))["endpoints"][0]

    # Back, with one more model. (Binding the socket may let the autojump clock run to the
    # next round first, which then finds the file but no listener yet: offline again, with
    # that error.)
    await start_node(nursery, path, ["m", "n"])
    with trio.fail_after(INTERVAL * 3):
        while seen.of("node")[-1]["status"] != "online":
            await trio.sleep(1)
    assert seen.of("node")[-1] == {**online, "loadedModelCount": 2}
    statuses = [e["status"] for e in seen.of("node")]
    assert [st for i, st in enumerate(statuses) if i == 0 or statuses[i - 1] != st] == [
        "unknown", "online", "warming", "online", "offline", "online"]

    configure(gw, enabled=False)  # every node paused, as distributed-status shows it
    await trio.sleep(0.1)
    assert seen.of("node")[-1] == (await get_json(gw, POOL))["endpoints"][0]
    assert seen.of("node")[-1]["status"] == "paused"


class _LbSettings:
    config = attrs.evolve(Config(), load_balancing=attrs.evolve(Config().load_balancing,
                                                               enabled=True))


def test_latency_jitter_is_no_event_storm_but_a_model_swap_is_an_event() -> None:
    hub = Hub()
    seen = Recorder(hub, ("node",))
    index = NodeIndex()
    NodeFeed(hub, index, _LbSettings())  # type: ignore[arg-type]
    index.sync([NodeConfig("node-a", "a", "http://127.0.0.2:9", 1)])
    endpoint = index.endpoints[0]
    for latency in (10.0, 10.01, 10.4, 11.2, 12.3, 100.0, 104.9, 109.0, 111.0, 111.2):
        index.checked(endpoint, ONLINE, [{"id": "m"}], None, latency)
    # Rounded to whole ms as distributed-status shows it, then a dead band of max(2 ms, 10 %)
    # from the value last published.
    assert [e["latencyMs"] for e in seen.of("node")] == [None, 10, 12, 100, 111]
    index.checked(endpoint, ONLINE, [{"id": "other"}], None, 111.0)  # another model, as many
    assert len(seen.of("node")) == 6
    assert seen.of("node")[-1] == seen.of("node")[-2]
    # A sluice node's model loaded or unloaded (SPEC §11): an event, and the count is of
    # the loaded ones (it lists its unloaded managed models too).
    cold = [{"id": "m", "sluice": {"state": "unloaded"}}, {"id": "n"}]
    index.checked(endpoint, ONLINE, cold, None, 111.0)
    assert seen.of("node")[-1]["loadedModelCount"] == 1
    warm = [{"id": "m", "sluice": {"state": "loaded"}}, {"id": "n"}]
    index.checked(endpoint, ONLINE, warm, None, 111.0)
    assert seen.of("node")[-1]["loadedModelCount"] == 2
    count = len(seen.of("node"))
    index.checked(endpoint, ONLINE, warm, None, 111.0)
    assert len(seen.of("node")) == count
    assert latency_moved(None, 3)
    assert latency_moved(3, None)
    assert not latency_moved(None, None)
    assert not latency_moved(0, LATENCY_STEP_MS - 1)
    assert latency_moved(0, LATENCY_STEP_MS)


# -------------------------------------------------------------------------- circuit


async def node_pool(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Path,
                    handler: Handler, **breaker: Any) -> tuple[RunningGateway, FakeNode]:
    """A gateway without local backends, forwarding to node-a (key ``key-of-node-a``)."""
    gw = await start_gateway([])
    up = await start_node(nursery, str(short_tmp / "node-a.sock"), ["remote-m"],
                          answer=handler)
    gw.gateway.settings.secrets.node_keys["node-a"] = "key-of-node-a"
    settings = gw.gateway.settings
    cfg = settings.config
    settings.config = attrs.evolve(cfg, circuit_breaker=attrs.evolve(cfg.circuit_breaker,
                                                                    **breaker))
    configure(gw, (node("node-a", up.url, 1),), enabled=True)
    await trio.sleep(0.1)
    assert [e.status for e in gw.gateway.ctx.nodes.endpoints] == ["online"]
    return gw, up


async def chat(gw: RunningGateway, model: str = "remote-m") -> int:
    return (await request(gw.unix, "POST", CHAT, chat_body(model))).status


@pytest.mark.parametrize("probe", ["succeeds", "fails"])
async def test_circuit_events_in_order(autojump_clock: trio.testing.MockClock,
                                       nursery: trio.Nursery, short_tmp: Path,
                                       start_gateway: StartGateway, probe: str) -> None:
    gw, up = await node_pool(nursery, start_gateway, short_tmp, status(500),
                             failure_threshold=2, reset_timeout=30.0)
    seen = Recorder(hub_of(gw), ("circuit",))
    assert await chat(gw) == 500
    assert seen.of("circuit") == []  # one failure: still closed, no transition
    assert await chat(gw) == 500
    opened = trio.current_time()
    assert seen.of("circuit") == [{"fingerprint": "node-a", "state": "open",
                                   "consecutiveFailures": 2}]
    assert await chat(gw) == 503  # skipped while open: no event
    assert len(seen.of("circuit")) == 1

    await trio.sleep(35)  # nobody asks the breaker: the once-a-second look sees half_open
    assert seen.of("circuit")[1] == {"fingerprint": "node-a", "state": "half_open",
                                     "consecutiveFailures": 2}
    assert opened + 30 <= seen.times("circuit")[1] <= opened + 31
    node_entry = (await get_json(gw, STATS))["nodes"][0]
    assert node_entry["circuitState"] == "half_open"

    if probe == "succeeds":
        up.answer(json_completion("probe"))
        assert await chat(gw) == 200
        last = {"fingerprint": "node-a", "state": "closed", "consecutiveFailures": 0}
    else:
        assert await chat(gw) == 500
        last = {"fingerprint": "node-a", "state": "open", "consecutiveFailures": 3}
    assert seen.of("circuit")[2:] == [last]
    assert [e["state"] for e in seen.of("circuit")] == ["open", "half_open", last["state"]]
    node_entry = (await get_json(gw, STATS))["nodes"][0]
    assert (node_entry["circuitState"], node_entry["consecutiveFailures"]) == (
        last["state"], last["consecutiveFailures"])
    await trio.sleep(10)
    assert len(seen.of("circuit")) == 3
    seen.assert_no("key-of-node-a", gw.gateway.settings.secrets.admin_token)


# ------------------------------------------------------------------------- settings


async def test_settings_writes_publish_the_changed_sections(
        nursery: trio.Nursery, start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    seen = Recorder(hub_of(gw))  # every type: nothing but what is asserted comes

    def settings_events() -> list[tuple[str, Any]]:
        return [(e["section"], e["value"]) for e in seen.of("settings")]

    reply = await admin(gw, "PUT", "/api/v1/settings/load-balancing",
                        {"strategy": "round-robin"})
    assert reply.status == 200
    assert settings_events() == [("loadBalancing", reply.json())]
    assert reply.json() == await get_json(gw, "/api/v1/settings/load-balancing")
    assert reply.json()["strategy"] == "round-robin"

    reply = await admin(gw, "PUT", "/api/v1/settings/load-balancing",
                        {"strategy": "round-robin"})
    assert reply.status == 200
    assert len(seen.of("settings")) == 1  # a write that changes nothing: no event

    reply = await admin(gw, "PUT", "/api/v1/settings/timeouts", {"connection": 7})
    assert reply.status == 200, reply.body
    assert settings_events()[1:] == [("timeouts", await get_json(gw, "/api/v1/settings/timeouts"))]

    reply = await admin(gw, "PUT", "/api/v1/settings/api", {"port": free_port()})
    assert reply.status == 200
    assert reply.json()["restartRequired"] is True
    assert settings_events()[2:] == [("api", reply.json())]
    assert reply.json() == await get_json(gw, "/api/v1/settings/api")
    (note,) = seen.of("notification")
    assert note["code"] == "restart_required"
    assert note == (await get_json(gw, "/api/v1/notifications"))["notifications"][0]

    # The node registry: added with a key, then its key removed (hasApiKey only, never it).
    up = await FakeNode("node-t", ["m"]).start(nursery)
    key = "canary-node-key-0123456789abcdef"
    reply = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": up.url, "apiKey": key})
    assert reply.status == 201, reply.body
    registry = await get_json(gw, "/api/v1/nodes")
    assert settings_events()[3:] == [("nodes", registry)]
    assert registry[0]["hasApiKey"] is True
    reply = await admin(gw, "PATCH", "/api/v1/nodes/node-t", {"apiKey": None})
    assert reply.status == 200
    assert settings_events()[4:] == [("nodes", await get_json(gw, "/api/v1/nodes"))]
    assert settings_events()[4][1][0]["hasApiKey"] is False

    assert {kind for kind, _, _ in seen.events} <= {"settings", "notification", "request"}
    seen.assert_no(key, gw.gateway.settings.secrets.admin_token)


async def test_settings_and_node_events_carry_no_secret(
        nursery: trio.Nursery, start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    seen = Recorder(hub_of(gw))
    up = await FakeNode("node-k", ["m"]).start(nursery)
    key = "canary-node-key-fedcba9876543210"
    assert (await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": up.url, "apiKey": key})
            ).status == 201
    assert (await admin(gw, "PUT", "/api/v1/settings/load-balancing", {"enabled": True})
            ).status == 200
    await settled(lambda: any(e["status"] == "online" for e in seen.of("node")),
                  "node-k online", 10)
    assert up.requests_to("/v1/models")[-1].header("authorization") == f"Bearer {key}"
    reply = await request(gw.unix, "POST", CHAT, chat_body("m"))
    assert reply.status == 200
    assert seen.of("settings")
    assert seen.of("node")
    seen.assert_no(key, gw.gateway.settings.secrets.admin_token)


# --------------------------------------------------------------------- notification


def test_notifications_raised_replaced_and_cleared() -> None:
    hub = Hub()
    seen = Recorder(hub, ("notification",))
    notes = Notifications(hub)
    notes.raise_("disk", "the disk is full")
    notes.raise_("disk", "the disk is nearly full", level="info")  # replaced
    notes.clear("disk")
    notes.clear("disk")  # nothing to clear: no event
    notes.clear("never-raised")
    first, second, cleared = seen.of("notification")
    assert (first["code"], first["level"], first["message"]) == (
        "disk", "warning", "the disk is full")
    assert set(first) == {"code", "level", "message", "createdAt"}
    assert (second["level"], second["message"]) == ("info", "the disk is nearly full")
    assert cleared == {"code": "disk", "cleared": True}
    assert notes.all() == []
    Notifications().raise_("quiet", "no hub: nobody told")  # a notifications without a hub


# ---------------------------------------------------------------------------- model


async def test_backend_down_and_up(autojump_clock: trio.testing.MockClock,
                                   nursery: trio.Nursery, short_tmp: Path,
                                   start_gateway: StartGateway) -> None:
    up = FakeNode("local", ["m"], unix_path=str(short_tmp / "local.sock"))
    await up.start(nursery)
    gw = await start_gateway([("local", up.url)])
    seen = Recorder(hub_of(gw), ("model",))
    await trio.sleep(INTERVAL * 2)
    assert seen.of("model") == []  # checked twice, nothing changed
    up.status = 500
    await trio.sleep(INTERVAL)
    (down,) = seen.of("model")
    backends = (await get_json(gw, "/api/v1/inference/status"))["backends"]
    assert down == {"source": "backend", **backends[0]}
    assert (down["name"], down["kind"], down["online"], down["models"]) == (
        "local", "llm", False, [])
    assert "500" in down["lastError"]
    up.status = 200
    await trio.sleep(INTERVAL * 3)
    assert seen.of("model")[1:] == [{"source": "backend", "name": "local", "kind": "llm",
                                     "online": True, "models": ["m"], "lastError": None,
                                     # the fake node has no /v1/messages (SPEC §17.1)
                                     "apis": {"messages": "translate",
                                              "responses": "translate"},
                                     "address": f"unix:{short_tmp / 'local.sock'}"}]


async def test_managed_model_states(short_tmp: Path) -> None:
    """Each state change of a model on demand is a model event with its entry."""
    hub = Hub()
    seen = Recorder(hub, ("model",))
    registry = BackendRegistry([], {})
    cfg = default_config()
    prepared = prepare([ModelConfig(name="ghost", path="none.gguf")], cfg, short_tmp)
    ondemand = OnDemand(prepared, cfg, short_tmp, None, registry, ConnectionPool(), hub)
    async with trio.open_nursery() as nursery:
        await nursery.start(ondemand.run)
        with pytest.raises(SluiceError):
            await ondemand.acquire("ghost")
        nursery.cancel_scope.cancel()
    events = seen.of("model")
    assert [(e["source"], e["name"], e["state"]) for e in events] == [
        ("managed", "ghost", "loading"), ("managed", "ghost", "failed")]
    assert "cannot read" in events[-1]["lastError"]
    # The failed event came while the request was still waiting for the load.
    now = {**ondemand.status()[0], "source": "managed", "origin": "config", "activeRequests": 1}
    assert {k: v for k, v in events[-1].items() if not k.endswith("At")} == {
        k: v for k, v in now.items() if not k.endswith("At")}


# ---------------------------------------------------------------------------- stats


async def test_stats_at_most_once_a_second_and_only_on_change(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    up = FakeUpstream(models=["m"], unix_path=str(short_tmp / "local.sock"))
    up.on("POST", CHAT, json_completion())
    await nursery.start(up.serve)
    gw = await start_gateway([("local", up.url)])
    seen = Recorder(hub_of(gw), ("stats",))
    await trio.sleep(5)
    assert seen.of("stats") == []  # nothing changed

    began = trio.current_time()
    for _ in range(20):  # a request every 0.25 s for 5 s
        assert await chat(gw, "m") == 200
        await trio.sleep(0.25)
    await trio.sleep(1.5)
    times = seen.times("stats")
    assert 4 <= len(times) <= 6
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))
    assert times[0] - began <= 1.0
    last = seen.of("stats")[-1]
    assert last == await get_json(gw, STATS)
    assert (last["local"]["totalRequests"], last["local"]["successCount"]) == (20, 20)
    await trio.sleep(10)
    assert len(seen.times("stats")) == len(times)  # idle again: no event


# ------------------------------------------------------------------- over the WebSocket


async def test_owner_events_reach_a_websocket_subscriber(
        nursery: trio.Nursery, start_gateway: StartGateway, transport: str) -> None:
    gw = await start_gateway([])
    up = await FakeNode("node-w", ["m"]).start(nursery)
    key = "canary-node-key-5a5a5a5a5a5a5a5a"
    texts: list[str] = []

    async def next_of(ws: trio_websocket.WebSocketConnection, kind: str) -> Any:
        with trio.fail_after(10):
            while True:
                texts.append(str(await ws.get_message()))
                doc = json.loads(texts[-1])
                if doc["type"] == kind:
                    return doc["data"]

    stream = await connect(gw.address(transport))
    try:
        async with trio.open_nursery() as client:
            ws = await trio_websocket.wrap_client_stream(client, stream, "localhost",
                                                         "/api/v1/events")
            await next_of(ws, "hello")
            assert (await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": up.url, "apiKey": key})
                    ).status == 201
            assert await next_of(ws, "settings") == {
                "section": "nodes", "value": await get_json(gw, "/api/v1/nodes")}
            assert (await admin(gw, "PUT", "/api/v1/settings/load-balancing",
                                {"enabled": True})).status == 200
            assert await next_of(ws, "settings") == {
                "section": "loadBalancing",
                "value": await get_json(gw, "/api/v1/settings/load-balancing")}
            while (entry := await next_of(ws, "node"))["status"] != "online":
                pass
            assert entry == (await get_json(gw, POOL))["endpoints"][0]
            gw.gateway.ctx.notifications.raise_("test_note", "something to know about")
            assert (await next_of(ws, "notification"))["code"] == "test_note"
            await ws.aclose()
    finally:
        await stream.aclose()
    joined = "\n".join(texts)
    assert key not in joined
    assert gw.gateway.settings.secrets.admin_token not in joined
