"""Which compute backends the installed llama.cpp has (SPEC §11.1): read from its system info
and devices (protocol/llama_backends.py), asked once of a child process
(proxy/models/llama_backends.py; ``python -m proxy.models.launcher --backends``), and shown
by ``GET /api/v1/models/local``, ``GET /api/v1/inference/status`` and ``sluice status``."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest
import trio

from protocol.llama_backends import backends_of
from proxy.cli.render import show
from proxy.models import launcher
from proxy.models.llama_backends import LlamaBackends, parse_answer
from proxy.server import Gateway
from tests.client import request
from tests.conftest import RunningGateway, gateway_config, llama_answer, open_settings

CPU = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
       "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
CUDA = ("CUDA : ARCHS = 500,610,700,750,800,860,890 | USE_GRAPHS = 1 | "
        "PEER_MAX_BATCH_SIZE = 128 | " + CPU)
METAL = "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | ACCELERATE = 1 | "
MTL = "MTL : EMBED_LIBRARY = 1 | CPU : NEON = 1 | DOTPROD = 1 | "


def test_a_cpu_build() -> None:
    assert backends_of(CPU) == ["cpu"]
    assert backends_of(CPU, ["CPU"]) == ["cpu"]


def test_a_cuda_build() -> None:
    assert backends_of(CUDA) == ["cuda", "cpu"]
    assert backends_of(CUDA, ["CUDA0", "CUDA1", "CPU"]) == ["cuda", "cpu"]


def test_a_metal_build_by_either_name() -> None:
    assert backends_of(METAL) == ["metal", "cpu"]
    assert backends_of(MTL, ["MTL0"]) == ["metal", "cpu"]


def test_a_vulkan_build_shows_by_its_devices() -> None:
    """Vulkan's backend lists no features: its devices name it."""
    assert backends_of(CPU, ["Vulkan0", "Vulkan1", "CPU"]) == ["cpu", "vulkan"]


def test_other_backends_are_kept_lowercased() -> None:
    assert backends_of("ROCm : NO_VMM = 1 | PEER_MAX_BATCH_SIZE = 128 | " + CPU
                       + "BLAS : ACCELERATE = 1 | ") == ["rocm", "cpu", "blas"]
    assert backends_of("", ["SYCL0", "RPC[127.0.0.1:50052]"]) == ["sycl"]
    assert backends_of("") == []
    assert backends_of("garbage without a backend | x = 1") == []


