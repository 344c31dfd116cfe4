"""The models-on-demand lifecycle (proxy/models/lifecycle.py) on trio's MockClock, with fake
model servers that take a set time to load: every state move, shared loads, pinning, LRU
room, the budget and max_loaded, failure back-off, keep_alive, preload, a crash."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

import pytest
import trio
import trio.testing

from protocol.errors import SluiceError
from protocol.model_state import RETRY_AFTER_FAILURE, ModelState
from proxy.models.lifecycle import Lifecycle, LoadFailed, Managed, ModelSpec

GIB = 1 << 30
LOAD_TIME = 2.0


class FakeServer:
    def __init__(self, spec: ModelSpec, pid: int) -> None:
        self.url = f"unix:/fake/{spec.name}.sock"
        self.pid = pid
        self.rss = spec.estimate // 2  # measured: less than estimated
        self.exited = trio.Event()
        self.stopped = False

    def memory(self) -> int:
        return self.rss

    async def wait(self) -> None:
        await self.exited.wait()

    async def stop(self) -> None:
        await trio.sleep(0.5)
        self.stopped = True
        self.exited.set()


class FakeServers:
    """Starts take LOAD_TIME; names in ``broken`` fail with a last error line."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.running: dict[str, FakeServer] = {}
        self.broken: set[str] = set()
        self.pids = 100

    def waited_for(self, spec: ModelSpec) -> str:
        return ""

    def last_line(self, spec: ModelSpec) -> str:
        return ""

    async def start(self, spec: ModelSpec) -> FakeServer:
        self.started.append(spec.name)
        if spec.problem is not None:  # as the real servers refuse a file known to be bad
            raise LoadFailed(spec.problem)
        await trio.sleep(LOAD_TIME)
        if spec.name in self.broken:
            raise LoadFailed("error loading model: tensor 'x' has wrong shape")
        self.pids += 1
        server = self.running[spec.name] = FakeServer(spec, self.pids)
        return server


def spec(name: str, gib: float = 1, keep_alive: float = 300, preload: bool = False
         ) -> ModelSpec:
    return ModelSpec(name=name, path=f"/m/{name}.gguf", estimate=int(gib * GIB),
                     keep_alive=keep_alive, preload=preload)


Started = tuple[Lifecycle, FakeServers, list[tuple[str, ModelState]]]


StartLifecycle = Callable[..., Awaitable[Started]]


@pytest.fixture
def start(nursery: trio.Nursery) -> StartLifecycle:
    async def go(specs: Sequence[ModelSpec], *, budget: float = 4, max_loaded: int = 0,
                 load_timeout: float = 120) -> Started:
        servers = FakeServers()
        moves: list[tuple[str, ModelState]] = []
        life = Lifecycle(specs, servers, budget=int(budget * GIB), max_loaded=max_loaded,
                         load_timeout=lambda: load_timeout,
                         on_change=lambda m: moves.append((m.name, m.state)))
        await nursery.start(life.run)
        return life, servers, moves

    return go


async def use(life: Lifecycle, name: str, seconds: float = 1) -> Managed:
    """One request: acquire, hold for ``seconds``, release."""
    model = await life.acquire(name)
    try:
        await trio.sleep(seconds)
    finally:
        life.release(model)
    return model


async def test_a_request_loads_then_idle_unloads(autojump_clock: trio.testing.MockClock,
                                                 start: StartLifecycle) -> None:
    life, servers, moves = await start([spec("a", keep_alive=60)])
    t0 = trio.current_time()
    model = await life.acquire("a")
    assert trio.current_time() - t0 == pytest.approx(LOAD_TIME)
    assert model.state is ModelState.LOADED
    assert model.memory == GIB // 2  # measured replaces the estimate
    await trio.sleep(10)
    life.release(model)
    released = trio.current_time()
    await trio.sleep(59)
    assert model.state is ModelState.LOADED
    await trio.sleep(1.1)
    assert model.state is ModelState.UNLOADING
    await trio.sleep(1)
    assert model.state is ModelState.UNLOADED
    assert servers.running["a"].stopped
    assert moves == [("a", ModelState.LOADING), ("a", ModelState.LOADED),
                     ("a", ModelState.UNLOADING), ("a", ModelState.UNLOADED)]
    assert released + 60 <= trio.current_time()


