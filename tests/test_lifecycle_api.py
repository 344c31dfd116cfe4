"""The lifecycle's side of the admin API and the rescans (proxy/models/lifecycle.py), on
trio's MockClock with the fake servers of tests/test_lifecycle.py: the API's unload (at once
when idle, after the last request in flight, after a load under way), models added, changed
and removed by a rescan, and the load figures the metrics show."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from protocol.errors import SluiceError
from protocol.model_state import ModelState
from proxy.models.lifecycle import Lifecycle
from proxy.models.managed import LOAD_BUCKETS, Managed
from tests.test_lifecycle import GIB, LOAD_TIME, FakeServers, spec, use


async def _start(nursery: trio.Nursery, *specs: object, load_timeout: float = 120,
                 budget: int = 8 * GIB, max_loaded: int = 0,
                 idle: list[str] | None = None) -> tuple[Lifecycle, FakeServers, list[str]]:
    servers = FakeServers()
    removed: list[str] = []
    life = Lifecycle(specs, servers, budget=budget,  # type: ignore[arg-type]
                     max_loaded=max_loaded, load_timeout=lambda: load_timeout,
                     on_removed=lambda m: removed.append(m.name),
                     on_idle=lambda m: (idle if idle is not None else []).append(m.name))
    await nursery.start(life.run)
    return life, servers, removed


async def test_unload_asked_of_an_idle_model_is_at_once(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("a", keep_alive=3600))
    await use(life, "a")
    model = life.ask_unload("a")
    await trio.sleep(0.01)
    assert model.state is ModelState.UNLOADING
    await trio.sleep(1)
    assert model.state is ModelState.UNLOADED
    assert servers.running["a"].stopped
    assert not model.unload_asked
    await use(life, "a")  # a later request loads it again
    assert servers.started == ["a", "a"]


async def test_unload_asked_during_a_request_waits_for_it(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, _, _ = await _start(nursery, spec("a", keep_alive=3600))
    held = await life.acquire("a")
    second = life.take("a")
    assert second is held
    life.ask_unload("a")
    await trio.sleep(600)
    assert held.state is ModelState.LOADED  # two requests in flight pin it
    life.release(held)
    await trio.sleep(1)
    assert held.state is ModelState.LOADED  # one still is
    life.release(held)
    await trio.sleep(0.01)
    assert held.state is ModelState.UNLOADING


async def test_unload_asked_while_it_loads_comes_after_the_load(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, _, _ = await _start(nursery, spec("a", keep_alive=3600))
    waiting: list[Managed] = []

    async def request() -> None:
        waiting.append(await use(life, "a", seconds=5))

    nursery.start_soon(request)
    await trio.sleep(LOAD_TIME / 2)
    model = life.ask_unload("a")
    assert model.state is ModelState.LOADING
    await trio.sleep(LOAD_TIME / 2 + 1)
    assert model.state is ModelState.LOADED  # the waiting request is served first
    await trio.sleep(5)
    assert waiting
    assert model.state in (ModelState.UNLOADING, ModelState.UNLOADED)


async def test_unload_asked_of_a_preload_model_does_not_reload_it(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("a", preload=True))
    await trio.sleep(LOAD_TIME + 0.1)
    life.ask_unload("a")
    await trio.sleep(60)
    assert life.models["a"].state is ModelState.UNLOADED
    assert servers.started == ["a"]


async def test_unload_asked_of_an_unloaded_model_does_nothing(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("a"))
    model = life.ask_unload("a")
    assert model.state is ModelState.UNLOADED
    assert not model.unload_asked
    await use(life, "a")
    await trio.sleep(60)
    assert model.state is ModelState.LOADED  # nothing was left asked
    assert servers.started == ["a"]


async def test_a_rescan_adds_a_model(autojump_clock: trio.testing.MockClock,
                                     nursery: trio.Nursery) -> None:
    life, _, _ = await _start(nursery, spec("a"))
    seen: list[tuple[str, ModelState]] = []
    life.on_change = lambda m: seen.append((m.name, m.state))
    life.add(spec("b"))
    assert seen == [("b", ModelState.UNLOADED)]
    assert (await use(life, "b")).state is ModelState.LOADED


async def test_a_rescan_that_finds_a_file_changed(autojump_clock: trio.testing.MockClock,
                                                  nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("a"), spec("b"))
    servers.broken.add("a")
    model = life.models["a"]
    with pytest.raises(SluiceError):
        await life.acquire("a")
    assert model.state is ModelState.FAILED
    servers.broken.clear()  # the file was replaced: tried again at once, not after 10 s
    life.add(spec("a", gib=1.5))
    assert (await use(life, "a")).state is ModelState.LOADED
    assert model.failure is None
    assert model.spec.estimate == int(1.5 * GIB)
    life.add(attrs.evolve(spec("b"), problem="b.gguf: not a GGUF file"))
    assert life.models["b"].failure == "b.gguf: not a GGUF file"  # shown while unloaded


async def test_a_removed_model_that_is_not_loaded_goes_at_once(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, _, removed = await _start(nursery, spec("a"), spec("b"))
    life.remove("b")
    assert "b" not in life.models
    assert removed == ["b"]


async def test_a_removed_model_in_use_goes_once_its_requests_end(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, servers, removed = await _start(nursery, spec("a", keep_alive=3600))
    model = await life.acquire("a")
    life.remove("a")
    await trio.sleep(600)
    assert model.state is ModelState.LOADED
    assert removed == []
    life.release(model)
    await trio.sleep(1)
    assert removed == ["a"]
    assert "a" not in life.models
    assert servers.running["a"].stopped


async def test_a_removed_model_found_again_stays(autojump_clock: trio.testing.MockClock,
                                                 nursery: trio.Nursery) -> None:
    life, _, removed = await _start(nursery, spec("a", keep_alive=3600))
    model = await life.acquire("a")
    life.remove("a")
    life.add(spec("a", keep_alive=3600))  # the file is back before the request ended
    life.release(model)
    await trio.sleep(60)
    assert removed == []
    assert model.state is ModelState.LOADED


async def test_load_figures_count_each_outcome(autojump_clock: trio.testing.MockClock,
                                               nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("ok"), spec("bad"), spec("slow"),
                                    load_timeout=LOAD_TIME * 3)
    await use(life, "ok")
    servers.broken.add("bad")
    with pytest.raises(SluiceError):
        await life.acquire("bad")
    life.load_timeout = lambda: LOAD_TIME / 4
    with pytest.raises(SluiceError):
        await life.acquire("slow")
    await trio.sleep(LOAD_TIME)
    ok, bad, slow = (life.models[n].loads for n in ("ok", "bad", "slow"))
    assert ok.outcomes == {"success": 1}
    assert ok.seconds == pytest.approx(LOAD_TIME)
    assert ok.buckets[LOAD_BUCKETS.index(2.0)] == 1
    assert sum(ok.buckets) == 1
    assert bad.outcomes == {"failure": 1}
    assert slow.outcomes == {"timeout": 1}
    assert slow.seconds == pytest.approx(LOAD_TIME / 4)


async def test_a_file_known_to_be_bad_fails_without_evicting(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    bad = attrs.evolve(spec("bad"), problem="bad.gguf: not a GGUF file")
    life, _, _ = await _start(nursery, spec("a"), bad, max_loaded=1)
    await use(life, "a")
    with pytest.raises(SluiceError) as failed:
        await life.acquire("bad")
    assert failed.value.code == "model_load_failed"
    assert "not a GGUF file" in failed.value.message
    assert life.models["a"].state is ModelState.LOADED  # not unloaded for a load that fails
    assert life.models["bad"].loads.outcomes == {"failure": 1}


async def test_idle_is_told_when_the_last_request_ends(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    idle: list[str] = []
    life, _, _ = await _start(nursery, spec("a"), idle=idle)
    model = await life.acquire("a")
    assert life.take("a") is model
    life.release(model)
    assert idle == []  # one request still in flight
    life.release(model)
    assert idle == ["a"]
    assert model.unloads_at() == pytest.approx(trio.current_time() + 300)


async def test_a_clients_keep_alive_lasts_for_its_load(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    life, servers, _ = await _start(nursery, spec("a", keep_alive=300))
    model = await life.acquire("a")
    life.keep_alive(model, 20)  # Ollama's "keep_alive": "20s"
    life.release(model)
    await trio.sleep(19)
    assert model.state is ModelState.LOADED
    await trio.sleep(2)
    assert model.state in (ModelState.UNLOADING, ModelState.UNLOADED)
    await trio.sleep(1)
    assert model.keep_alive is None  # the next load has the model's own setting again
    model = await use(life, "a")
    await trio.sleep(299)
    assert model.state is ModelState.LOADED
    forever = await life.acquire("a")
    life.keep_alive(forever, float("inf"))
    life.release(forever)
    await trio.sleep(86400)
    assert model.state is ModelState.LOADED
    assert servers.started == ["a", "a"]
