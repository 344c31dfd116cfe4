"""The queue in front of every server (SPEC §18), in process: a real gateway under the
autojump clock in front of fake llama.cpp servers with a fixed number of slots that, like
llama.cpp, keep a request beyond their slots waiting inside (tests/slotserver.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from protocol.config import default_config, validate_config
from protocol.errors import ConfigError
from tests.client import CHAT, Client, Reply, request
from tests.conftest import RunningGateway, StartGateway, admin_headers
from tests.slotserver import MODEL, SlotServer, body

QUEUE = "/api/v1/queue"


def scheduling(gw: RunningGateway, **changes: Any) -> None:
    settings = gw.gateway.settings
    cfg = settings.config
    settings.config = attrs.evolve(cfg, scheduling=attrs.evolve(cfg.scheduling, **changes))


def queue_timeout(gw: RunningGateway, seconds: float) -> None:
    settings = gw.gateway.settings
    cfg = settings.config
    request_timeouts = attrs.evolve(cfg.timeouts.request, queue=seconds)
    settings.config = attrs.evolve(cfg, timeouts=attrs.evolve(cfg.timeouts,
                                                              request=request_timeouts))


async def one_slot(nursery: trio.Nursery, start_gateway: StartGateway, short_tmp: Path,
                   total: int = 1, **options: Any) -> tuple[RunningGateway, SlotServer]:
    server = await SlotServer(short_tmp / "slots.sock", total).start(nursery)
    gw = await start_gateway([("llama", server.url)], **options)
    assert gw.gateway.backends.backends[0].slots is not None  # reported at the first check
    return gw, server


async def chat(gw: RunningGateway, label: str, seconds: float, *, path: str = CHAT,
               headers: list[tuple[str, str]] | None = None, **extra: Any) -> Reply:
    return await request(gw.unix, "POST", path, body(label, seconds, **extra), headers)


async def log(gw: RunningGateway) -> dict[str, dict[str, Any]]:
    """The request log by the label each request's answer carried (or its id)."""
    await trio.sleep(0.1)  # the hub's batch
    reply = await request(gw.unix, "GET", "/api/v1/requests", headers=admin_headers(gw))
    return {e["id"]: e for e in reply.json()["requests"]}


async def send_all(nursery: trio.Nursery, gw: RunningGateway, labels: list[str],
                   seconds: float, replies: dict[str, Reply], gap: float = 0.01,
                   **kw: Any) -> None:
    """Send one request per label, ``gap`` apart (so they arrive in this order)."""
    async def one(label: str) -> None:
        replies[label] = await chat(gw, label, seconds, **kw)

    for label in labels:
        nursery.start_soon(one, label)
        await trio.sleep(gap)


async def test_never_more_in_flight_than_slots_and_in_arrival_order(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    replies: dict[str, Reply] = {}
    labels = [f"r{i}" for i in range(6)]
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, labels, 5.0, replies)
        await trio.sleep(1)
        assert server.arrived == ["r0"]  # the rest wait in sluice, not in the server
        waiting = (await request(gw.unix, "GET", QUEUE, headers=admin_headers(gw))).json()
        [entry] = waiting["models"]
        assert entry["model"] == MODEL
        assert entry["inFlight"] == 1
        assert entry["slots"] == 1
        assert [w["priority"] for w in entry["waiting"]] == ["interactive"] * 5
    assert all(r.status == 200 for r in replies.values())
    assert server.arrived == labels
    assert server.most == 1
    queued = [int(replies[label].header("x-sluice-queue-ms") or -1) for label in labels]
    assert queued[0] == 0
    assert queued[1:] == sorted(queued[1:])
    assert queued[-1] >= 4 * 5000  # four answers of 5 s before it


