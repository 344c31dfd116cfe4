"""Models on demand with real llama.cpp servers (proxy/models/servers.py under the lifecycle):
copies of the real SmolLM2 GGUF in a models folder, real processes that come and go (checked
by pid), real RSS, a broken GGUF, shared loads and a client leaving mid-load."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

from protocol.errors import SluiceError
from protocol.model_state import ModelState
from proxy.models.gguf_file import read_estimate
from proxy.models.lifecycle import Lifecycle, ModelSpec
from proxy.models.scan import scan_models
from proxy.models.servers import ModelServers
from proxy.upstream.pool import ConnectionPool
from tests.client import chat_body, request
from tests.conftest import alive
from tests.test_e2e_llama import gguf  # noqa: F401 (a fixture)

pytest.importorskip("xllamacpp")

GIB = 1 << 30


def models_folder(tmp: Path, gguf: Path, names: list[str]) -> Path:  # noqa: F811
    folder = tmp / "models"
    folder.mkdir()
    for name in names:
        os.symlink(gguf, folder / f"{name}.gguf")  # links of the one file: several models
    (folder / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    (folder / "cut.gguf").write_bytes(gguf.read_bytes()[:1 << 20])
    return folder


Start = Callable[..., Awaitable[Lifecycle]]


@pytest.fixture
def start(nursery: trio.Nursery, short_tmp: Path, gguf: Path  # noqa: F811
          ) -> Iterator[Start]:
    connections = ConnectionPool()

    async def go(*, keep_alive: float = 60, max_loaded: int = 0,
                 budget: int = 8 * GIB) -> Lifecycle:
        folder = models_folder(short_tmp, gguf, ["one", "two"])
        specs = []
        for found in scan_models(short_tmp, ["models"]):
            name = Path(found.path).stem
            estimate, _ = read_estimate(found.path, 512)
            specs.append(ModelSpec(name=name, path=found.path, estimate=estimate,
                                   keep_alive=keep_alive, context=512, parallel=1,
                                   threads=1))
        assert sorted(s.name for s in specs) == ["broken", "cut", "one", "two"]
        servers = ModelServers(short_tmp, folder.parent / "s", connections)
        (folder.parent / "s").mkdir()
        await nursery.start(servers.run)
        life = Lifecycle(specs, servers, budget=budget, max_loaded=max_loaded,
                         load_timeout=lambda: 60.0)
        await nursery.start(life.run)
        return life

    yield go
    connections.close()


def test_the_estimate_is_the_file_and_its_kv_cache(gguf: Path) -> None:  # noqa: F811
    size = gguf.stat().st_size
    # 30 layers x 3 KV heads x (64 + 64) x 2 bytes a token.
    assert read_estimate(str(gguf), 2048) == (size + 2048 * 30 * 3 * 128 * 2, None)
    assert read_estimate("/nonexistent.gguf", 2048)[1] is not None


async def test_load_use_and_unload_real_servers(start: Start) -> None:
    life = await start(max_loaded=1, keep_alive=2)
    one = await life.acquire("one")
    assert one.server is not None
    pid_one = one.server.pid
    assert pid_one is not None
    assert alive(pid_one)
    assert 50 << 20 < one.memory < 1 * GIB  # measured RSS: ~100-200 MB here
    reply = await request(one.server.url, "POST", "/v1/chat/completions",
                          chat_body("one", max_tokens=4))
    assert reply.status == 200
    life.release(one)
    two = await life.acquire("two")  # max_loaded 1: one goes first
    assert one.state is ModelState.UNLOADED
    assert not alive(pid_one)
    assert two.server is not None
    pid_two = two.server.pid
    assert pid_two is not None
    life.release(two)
    with trio.fail_after(15):  # keep_alive 2 s, then SIGTERM
        while two.state is not ModelState.UNLOADED:
            await two.changed.wait()
    assert not alive(pid_two)
    assert two.memory == 0


async def test_a_broken_gguf_fails_with_its_reason(start: Start) -> None:
    life = await start()
    for name, words in (("broken", "metadata entries"), ("cut", "past the end of the file")):
        with pytest.raises(SluiceError) as failed:
            await life.acquire(name)
        assert (failed.value.status, failed.value.code) == (503, "model_load_failed")
        assert words in failed.value.message
        assert life.models[name].state is ModelState.FAILED
    one = await life.acquire("one")  # the others are served all the same
    life.release(one)


async def test_concurrent_first_requests_share_one_load(start: Start) -> None:
    life = await start()
    pids: list[int | None] = []

    async def one_request() -> None:
        model = await life.acquire("one")
        assert model.server is not None
        pids.append(model.server.pid)
        life.release(model)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one_request)
    assert len(pids) == 4
    assert len(set(pids)) == 1


async def test_a_client_leaving_mid_load_does_not_cancel_it(start: Start) -> None:
    life = await start()
    with trio.move_on_after(0.2):
        await life.acquire("one")
    model = life.models["one"]
    assert model.state is ModelState.LOADING
    with trio.fail_after(60):
        while model.state is not ModelState.LOADED:
            await model.changed.wait()
    assert model.server is not None
    assert model.server.pid is not None
    assert alive(model.server.pid)