async def test_the_warm_path_does_not_wait(autojump_clock: trio.testing.MockClock,
                                           start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("a")])
    await use(life, "a")
    t0 = trio.current_time()
    model = await life.acquire("a")
    assert trio.current_time() == t0
    life.release(model)
    assert servers.started == ["a"]


async def test_take_pins_only_a_loaded_model(autojump_clock: trio.testing.MockClock,
                                             start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a")])
    assert life.take("a") is None
    await use(life, "a")
    model = life.take("a")
    assert model is not None
    assert model.in_flight == 1
    assert not life.unload("a")
    life.release(model)


async def test_concurrent_requests_share_one_load(autojump_clock: trio.testing.MockClock,
                                                  start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("a")])
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(use, life, "a")
    assert servers.started == ["a"]
    assert life.models["a"].in_flight == 0


async def test_a_client_that_leaves_does_not_cancel_the_load(
        autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("a")])
    with trio.move_on_after(LOAD_TIME / 2):
        await life.acquire("a")
    model = life.models["a"]
    assert (model.state, model.in_flight) == (ModelState.LOADING, 0)
    await trio.sleep(LOAD_TIME)
    assert model.state is ModelState.LOADED
    assert servers.started == ["a"]


async def test_room_is_made_least_recently_used_first(autojump_clock: trio.testing.MockClock,
                                                       start: StartLifecycle) -> None:
    specs = [spec("a", 2), spec("b", 2), spec("c", 2), spec("d", 3)]
    life, servers, _ = await start(specs, budget=4)
    # Each measured at half its estimate once loaded: a, b and c fit (1 GiB each) ...
    for name in "abc":
        await use(life, name)
    assert [m.state for m in life.models.values()][:3] == [ModelState.LOADED] * 3
    await use(life, "a")  # a is now the most recently used
    # ... d (3 GiB estimated) needs b and c gone, the least recently used.
    await use(life, "d")
    states = {n: m.state for n, m in life.models.items()}
    assert states == {"a": ModelState.LOADED, "b": ModelState.UNLOADED,
                      "c": ModelState.UNLOADED, "d": ModelState.LOADED}
    assert servers.running["b"].stopped
    assert servers.running["c"].stopped


