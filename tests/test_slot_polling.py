"""The slots the servers report (SPEC §15 "Load"), polled with the health checks: local
backends' llama.cpp ``/slots`` and ``/props`` (and servers without them, which stay online
with their models), the back-off after a refusal, a node's ``sluice.slots``, and what this
gateway's ``/v1/models`` tells its peers. Under the autojump clock, every hop a Unix socket.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from protocol.config import BackendConfig, default_config
from protocol.slots import Slots
from proxy.api.model_list import with_slots
from proxy.registry.backends import (
    SLOTS_RETRY_CHECKS,
    BackendRegistry,
    LocalBackend,
    check_backend,
    run_health_checks,
)
from proxy.registry.nodes import ONLINE
from proxy.routing.attempts import Counters
from proxy.upstream.pool import ConnectionPool
from tests.client import request
from tests.conftest import StartGateway, configure, node
from tests.fakenode import start_node
from tests.fakeupstream import LLAMA_JSON_HEADERS, FakeUpstream, ReceivedRequest, ResponseWriter

HC = default_config().timeouts.health_check
INTERVAL, TIMEOUT = HC.interval, HC.timeout


class Llama:
    """What a llama.cpp server answers on /slots and /props (``None``: 404 there)."""

    def __init__(self, up: FakeUpstream, *, total: int | None = 2, props: int | None = None,
                 slots_delay: float = 0.0) -> None:
        self.up = up
        self.total = total  # slots listed by /slots; None: /slots is not served
        self.props = props  # /props' total_slots; None: /props is not served
        self.busy = 0
        self.slots_delay = slots_delay
        if total is not None:
            up.on("GET", "/slots", self._slots)
        if props is not None:
            up.on("GET", "/props", self._props)

    async def _slots(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        if self.slots_delay:
            await trio.sleep(self.slots_delay)
        assert self.total is not None
        doc = [{"id": i, "n_ctx": 1024, "speculative": False, "is_processing": i < self.busy}
               for i in range(self.total)]
        await w.json(200, doc, LLAMA_JSON_HEADERS)

    async def _props(self, req: ReceivedRequest, w: ResponseWriter) -> None:
        doc = {"default_generation_settings": {"n_ctx": 1024}, "total_slots": self.props,
               "model_path": "/m.gguf", "chat_template": "{{ messages }}" * 500}
        await w.json(200, doc, LLAMA_JSON_HEADERS)


def answer(status: int, body: bytes) -> Any:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(status, [("Content-Type", "application/json")], content_length=len(body))
        await w.send_raw(body)

    return handler


async def serve(nursery: trio.Nursery, path: Path, models: list[str]) -> FakeUpstream:
    up = FakeUpstream(models=models, unix_path=str(path))
    await nursery.start(up.serve)
    return up


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    """A pool whose idle connections are closed at the test's end (inside trio)."""
    connections = ConnectionPool()
    try:
        yield connections
    finally:
        connections.close()


def one_backend(url: str, kind: str = "llm") -> tuple[BackendRegistry, LocalBackend]:
    registry = BackendRegistry([BackendConfig(name="b", url=url, kind=kind)], {})
    return registry, registry.backends[0]


def asked(up: FakeUpstream) -> tuple[int, int]:
    return len(up.requests_to("/slots")), len(up.requests_to("/props"))


async def check(registry: BackendRegistry, backend: LocalBackend, pool: ConnectionPool) -> None:
    await check_backend(registry, backend, pool, TIMEOUT)