async def test_first_byte_is_not_spent_in_the_queue(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    """A stream's first_byte (5 s here) starts when it is sent: a request that waited 20 s
    in sluice's queue is answered; with the queue off the server holds it and the gateway
    gives up after 5 s (the measured failure of issue 42)."""
    gw, _ = await one_slot(nursery, start_gateway, short_tmp, first_byte=5.0)
    for queue in (True, False):
        scheduling(gw, queue=queue)
        replies: dict[str, Reply] = {}
        async with trio.open_nursery() as inner:
            await send_all(inner, gw, [f"long-{queue}", f"next-{queue}"], 20.0, replies,
                           stream=True)
        assert replies[f"long-{queue}"].status == 200
        second = replies[f"next-{queue}"]
        if queue:
            assert second.status == 200, second.body
            assert int(second.header("x-sluice-queue-ms") or 0) >= 19_000
        else:
            assert second.status == 504
            assert second.json()["error"]["code"] == "upstream_timeout"
            assert second.header("x-sluice-queue-ms") is None
        await trio.sleep(30)  # the server is idle again
    entries = list((await log(gw)).values())
    queued = [e for e in entries if e["queueMs"]]
    assert len(queued) == 1
    assert queued[0]["queueMs"] >= 19_000
    assert queued[0]["priority"] == "interactive"


async def test_queue_timeout_is_504_and_nothing_is_sent(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    queue_timeout(gw, 30.0)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["busy"], 100.0, replies)
        started = trio.current_time()
        late = await chat(gw, "late", 1.0)
        waited = trio.current_time() - started
        anthropic = await request(gw.unix, "POST", "/v1/messages", body(
            "late-anthropic", 1.0, max_tokens=1) .replace(b'"user": "late-anthropic"',
                                                            b'"metadata": {}'))
    assert late.status == 504
    assert late.json()["error"]["code"] == "queue_timeout"
    assert 30 <= waited < 31
    assert int(late.header("x-sluice-queue-ms") or 0) >= 30_000
    assert anthropic.status == 504
    assert anthropic.json()["error"]["type"] == "overloaded_error"
    assert server.arrived == ["busy"]  # neither was ever sent
    entries = await log(gw)
    refused = [e for e in entries.values() if e["error"] == "queue_timeout"]
    assert len(refused) == 2
    assert {e["outcome"] for e in refused} == {"refused"}
    assert all(e["queueMs"] >= 30_000 for e in refused)


async def test_queue_full_is_429_with_retry_after(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    scheduling(gw, max_waiting=2)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["warm"], 4.0, replies)
        await trio.sleep(5)  # one answer of 4 s: a service time to estimate from
        await send_all(inner, gw, ["busy", "w1", "w2"], 4.0, replies)
        full = await chat(gw, "full", 1.0)
        anthropic = await request(gw.unix, "POST", "/v1/messages", body(
            "x", 1.0).replace(b'"user": "x"', b'"metadata": {}'))
    assert full.status == 429
    assert full.json()["error"]["code"] == "queue_full"
    retry = full.header("retry-after")
    assert retry is not None
    assert retry.isdigit()
    assert int(retry) >= 8  # two waiting, 4 s each, one slot
    assert anthropic.status == 429
    assert anthropic.json()["error"]["type"] == "overloaded_error"
    assert anthropic.header("retry-after") is not None
    assert "full" not in server.arrived
    assert all(replies[label].status == 200 for label in ("warm", "busy", "w1", "w2"))
    entries = await log(gw)
    [refused] = [e for e in entries.values() if e["error"] == "queue_full"
                 and e["path"] == CHAT]
    assert refused["outcome"] == "refused"
    assert refused["queueMs"] == 0


async def test_a_client_that_leaves_while_queued_is_never_sent(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["busy"], 10.0, replies)
        client = await Client.open(gw.unix)
        with trio.move_on_after(2):
            await client.request("POST", CHAT, body("gone", 1.0))
        await client.aclose()  # it leaves while it waits
        await trio.sleep(1)
        assert gw.gateway.ctx.scheduler.waiting() == {}
        await send_all(inner, gw, ["after"], 1.0, replies)
    assert server.arrived == ["busy", "after"]
    assert replies["after"].status == 200
    entries = await log(gw)
    assert sorted(e["outcome"] for e in entries.values() if e["path"] == CHAT) == \
        ["aborted", "success", "success"]


async def test_two_servers_of_one_model_both_used(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    a = await SlotServer(short_tmp / "a.sock", 1).start(nursery)
    b = await SlotServer(short_tmp / "b.sock", 1).start(nursery)
    gw = await start_gateway([("a", a.url), ("b", b.url)])
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, [f"r{i}" for i in range(6)], 3.0, replies)
    assert all(r.status == 200 for r in replies.values())
    assert a.most == 1
    assert b.most == 1
    assert len(a.arrived) + len(b.arrived) == 6
    assert a.arrived
    assert b.arrived


async def test_batch_waits_for_interactive_and_clients_take_turns(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    replies: dict[str, Reply] = {}
    batch = [("x-sluice-priority", "batch"), ("x-sluice-session", "job")]
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, [f"b{i}" for i in range(4)], 5.0, replies, headers=batch)
        await send_all(inner, gw, ["flex"], 5.0, replies, service_tier="flex",
                       headers=[("x-sluice-session", "other-job")])
        await send_all(inner, gw, ["ask"], 1.0, replies,
                       headers=[("x-sluice-session", "user")])
        await trio.sleep(1)
        await send_all(inner, gw, [f"s{i}" for i in range(3)], 1.0, replies,
                       headers=[("x-sluice-session", "agent")])
        await send_all(inner, gw, ["one"], 1.0, replies,
                       headers=[("x-sluice-session", "person")])
    # b0 had the slot; the interactive ones first, the agent's three and the person's one
    # taking turns; then the batch: the job and the other job taking turns.
    assert server.arrived == ["b0", "ask", "s0", "one", "s1", "s2", "b1", "flex", "b2", "b3"]
    entries = await log(gw)
    classes = {e["priority"] for e in entries.values() if e["path"] == CHAT}
    assert classes == {"interactive", "batch"}


async def test_promote_after_lifts_an_old_batch_request(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    scheduling(gw, promote_after=25.0)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["first", "old"], 20.0, replies,
                       headers=[("x-sluice-priority", "batch")])
        await trio.sleep(15)
        # "old" has waited 15 s: interactive requests go first until it has waited 25 s
        await send_all(inner, gw, ["i1", "i2"], 10.0, replies,
                       headers=[("x-sluice-session", "u")])
    assert server.arrived == ["first", "i1", "old", "i2"]


async def test_queue_off_sends_everything_at_once(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    scheduling(gw, queue=False)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["a", "b", "c"], 2.0, replies)
        await trio.sleep(1)
        assert server.in_flight == 3  # two of them wait inside the server
    assert server.most == 3
    assert all(r.header("x-sluice-queue-ms") is None for r in replies.values())


async def test_max_concurrent_when_the_server_reports_no_slots(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    server = await SlotServer(short_tmp / "s.sock", 4, report=False).start(nursery)
    gw = await start_gateway([("plain", server.url)])
    backend = gw.gateway.backends.backends[0]
    assert backend.slots is None
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:  # unknown slots: unlimited, no queue
        await send_all(inner, gw, ["a", "b", "c"], 2.0, replies)
    assert server.most == 3
    settings = gw.gateway.settings
    cfg = settings.config
    capped = attrs.evolve(cfg.backends[0], max_concurrent=2)
    settings.config = attrs.evolve(cfg, backends=(capped,))
    gw.gateway.backends.follow(settings.config.backends, settings.secrets.backend_keys)
    assert gw.gateway.backends.backends[0] is backend  # kept, with its new cap
    assert backend.max_concurrent == 2
    server.most = 0
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["d", "e", "f", "g"], 2.0, replies)
    assert server.most == 2
    assert all(r.status == 200 for r in replies.values())


@pytest.mark.parametrize(("change", "path"), [
    (lambda c: attrs.evolve(c, scheduling=attrs.evolve(c.scheduling, max_waiting=0)),
     "scheduling.max_waiting"),
    (lambda c: attrs.evolve(c, scheduling=attrs.evolve(c.scheduling, promote_after=0.0)),
     "scheduling.promote_after"),
    (lambda c: attrs.evolve(c, timeouts=attrs.evolve(c.timeouts, request=attrs.evolve(
        c.timeouts.request, queue=3601.0))), "timeouts.request.queue"),
])
def test_validation(change: Any, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(change(default_config()))
    assert caught.value.path == path


def test_max_concurrent_validation() -> None:
    from protocol.config import BackendConfig, ModelConfig

    cfg = default_config()
    bad = attrs.evolve(cfg, backends=(BackendConfig("b", "http://127.0.0.1:1",
                                                    max_concurrent=0),))
    with pytest.raises(ConfigError) as caught:
        validate_config(bad)
    assert caught.value.path == "backends[0].max_concurrent"
    bad = attrs.evolve(cfg, models=(ModelConfig("m", path="m.gguf", max_concurrent=0),))
    with pytest.raises(ConfigError) as caught:
        validate_config(bad)
    assert caught.value.path == "models[0].max_concurrent"


async def test_a_batch_key_and_headers_that_lower_but_never_raise(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One wall-clock minute for the whole test: the key's use is written (in a worker
    # thread) only at its first use in a minute, so the burst's order is not a thread's.
    monkeypatch.setattr("proxy.access.key_store.now_iso", lambda: "2026-12-06T06:00:00Z")
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    made = await request(gw.unix, "POST", "/api/v1/access-keys",
                         b'{"name": "job", "priority": "batch"}', admin_headers(gw))
    assert made.status == 201, made.body
    assert made.json()["priority"] == "batch"
    bad = await request(gw.unix, "POST", "/api/v1/access-keys", b'{"priority": "urgent"}',
                        admin_headers(gw))
    assert bad.status == 422
    assert bad.json()["error"]["param"] == "priority"
    key = [("authorization", f"Bearer {made.json()['key']}"),
           ("x-sluice-priority", "interactive")]  # a header never raises the key's class
    warm = await chat(gw, "warm", 0.1, headers=key)  # the key's first use writes the file
    assert warm.status == 200
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["k0", "k1", "k2"], 5.0, replies, headers=key)
        await send_all(inner, gw, ["mine"], 1.0, replies)
    assert server.arrived == ["warm", "k0", "mine", "k1", "k2"]
    entries = await log(gw)
    by_class = sorted((e["priority"], e["status"]) for e in entries.values()
                      if e["path"] == CHAT)
    assert by_class == [("batch", 200)] * 4 + [("interactive", 200)]


async def test_metrics_of_the_queue(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, _ = await one_slot(nursery, start_gateway, short_tmp)
    scheduling(gw, max_waiting=1)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["a", "b"], 5.0, replies)
        await send_all(inner, gw, ["c"], 5.0, replies, headers=[("x-sluice-priority", "batch")])
        scrape = (await request(gw.unix, "GET", "/metrics")).body.decode()
        assert 'sluice_queue_waiting{model="slot-model",priority="interactive"} 1' in scrape
        assert 'sluice_queue_waiting{model="slot-model",priority="batch"} 0' in scrape
    assert replies["c"].status == 429
    await trio.sleep(0.1)
    scrape = (await request(gw.unix, "GET", "/metrics")).body.decode()
    assert 'sluice_queue_rejected_total{model="slot-model",reason="queue_full"} 1' in scrape
    assert 'sluice_queue_wait_seconds_count{model="slot-model",priority="interactive"} 2' \
        in scrape
    assert 'sluice_queue_wait_seconds_count{model="slot-model",priority="batch"} 1' in scrape
    assert 'sluice_queue_wait_seconds_bucket{le="1.0",model="slot-model",' \
           'priority="interactive"} 1' in scrape  # a went at once, b waited 5 s


async def test_queue_events_carry_the_waiting_counts(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    gw, _ = await one_slot(nursery, start_gateway, short_tmp)
    seen: list[dict[str, Any]] = []
    gw.gateway.hub.subscribe(lambda kind, at, data: seen.append(data), ("queue",))
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["a", "b", "c"], 5.0, replies, gap=1.0)
    counts = [sum(m["waiting"]["interactive"] for m in e["models"]) for e in seen]
    assert max(counts) == 2  # b and c waited while a had the slot
    assert counts[-1] == 0
    assert max(e["longestMs"] for e in seen) >= 3000


async def test_a_node_with_one_slot_is_queued_for_too(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    """A node's reported slots are its capacity (SPEC §18): nothing beyond them is
    forwarded; when its answer ends (an attempt on a node), the next request goes."""
    from tests.fakenode import Hold
    from tests.test_cache_aware import PromptCache
    from tests.test_forwarding import MODEL as NODE_MODEL
    from tests.test_forwarding import pool

    hold = Hold(PromptCache("node-a"))
    gw, [node_a] = await pool(nursery, start_gateway, short_tmp, hold)
    node_a.slots[NODE_MODEL] = (0, 1)
    await trio.sleep(6)  # the next check reads the slots
    assert gw.gateway.nodes.endpoints[0].slots[NODE_MODEL].total == 1
    replies: list[Reply] = []

    async def one(n: int) -> None:
        replies.append(await request(gw.unix, "POST", CHAT, json_body(NODE_MODEL, n)))

    async with trio.open_nursery() as inner:
        for n in range(3):
            inner.start_soon(one, n)
            await trio.sleep(0.01)
        await hold.wait_arrived(1)
        await trio.sleep(1)
        assert hold.arrived == 1  # the other two wait in sluice
        assert gw.gateway.ctx.scheduler.waiting_for(NODE_MODEL) == 2
        hold.release()  # every parked and later request goes on at once
    assert [r.status for r in replies] == [200, 200, 200]
    assert hold.arrived == 3


def json_body(model: str, n: int) -> bytes:
    import json

    return json.dumps({"model": model, "messages": [{"role": "user", "content": f"q{n}"}]}
                      ).encode()


async def test_a_slot_a_report_saw_busy_with_ours_is_free_when_ours_ends(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        start_gateway: StartGateway, short_tmp: Path) -> None:
    """A health check that finds the one slot busy with our own request must not hold the
    next request until the check after: it goes as soon as ours ends."""
    gw, server = await one_slot(nursery, start_gateway, short_tmp)
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as inner:
        await send_all(inner, gw, ["first"], 7.0, replies)
        await trio.sleep(6)  # a check (every 5 s) saw the slot busy: with our request
        assert gw.gateway.backends.backends[0].slots.busy == 1  # type: ignore[union-attr]
        await trio.sleep(1.5)  # ours has ended; the next check is at about 10 s
        started = trio.current_time()
        second = await chat(gw, "second", 0.5)
        assert trio.current_time() - started < 1.0  # sent at once, not at the next check
    assert second.status == 200
    assert int(second.header("x-sluice-queue-ms") or -1) == 0
    assert server.arrived == ["first", "second"]
