"""Which compute backends the installed llama.cpp has (SPEC §11.1): read from its system info
and devices (protocol/llama_backends.py), and shown by ``sluice status``.
The question asked of a child process (proxy/models/llama_backends.py) and the gateway's
answers: tests/test_e2e_llama_backends.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from protocol.llama_backends import backends_of
from proxy.cli.render import show
from proxy.models import launcher
from proxy.models.llama_backends import LlamaBackends, parse_answer

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


async def test_not_installed_runs_nothing(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    llama = LlamaBackends(_printing('["cpu"]', count), installed=False)
    assert await llama.ask() is None
    assert llama.known
    assert not count.exists()


# ---------------------------------------------------------------------------------- shown


def test_the_status_line() -> None:
    base = {"socketPath": "/run/sluice.sock", "routerPort": 39080, "models": ["m"],
            "backends": [], "managedModels": []}
    assert show({**base, "llamaBackends": ["cuda", "cpu"]}).splitlines()[2] == \
        "llama.cpp: cuda, cpu"
    assert show({**base, "llamaBackends": None}).splitlines()[2].startswith(
        "llama.cpp: not installed")
    assert not any(x.startswith("llama.cpp") for x in show(base).splitlines())  # older


