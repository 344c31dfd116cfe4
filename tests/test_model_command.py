"""SPEC §11.1 as pure code: ``models[]``' command keys read and checked (protocol/config),
the placeholders filled in (protocol/model_command.py), the bundled engine's options as
launcher arguments, and the README's example config."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.config import ModelConfig, config_to_dict, parse_config_text
from protocol.errors import ConfigError
from protocol.model_command import expand, placeholders_in, unknown_placeholder, uses
from protocol.model_spec import llama_args

README = Path(__file__).parents[1] / "README.md"


def models(text: str) -> tuple[ModelConfig, ...]:
    return parse_config_text("models:\n" + text).models


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        models(text)
    return caught.value


def test_a_command_as_a_list_or_a_string_split_like_a_shell() -> None:
    listed, split = models(
        '  - {name: a, command: [srv, --port, "${PORT}", "two words"]}\n'
        "  - name: b\n"
        "    command: srv -m '${MODEL}' --port ${PORT} \"two words\"\n"
        "    path: /m/b.gguf\n")
    assert listed.command == ("srv", "--port", "${PORT}", "two words")
    assert split.command == ("srv", "-m", "${MODEL}", "--port", "${PORT}", "two words")
    assert listed.path == ""


def test_every_key_read() -> None:
    (model,) = models(
        "  - name: a\n    command: [srv]\n    env: {CUDA_VISIBLE_DEVICES: 0, X: y}\n"
        "    health: /v1/models\n    memory: 6GiB\n    kind: speech\n"
        "    stop_signal: SIGINT\n")
    assert model.env == (("CUDA_VISIBLE_DEVICES", "0"), ("X", "y"))
    assert (model.health, model.memory, model.kind, model.stop_signal) == (
        "/v1/models", 6 << 30, "speech", "SIGINT")
    (bundled,) = models("  - {name: b, path: b.gguf, gpu_layers: -1, flash_attn: true,\n"
                        "     cache_type_k: q8_0, cache_type_v: q4_0, batch: 512}\n")
    assert llama_args(bundled) == ["--gpu-layers", "-1", "--flash-attn", "on",
                                   "--cache-type-k", "q8_0", "--cache-type-v", "q4_0",
                                   "--batch", "512"]
    assert llama_args(ModelConfig(name="c", path="c.gguf")) == []
    assert llama_args(ModelConfig(name="e", path="e.gguf", kind="embedding")) == \
        ["--embeddings"]


@pytest.mark.parametrize(("text", "path", "words"), [
    ("{name: a, command: [srv, --port, '${PROT}']}", "models[0].command[2]",
     "unknown placeholder ${PROT}"),
    ("{name: a, command: [srv, '-m', '${MODEL}']}", "models[0].path", "names ${MODEL}"),
    ("{name: a, command: \"srv 'unclosed\"}", "models[0].command", "cannot split"),
    ("{name: a, command: [srv, 8080]}", "models[0].command[1]", "must be a string"),
    ("{name: a, command: [srv], gpu_layers: 99}", "models[0].gpu_layers",
     "pass your server's own flag"),
    ("{name: a, path: a.gguf, env: {A: b}}", "models[0].env", "with a command"),
    ("{name: a, path: a.gguf, health: /up}", "models[0].health", "with a command"),
    ("{name: a, path: a.gguf, gpu_layers: -2}", "models[0].gpu_layers", "-1"),
    ("{name: a, path: a.gguf, cache_type_k: q3}", "models[0].cache_type_k", "q8_0"),
    ("{name: a, path: a.gguf, batch: 0}", "models[0].batch", "at least 1"),
    ("{name: a, path: a.gguf, flash_attn: 1}", "models[0].flash_attn", "true or false"),
    ("{name: a, path: a.gguf, kind: diffusion}", "models[0].kind", "needs a command"),
    ("{name: a, command: [srv], kind: video}", "models[0].kind", "unknown kind"),
    ("{name: a, command: [srv], stop_signal: TERM}", "models[0].stop_signal", "SIGTERM"),
    ("{name: a, command: [srv], health: 'health'}", "models[0].health", "a path"),
    ("{name: a, command: [srv], memory: 0}", "models[0].memory", "greater than 0"),
    ("{name: a, command: [srv], env: [A]}", "models[0].env", "mapping"),
    ("{name: a}", "models[0].path", "must not be empty"),
])
def test_bad_input_names_its_field(text: str, path: str, words: str) -> None:
    error = refused(f"  - {text}\n")
    assert error.path == path, error
    assert words in error.message, error


def test_written_back_only_where_set() -> None:
    """config.yaml keeps a bundled model's entry as it was; a command model's keys are
    written as given (the command as a list)."""
    cfg = parse_config_text(
        "models:\n  - {name: a, path: a.gguf}\n"
        "  - name: b\n    command: srv --port ${PORT}\n    memory: 1GiB\n    env: {K: v}\n")
    a, b = config_to_dict(cfg)["models"]
    assert set(a) == {"name", "path", "context", "parallel", "threads", "keep_alive",
                      "preload"}
    assert b["command"] == ["srv", "--port", "${PORT}"]
    assert (b["memory"], b["env"]) == ("1GiB", {"K": "v"})
    assert "path" not in b
    assert parse_config_text("models:\n  - " + repr_yaml(b) + "\n").models[0] == cfg.models[1]


def repr_yaml(entry: dict[str, object]) -> str:
    import json

    return json.dumps(entry)  # JSON is YAML


def test_placeholders() -> None:
    assert placeholders_in("127.0.0.1:${PORT}/${NAME}") == ["PORT", "NAME"]
    assert unknown_placeholder(["a", "${PORT}", "x${HOME}"]) == (2, "HOME")
    assert unknown_placeholder(["$PORT", "${PORT}"]) is None  # only ${...} is ours
    assert uses(["--listen", "unix:${SOCKET}"], "SOCKET")
    assert not uses(["--port", "${PORT}"], "SOCKET")
    assert expand(["-m", "${MODEL}", "--port=${PORT}", "${PORT}${PORT}", "$PORT"],
                  {"MODEL": "/m/a b.gguf", "PORT": "40001"}) == \
        ["-m", "/m/a b.gguf", "--port=40001", "4000140001", "$PORT"]


def test_the_readme_example_is_a_valid_config() -> None:
    text = README.read_text()
    block = text[text.index("#### Your own model servers"):].split("```yaml\n", 1)[1]
    cfg = parse_config_text(block.split("```", 1)[0])
    assert [m.name for m in cfg.models] == ["qwen-coder", "qwen-7b", "mistral-mlx",
                                            "nomic-embed"]
    assert all(m.command for m in cfg.models)