async def test_a_model_in_use_is_never_unloaded_for_room(autojump_clock: trio.testing.MockClock,
                                                         start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a", 4), spec("b", 4)], budget=4)
    a = await life.acquire("a")  # a stream in flight on a: pinned
    with pytest.raises(SluiceError) as refused:
        await life.acquire("b")
    assert (refused.value.status, refused.value.code) == (503, "model_memory_exhausted")
    assert "the memory budget is 4.0 GiB" in refused.value.message
    assert "needs an estimated 4.0 GiB" in refused.value.message
    assert a.state is ModelState.LOADED
    assert life.models["b"].in_flight == 0
    life.release(a)
    await use(life, "b")  # a is idle now: unloaded for b
    assert a.state is ModelState.UNLOADED


async def test_max_loaded(autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a"), spec("b")], budget=100, max_loaded=1)
    await use(life, "a")
    await use(life, "b")
    assert (life.models["a"].state, life.models["b"].state) == (ModelState.UNLOADED,
                                                                 ModelState.LOADED)


async def test_a_model_larger_than_the_budget(autojump_clock: trio.testing.MockClock,
                                              start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("huge", 8)], budget=4)
    with pytest.raises(SluiceError) as refused:
        await life.acquire("huge")
    assert refused.value.code == "model_memory_exhausted"
    assert servers.started == []
    assert life.models["huge"].state is ModelState.UNLOADED


async def test_a_failed_load_backs_off(autojump_clock: trio.testing.MockClock,
                                       start: StartLifecycle) -> None:
    life, servers, moves = await start([spec("a")])
    servers.broken.add("a")
    with pytest.raises(SluiceError) as failed:
        await life.acquire("a")
    assert (failed.value.status, failed.value.code) == (503, "model_load_failed")
    assert "tensor 'x' has wrong shape" in failed.value.message
    assert life.models["a"].state is ModelState.FAILED
    t0 = trio.current_time()
    with pytest.raises(SluiceError):  # within the back-off: at once, no new start
        await life.acquire("a")
    assert trio.current_time() == t0
    assert servers.started == ["a"]
    servers.broken.clear()
    await trio.sleep(RETRY_AFTER_FAILURE)
    await use(life, "a")  # then it is tried again
    assert servers.started == ["a", "a"]
    assert [s for _, s in moves] == [ModelState.LOADING, ModelState.FAILED,
                                     ModelState.LOADING, ModelState.LOADED]


async def test_a_load_that_takes_too_long(autojump_clock: trio.testing.MockClock,
                                          start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a")], load_timeout=LOAD_TIME / 2)
    with pytest.raises(SluiceError) as late:
        await life.acquire("a")
    assert (late.value.status, late.value.code) == (504, "model_load_timeout")
    await trio.sleep(LOAD_TIME)
    assert life.models["a"].state is ModelState.FAILED  # the load itself timed out too


async def test_a_request_during_unloading_waits_and_loads_again(
        autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("a")])
    await use(life, "a")
    assert life.unload("a")
    assert life.models["a"].state is ModelState.UNLOADING
    model = await life.acquire("a")
    assert model.state is ModelState.LOADED
    assert servers.started == ["a", "a"]
    life.release(model)


async def test_no_unload_while_a_stream_is_in_flight(autojump_clock: trio.testing.MockClock,
                                                     start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a", keep_alive=0)])
    model = await life.acquire("a")
    assert not life.unload("a")  # the API's unload waits for the request
    await trio.sleep(3600)  # an hour-long stream with keep_alive 0
    assert model.state is ModelState.LOADED
    life.release(model)
    await trio.sleep(0.1)
    assert model.state is ModelState.UNLOADING  # 0s: right after the answer


async def test_forever_is_never_unloaded_by_idle(autojump_clock: trio.testing.MockClock,
                                                 start: StartLifecycle) -> None:
    life, _, _ = await start([spec("a", keep_alive=math.inf)])
    await use(life, "a")
    await trio.sleep(7 * 24 * 3600)
    assert life.models["a"].state is ModelState.LOADED


async def test_preload_loads_at_start_and_again_after_idle(
        autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    life, servers, _ = await start([spec("a", keep_alive=30, preload=True)])
    await trio.sleep(LOAD_TIME + 0.1)
    assert life.models["a"].state is ModelState.LOADED
    await trio.sleep(30)
    await trio.sleep(LOAD_TIME + 1)
    assert servers.started == ["a", "a"]
    assert life.models["a"].state is ModelState.LOADED


async def test_a_crashed_server_is_loaded_again_by_the_next_request(
        autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    """A server that dies after it ran RETRY_AFTER_FAILURE is started again at once."""
    life, servers, moves = await start([spec("a")])
    await use(life, "a", seconds=RETRY_AFTER_FAILURE)
    servers.running["a"].exited.set()  # the server died by itself
    await trio.sleep(0.01)
    assert life.models["a"].state is ModelState.FAILED  # SPEC §11.1
    assert life.models["a"].failure == "its server exited"
    assert moves[-1] == ("a", ModelState.FAILED)
    await use(life, "a")
    assert servers.started == ["a", "a"]
    assert life.models["a"].restarts == 1


async def test_a_server_that_keeps_dying_is_started_at_most_once_per_back_off(
        autojump_clock: trio.testing.MockClock, start: StartLifecycle) -> None:
    """At most one start per RETRY_AFTER_FAILURE, counted from the start of the server that
    died: a request before that gets the failure at once, one after it starts it again."""
    life, servers, _ = await start([spec("a")])
    began = trio.current_time()
    await use(life, "a")
    servers.running["a"].exited.set()
    await trio.sleep(0.01)
    with pytest.raises(SluiceError) as failed:
        await life.acquire("a")
    assert (failed.value.status, failed.value.code) == (503, "model_load_failed")
    assert "its server exited" in failed.value.message
    assert servers.started == ["a"]
    await trio.sleep_until(began + RETRY_AFTER_FAILURE)
    await use(life, "a")
    assert servers.started == ["a", "a"]


async def test_every_server_is_stopped_when_the_lifecycle_ends(
        autojump_clock: trio.testing.MockClock) -> None:
    servers = FakeServers()
    life = Lifecycle([spec("a"), spec("b")], servers, budget=8 * GIB, max_loaded=0,
                     load_timeout=lambda: 120.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(life.run)
        await use(life, "a")
        await use(life, "b")
        nursery.cancel_scope.cancel()
    assert all(s.stopped for s in servers.running.values())
