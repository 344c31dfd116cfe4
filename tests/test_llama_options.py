"""The bundled llama.cpp's options of a ``models:`` entry (SPEC §11.1): ``gpu_layers``,
``flash_attn``, ``cache_type_k``/``_v`` and ``batch`` made into launcher arguments
(:func:`protocol.model_spec.llama_args`), parsed by the launcher and set on the installed
wheel's real ``CommonParams`` (:func:`proxy.models.launcher.build_params`); no server is
started and no GPU is needed: the GPU options are checked as what llama.cpp is handed. An
option the wheel does not have ends the launcher with one line, no traceback."""

from __future__ import annotations

import types
from typing import Any

import pytest

from protocol.config import ModelConfig
from protocol.model_spec import llama_args
from proxy.models import launcher
from proxy.models.launcher import Unsupported, build_params

xllamacpp = pytest.importorskip("xllamacpp")

BASE = ["--model", "/models/m.gguf", "--alias", "m", "--listen", "127.0.0.1:0",
        "--context", "4096", "--parallel", "2", "--threads", "1"]
OPTIONS = ("n_gpu_layers", "flash_attn_type", "cache_type_k", "cache_type_v", "n_batch")


def params_of(model: ModelConfig, module: types.ModuleType = xllamacpp) -> Any:
    """What the launcher sets for ``model``: the arguments the gateway passes (as
    proxy/models/bundled.py does: the base ones, then llama_args), parsed and applied."""
    args = launcher._parser().parse_args([*BASE, *llama_args(model)])
    return build_params(args, module)


def test_each_option_reaches_its_field() -> None:
    model = ModelConfig(name="m", path="m.gguf", gpu_layers=99, flash_attn=True,
                        cache_type_k="q8_0", cache_type_v="q4_0", batch=512)
    assert llama_args(model) == ["--gpu-layers", "99", "--flash-attn", "on",
                                 "--cache-type-k", "q8_0", "--cache-type-v", "q4_0",
                                 "--batch", "512"]
    params = params_of(model)
    assert params.n_gpu_layers == 99
    assert params.flash_attn_type == xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert params.cache_type_k == xllamacpp.ggml_type.GGML_TYPE_Q8_0
    assert params.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_Q4_0
    assert params.n_batch == 512
    assert params.n_ctx == 4096  # the base arguments still apply
    assert params.model.path == "/models/m.gguf"


def test_the_other_values() -> None:
    params = params_of(ModelConfig(name="m", path="m.gguf", gpu_layers=-1, flash_attn=False,
                                   cache_type_k="bf16", cache_type_v="iq4_nl"))
    assert params.n_gpu_layers == -1
    assert params.flash_attn_type == \
        xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    assert params.cache_type_k == xllamacpp.ggml_type.GGML_TYPE_BF16
    assert params.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_IQ4_NL
    assert params_of(ModelConfig(name="m", path="m.gguf", gpu_layers=0)).n_gpu_layers == 0


def test_every_cache_type_of_the_config_is_one_of_the_wheel() -> None:
    from protocol.config.schema import CACHE_TYPES

    for name in CACHE_TYPES:
        params = params_of(ModelConfig(name="m", path="m.gguf", cache_type_k=name,
                                       cache_type_v=name))
        assert params.cache_type_k.name == f"GGML_TYPE_{name.upper()}"
        assert params.cache_type_v == params.cache_type_k


def test_an_option_left_out_keeps_llama_cpp_s_default() -> None:
    model = ModelConfig(name="m", path="m.gguf")
    assert llama_args(model) == []
    params = params_of(model)
    default = xllamacpp.CommonParams()
    for field in OPTIONS:
        assert getattr(params, field) == getattr(default, field), field
    only_batch = params_of(ModelConfig(name="m", path="m.gguf", batch=64))
    assert only_batch.n_batch == 64
    for field in OPTIONS[:-1]:
        assert getattr(only_batch, field) == getattr(default, field), field


def test_an_embedding_model_serves_embeddings() -> None:
    model = ModelConfig(name="e", path="e.gguf", kind="embedding", batch=1024)
    assert llama_args(model) == ["--batch", "1024", "--embeddings"]
    params = params_of(model)
    assert params.embedding is True
    assert params.n_batch == 1024


# --------------------------------------------------------------- what the wheel does not have


class _WithoutGpuLayers(xllamacpp.CommonParams):  # type: ignore[misc]
    """A wheel older than n_gpu_layers: the attribute is not there."""

    @property
    def n_gpu_layers(self) -> int:
        raise AttributeError("n_gpu_layers")


def _wheel(**changes: Any) -> types.ModuleType:
    """The installed wheel with ``changes`` (a name set to None is taken away)."""
    module = types.ModuleType("xllamacpp")
    module.__dict__.update({k: v for k, v in vars(xllamacpp).items() if not k.startswith("__")})
    module.__version__ = "0.0.1"
    for name, value in changes.items():
        if value is None:
            delattr(module, name)
        else:
            setattr(module, name, value)
    return module