def test_the_launcher_prints_the_installed_backends(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    assert launcher.main(["--backends"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert "cpu" in names  # every build has it; these machines have no GPU


def test_the_launcher_says_null_without_llama_cpp(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # import fails
    assert launcher.main(["--backends"]) == 0
    assert capsys.readouterr().out == "null\n"


def test_the_answer_must_be_a_list_of_names() -> None:
    assert parse_answer('["cuda", "cpu"]') == ["cuda", "cpu"]
    assert parse_answer("null") is None
    for bad in ('{"cpu": 1}', "[1]"):
        with pytest.raises(ValueError, match="not a list of names"):
            parse_answer(bad)
    with pytest.raises(json.JSONDecodeError):
        parse_answer("not json")


# ------------------------------------------------------------------- the gateway's question


def _printing(text: str, count: Path | None = None) -> list[str]:
    """A child that prints ``text`` (and adds a line to ``count`` each time it runs)."""
    code = f"print({text!r})"
    if count is not None:
        code = f"open({str(count)!r}, 'a').write('x\\n'); " + code
    return [sys.executable, "-c", code]


async def test_asked_once_for_all(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    llama = LlamaBackends(_printing('["cuda", "cpu"]', count), installed=True)
    assert not llama.known
    assert llama.backends is None
    answers = []

    async def ask() -> None:
        answers.append(await llama.ask())

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask)
    assert answers == [["cuda", "cpu"]] * 3
    assert await llama.ask() == ["cuda", "cpu"]
    assert llama.known
    assert count.read_text() == "x\n"  # one child for all of them


async def test_a_caller_that_leaves_does_not_cancel_the_question(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """In a gateway the question is a task of the gateway's nursery (LlamaBackends.run)."""
    count = tmp_path / "runs"
    code = (f"import time; open({str(count)!r}, 'a').write('x\\n'); time.sleep(0.3); "
            "print('[\"cpu\"]')")
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    await nursery.start(llama.run)
    with trio.move_on_after(0.05):
        await llama.ask()
    assert not llama.known
    assert await llama.ask() == ["cpu"]
    assert count.read_text() == "x\n"  # the first caller's question, answered to the next


async def test_without_a_nursery_a_cancelled_question_is_asked_again(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    code = (f"import time; open({str(count)!r}, 'a').write('x\\n'); time.sleep(0.3); "
            "print('[\"cpu\"]')")
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    with trio.move_on_after(0.05):
        await llama.ask()
    assert not llama.known
    assert await llama.ask() == ["cpu"]
    assert count.read_text() == "x\nx\n"


async def test_not_installed_runs_nothing(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    llama = LlamaBackends(_printing('["cpu"]', count), installed=False)
    assert await llama.ask() is None
    assert llama.known
    assert not count.exists()


async def test_a_failing_child_is_logged_and_answers_null(
        caplog: pytest.LogCaptureFixture) -> None:
    code = "import sys; print('no GPU driver here', file=sys.stderr); sys.exit(4)"
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    with caplog.at_level(logging.WARNING, "sluice.models"):
        assert await llama.ask() is None
    assert "exited with status 4: no GPU driver here" in caplog.text
    bad = LlamaBackends(_printing("cpu"), installed=True)
    assert await bad.ask() is None
    slow = LlamaBackends([sys.executable, "-c", "import time; time.sleep(30)"],
                         installed=True, timeout=0.2)
    with caplog.at_level(logging.WARNING, "sluice.models"):
        assert await slow.ask() is None
    assert "within 0.2 s" in caplog.text


# ---------------------------------------------------------------------------------- shown


async def own_gateway(nursery: trio.Nursery, folder: Path) -> RunningGateway:
    """A gateway that asks for itself (start_gateway's are told the run's answer)."""
    gateway = Gateway(open_settings(folder / "data", gateway_config([], socket_dir=folder / "s")))
    await nursery.start(gateway.run)
    return RunningGateway(gateway)


async def test_the_api_and_the_status_show_them(nursery: trio.Nursery, short_tmp: Path) -> None:
    """The real question (a child of this gateway), asked by the first of the answers."""
    gw = await own_gateway(nursery, short_tmp)
    assert not gw.gateway.ctx.llama.known
    local = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    assert gw.gateway.ctx.llama.known
    status = (await request(gw.unix, "GET", "/api/v1/inference/status")).json()
    expected = llama_answer()  # the same child, asked by the tests' conftest
    if importlib.util.find_spec("xllamacpp") is None:
        assert expected is None
    else:
        assert "cpu" in expected
    assert local["llamaBackends"] == status["llamaBackends"] == expected
    line = [x for x in show(status).splitlines() if x.startswith("llama.cpp: ")]
    assert line == [f"llama.cpp: {', '.join(expected)}" if expected else
                    "llama.cpp: not installed (or it cannot tell its backends: see the "
                    "gateway's log)"]


def test_the_status_line() -> None:
    base = {"socketPath": "/run/sluice.sock", "routerPort": 39080, "models": ["m"],
            "backends": [], "managedModels": []}
    assert show({**base, "llamaBackends": ["cuda", "cpu"]}).splitlines()[2] == \
        "llama.cpp: cuda, cpu"
    assert show({**base, "llamaBackends": None}).splitlines()[2].startswith(
        "llama.cpp: not installed")
    assert not any(x.startswith("llama.cpp") for x in show(base).splitlines())  # older


async def test_the_events_hello_has_them(nursery: trio.Nursery, short_tmp: Path) -> None:
    """The console's first frame: its status, asked first."""
    from tests.test_events_ws import RawFeed

    gw = await own_gateway(nursery, short_tmp)
    assert not gw.gateway.ctx.llama.known
    feed = await RawFeed.open(gw.unix)
    hello = await feed.frame()
    await feed.stream.aclose()
    assert hello is not None
    assert hello["type"] == "hello"
    expected = gw.gateway.ctx.llama.backends
    assert gw.gateway.ctx.llama.known
    assert hello["data"]["status"]["llamaBackends"] == expected