async def test_slots_of_a_llama_server(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    llama = Llama(up, total=3)
    registry, backend = one_backend(up.url)
    await check(registry, backend, pool)
    assert backend.online
    assert [m["id"] for m in backend.models] == ["m"]
    assert backend.slots == Slots(total=3, busy=0)
    llama.busy = 2
    await check(registry, backend, pool)
    assert backend.slots == Slots(total=3, busy=2)  # as reported: routing adds its own count
    llama.busy = 3
    await check(registry, backend, pool)
    assert backend.slots == Slots(total=3, busy=3)
    assert asked(up) == (3, 1)  # /props once, for the served context (SPEC §17.2)
    assert up.connections_opened == 1  # the same pooled connection as /v1/models


async def test_props_when_slots_is_refused(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    Llama(up, total=None, props=4)  # an older llama.cpp (or --no-slots): /slots is 404
    registry, backend = one_backend(up.url)
    await check(registry, backend, pool)
    assert backend.online
    assert backend.last_error is None
    assert backend.slots == Slots(total=4, busy=0)  # busy unknown
    assert asked(up) == (1, 1)
    for _ in range(SLOTS_RETRY_CHECKS):  # not asked again for a while; the count stays
        await check(registry, backend, pool)
        assert backend.slots == Slots(total=4, busy=0)
    assert asked(up) == (1, 1)
    await check(registry, backend, pool)
    assert asked(up) == (2, 2)  # asked again
    assert len(up.requests_to("/v1/models")) == SLOTS_RETRY_CHECKS + 2


async def test_neither_slots_nor_props(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    """vLLM, Ollama, LM Studio...: slots unknown, the backend as online as before."""
    up = await serve(nursery, short_tmp / "a.sock", ["m", "n"])
    registry, backend = one_backend(up.url)
    await check(registry, backend, pool)
    assert backend.online
    assert backend.last_error is None
    assert registry.holder_of("n") is backend
    assert backend.slots is None
    assert asked(up) == (1, 1)
    for _ in range(SLOTS_RETRY_CHECKS):
        await check(registry, backend, pool)
    assert asked(up) == (1, 1)
    Llama(up, total=2)  # it learnt /slots (a newer server at the same address)
    await check(registry, backend, pool)
    assert backend.slots == Slots(total=2, busy=0)
    assert asked(up) == (2, 1)


async def test_garbage_is_unknown(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    registry, backend = one_backend(up.url)
    for slots_body, props_body in [(b"not json", b"{"), (b'{"slots": 2}', b'{"total_slots": 0}'),
                                   (b"[1, 2]", b'{"total_slots": "2"}'), (b"[]", b"[]"),
                                   (b"null", b"null")]:
        up.on("GET", "/slots", answer(200, slots_body))
        up.on("GET", "/props", answer(200, props_body))
        backend.slots_skip = 0  # ask each time
        await check(registry, backend, pool)
        assert (backend.online, backend.last_error) == (True, None), slots_body
        assert [m["id"] for m in backend.models] == ["m"]
        assert backend.slots is None, slots_body
    up.on("GET", "/slots", answer(501, b'{"error": "This server does not support slots"}'))
    up.on("GET", "/props", answer(500, b"oops"))
    backend.slots_skip = 0
    await check(registry, backend, pool)
    assert backend.online
    assert backend.slots is None
    assert backend.slots_skip == SLOTS_RETRY_CHECKS


async def test_a_slow_slots_answer_is_unknown_without_back_off(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    llama = Llama(up, total=2, slots_delay=TIMEOUT * 2)
    registry, backend = one_backend(up.url)
    started = trio.current_time()
    await check(registry, backend, pool)
    assert trio.current_time() - started <= TIMEOUT + 0.01  # within the check's own budget
    assert backend.online
    assert backend.last_error is None
    assert backend.slots is None
    assert backend.slots_skip == 0
    llama.slots_delay = 0
    await check(registry, backend, pool)
    assert backend.slots == Slots(total=2, busy=0)


async def test_other_kinds_are_not_asked(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["e"])
    Llama(up, total=2)
    registry, backend = one_backend(up.url, kind="embedding")
    await check(registry, backend, pool)
    assert backend.online
    assert backend.slots is None
    assert asked(up) == (0, 0)


async def test_offline_forgets_the_slots(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    Llama(up, total=2)
    registry, backend = one_backend(up.url)
    await check(registry, backend, pool)
    assert backend.slots == Slots(2, 0)
    up.on("GET", "/v1/models", answer(500, b"{}"))
    await check(registry, backend, pool)
    assert not backend.online
    assert backend.slots is None
    assert asked(up) == (1, 1)  # an offline backend is not asked for slots (nor context)


async def test_slots_refresh_with_each_health_check(autojump_clock: trio.testing.MockClock,
                                                    nursery: trio.Nursery,
                                                    short_tmp: Path,
                                                    pool: ConnectionPool) -> None:
    """The poll (run_health_checks) asks every interval, managed servers included; a
    managed server's slots are unknown from server_up until its next check, and forgotten
    at server_down."""
    up = await serve(nursery, short_tmp / "a.sock", ["m"])
    llama = Llama(up, total=2)
    managed_up = await serve(nursery, short_tmp / "b.sock", ["whatever.gguf"])
    Llama(managed_up, total=4)
    registry, backend = one_backend(up.url)
    managed = LocalBackend(BackendConfig(name="pinned", url="", kind="llm"), None,
                           pinned_model="pinned")
    registry.add(managed)
    config = default_config()
    await nursery.start(run_health_checks, registry, pool, lambda: config)
    await registry.ready.wait()
    assert backend.slots == Slots(2, 0)
    await trio.sleep(0.1)  # between rounds
    for busy in (1, 2, 0):
        llama.busy = busy
        await trio.sleep(INTERVAL)
        assert backend.slots == Slots(2, busy)
    assert len(up.requests_to("/slots")) == 4  # once per round

    registry.server_up(managed, managed_up.url, [{"id": "pinned", "object": "model"}])
    assert managed.live
    assert managed.slots is None
    assert [b.name for b in registry.holders_of("pinned")] == ["pinned"]
    await trio.sleep(INTERVAL)
    assert managed.slots == Slots(4, 0)
    assert [m["id"] for m in managed.models] == ["pinned"]
    registry.server_down(managed, None)
    assert managed.slots is None
    assert registry.holders_of("pinned") == []


async def test_holders_of_lists_every_live_holder_in_config_order(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        pool: ConnectionPool) -> None:
    a = await serve(nursery, short_tmp / "a.sock", ["shared", "only-a"])
    b = await serve(nursery, short_tmp / "b.sock", ["shared"])
    registry = BackendRegistry([BackendConfig(name="a", url=a.url),
                                BackendConfig(name="b", url=b.url)], {})
    for backend in registry.backends:
        await check(registry, backend, pool)
    assert [x.name for x in registry.holders_of("shared")] == ["a", "b"]
    assert [x.name for x in registry.holders_of("only-a")] == ["a"]
    assert registry.holders_of("nobody") == []
    assert registry.holder_of("shared") is registry.backends[0]
    b.on("GET", "/v1/models", answer(500, b"{}"))
    await check(registry, registry.backends[1], pool)
    assert [x.name for x in registry.holders_of("shared")] == ["a"]


# ----------------------------------------------------------------- what a node reports


async def test_model_list_reports_slots_summed_over_holders(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    a = await serve(nursery, short_tmp / "a.sock", ["shared", "only-a"])
    b = await serve(nursery, short_tmp / "b.sock", ["shared"])
    c = await serve(nursery, short_tmp / "c.sock", ["plain"])  # no slots at all
    llama_a, llama_b = Llama(a, total=2), Llama(b, total=4)
    llama_a.busy, llama_b.busy = 1, 3
    gw = await start_gateway([("a", a.url), ("b", b.url), ("c", c.url)])
    registry = gw.gateway.backends
    ours = Counters()
    ours.active = 1  # one of a's busy slots is our request
    gw.gateway.ctx.router.backend_counters["a"] = ours
    await trio.sleep(INTERVAL + 0.1)
    assert registry.backends[0].slots == Slots(2, 1)  # as reported
    assert registry.backends[1].slots == Slots(4, 3)

    reply = await request(gw.unix, "GET", "/v1/models")
    entries = {e["id"]: e for e in reply.json()["data"]}
    # the fakes answer 404 to POST /v1/messages and /v1/responses: translated (SPEC §17.1)
    apis = {"messages": "translate", "responses": "translate"}
    assert entries["shared"]["sluice"] == {"slots": {"busy": 1 + 3, "total": 6}, "apis": apis}
    assert entries["only-a"]["sluice"] == {"slots": {"busy": 1, "total": 2}, "apis": apis}
    assert entries["plain"] == {"id": "plain", "object": "model", "created": 1_700_000_000,
                                "owned_by": "llamacpp", "sluice": {"apis": apis}}  # no slots
    ours.active = 2  # the count now, not the one at the check
    reply = await request(gw.unix, "GET", "/v1/models")
    entries = {e["id"]: e for e in reply.json()["data"]}
    assert entries["shared"]["sluice"]["slots"] == {"busy": 2 + 3, "total": 6}


def test_with_slots_keeps_the_state_and_copies() -> None:
    registry = BackendRegistry([BackendConfig(name="x", url="http://127.0.0.1:9")], {})
    backend = registry.backends[0]
    registry.checked(backend, [{"id": "m"}, {"id": "n"}], None, None)
    backend.slots = Slots(total=2, busy=1)
    managed = {"id": "m", "object": "model", "sluice": {"state": "loaded"}}
    plain = {"id": "n", "object": "model"}
    unknown = {"id": "u", "object": "model", "sluice": {"state": "unloaded"}}
    entries = [managed, plain, unknown]
    out = with_slots(registry, entries, lambda name: 0)
    assert out[0] == {"id": "m", "object": "model",
                      "sluice": {"state": "loaded", "slots": {"busy": 1, "total": 2}}}
    assert out[1]["sluice"] == {"slots": {"busy": 1, "total": 2}}
    assert out[2] is unknown  # not held by a live backend: left as it is
    assert managed == {"id": "m", "object": "model", "sluice": {"state": "loaded"}}
    assert entries == [managed, plain, unknown]
    backend.slots = None
    assert with_slots(registry, entries, lambda name: 0) is entries  # nothing to add: the same list


async def test_node_slots_from_its_model_list(autojump_clock: trio.testing.MockClock,
                                              nursery: trio.Nursery, short_tmp: Path,
                                              start_gateway: StartGateway) -> None:
    extra = [
        {"id": "busy", "object": "model", "sluice": {"state": "loaded",
                                                     "slots": {"busy": 2, "total": 4}}},
        {"id": "idle", "object": "model", "sluice": {"slots": {"busy": 0, "total": 1}}},
        {"id": "bad", "object": "model", "sluice": {"slots": {"busy": "x", "total": 2}}},
        {"id": "zero", "object": "model", "sluice": {"slots": {"busy": 0, "total": 0}}},
        {"id": "odd", "object": "model", "sluice": ["slots"]},
        {"id": "hop", "object": "model", "owned_by": "remote",
         "sluice": {"slots": {"busy": 0, "total": 8}}},
    ]
    up = await start_node(nursery, str(short_tmp / "n.sock"), ["plain"], extra)
    gw = await start_gateway([])
    nodes = gw.gateway.ctx.nodes
    configure(gw, (node("n", up.url, 1),), enabled=True)
    await trio.sleep(0.1)
    endpoint = nodes.endpoint("n")
    assert endpoint is not None
    assert endpoint.status == ONLINE
    assert endpoint.model_ids == {"plain", "busy", "idle", "bad", "zero", "odd"}
    assert endpoint.slots == {"busy": Slots(total=4, busy=2), "idle": Slots(total=1, busy=0)}

    # our own remote entries never carry the node's slots
    reply = await request(gw.unix, "GET", "/v1/models")
    remote = {e["id"]: e for e in reply.json()["data"]}
    assert remote["busy"] == {"id": "busy", "object": "model", "created": 0,
                              "owned_by": "remote"}

    up.extra = [{"id": "busy", "object": "model",
                 "sluice": {"slots": {"busy": 4, "total": 4}}}]
    await trio.sleep(INTERVAL)
    assert endpoint.slots == {"busy": Slots(total=4, busy=4)}

    up.status = 500  # offline: forgotten
    await trio.sleep(INTERVAL)
    assert endpoint.status != ONLINE
    assert endpoint.slots == {}
    up.status = 200
    await trio.sleep(INTERVAL)
    assert endpoint.slots == {"busy": Slots(total=4, busy=4)}
    configure(gw, enabled=False)  # paused: forgotten
    await trio.sleep(0.1)
    assert endpoint.slots == {}


def test_slots_defaults() -> None:
    _, backend = one_backend("http://127.0.0.1:9")
    assert backend.slots is None
    assert backend.slots_skip == 0