def test_a_missing_field_is_said_with_its_config_key() -> None:
    with pytest.raises(Unsupported) as caught:
        params_of(ModelConfig(name="m", path="m.gguf", gpu_layers=10),
                  _wheel(CommonParams=_WithoutGpuLayers))
    message = str(caught.value)
    assert message.startswith("gpu_layers is not supported by the installed llama.cpp")
    assert "xllamacpp 0.0.1 has no CommonParams.n_gpu_layers" in message
    # Not asked for: no error.
    params_of(ModelConfig(name="m", path="m.gguf"), _wheel(CommonParams=_WithoutGpuLayers))


def test_a_missing_enum_is_said_with_its_config_key() -> None:
    with pytest.raises(Unsupported, match=r"^flash_attn: on is not supported .* has no "
                                          r"llama_flash_attn_type\.LLAMA_FLASH_ATTN_TYPE_ENABLED"):
        params_of(ModelConfig(name="m", path="m.gguf", flash_attn=True),
                  _wheel(llama_flash_attn_type=None))
    types_without_q4_1 = types.SimpleNamespace(
        GGML_TYPE_F16=xllamacpp.ggml_type.GGML_TYPE_F16)
    with pytest.raises(Unsupported, match=r"^cache_type_v: q4_1 is not supported .* "
                                          r"ggml_type\.GGML_TYPE_Q4_1\)$"):
        params_of(ModelConfig(name="m", path="m.gguf", cache_type_v="q4_1"),
                  _wheel(ggml_type=types_without_q4_1))


def test_a_value_llama_cpp_refuses_is_said_too() -> None:
    with pytest.raises(Unsupported, match=r"^batch: llama.cpp refuses 1099511627776: "):
        params_of(ModelConfig(name="m", path="m.gguf", batch=1 << 40))


def test_the_launcher_exits_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The line is the model's lastError (the last line of its log); nothing is started."""
    monkeypatch.setitem(__import__("sys").modules, "xllamacpp",
                        _wheel(CommonParams=_WithoutGpuLayers, Server=None))
    status = launcher.main([*BASE, "--gpu-layers", "5"])
    assert status == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpu_layers is not supported by the installed llama.cpp")
    assert "Traceback" not in err


def test_the_launcher_needs_its_three_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        launcher.main(["--alias", "m"])
    assert caught.value.code == 2
    assert "required: --model, --listen" in capsys.readouterr().err


# ------------------------------------------------------------------- from config.yaml on


def test_the_readme_s_example_reaches_llama_cpp() -> None:
    """The YAML of the README's "GPU builds of the bundled llama.cpp", end to end."""
    from pathlib import Path

    from protocol.config import parse_config_text

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = next(b.split("\n", 1)[1] for b in readme.split("```yaml")[1:]
                 if "gpu_layers: -1" in b.split("```")[0]).split("```")[0]
    (model,) = parse_config_text(block).models
    params = params_of(model)
    assert params.n_gpu_layers == -1
    assert params.flash_attn_type == xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert params.cache_type_k == params.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_Q8_0
    assert params.n_batch == 1024


def test_a_bad_value_is_refused_with_its_path() -> None:
    from protocol.config import parse_config_text
    from protocol.errors import ConfigError

    with pytest.raises(ConfigError, match=r"models\[0\]\.cache_type_v: unknown cache type 'q2'"):
        parse_config_text("models: [{name: m, path: m.gguf, cache_type_v: q2}]")
    with pytest.raises(ConfigError, match=r"models\[0\]\.gpu_layers: is an option of the bundled"):
        parse_config_text("models: [{name: m, command: [srv], memory: 1GiB, gpu_layers: 9}]")


def test_threads_0_is_the_cores_the_server_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """``threads: 0`` starts a thread per core the process may run on (its affinity: a
    cpuset, taskset), not per core of the machine; a number given is kept."""
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 8)
    auto = launcher._parser().parse_args([*BASE[:-1], "0"])
    params = build_params(auto, xllamacpp)
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (1, 1)
    given = build_params(launcher._parser().parse_args([*BASE[:-1], "2"]), xllamacpp)
    assert given.cpuparams.n_threads == 2
    monkeypatch.delattr(launcher.os, "sched_getaffinity")  # a system without affinity
    assert build_params(auto, xllamacpp).cpuparams.n_threads == 8


def test_the_launcher_s_sampling_defaults() -> None:
    """``--temp`` and ``--seed`` set what a request that names neither samples with (the
    agents test serves its model greedy this way); left out, llama.cpp's own defaults."""
    default = xllamacpp.CommonParams().sampling
    kept = build_params(launcher._parser().parse_args(BASE), xllamacpp).sampling
    assert (kept.temp, kept.seed) == (default.temp, default.seed)
    assert default.temp > 0
    given = build_params(launcher._parser().parse_args([*BASE, "--temp", "0", "--seed", "7"]),
                         xllamacpp).sampling
    assert (given.temp, given.seed) == (0.0, 7)
