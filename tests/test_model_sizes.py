"""SPEC §3.1 and §11.1: a command model without ``memory`` must name a readable GGUF, and
that holds in ``check-config``, at start and on every settings write, not only in ``serve``
(issue 39 item 4). The GGUF headers are tests/test_gguf.py's, written to real files."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from protocol.config import Config, ModelConfig, dump_config_yaml
from protocol.errors import ConfigError
from proxy.cli.commands import check_config
from proxy.settings.store import Settings
from tests.test_gguf import header, model

PROGRAM = ("/bin/my-server", "--port", "${PORT}")


def with_models(*models: ModelConfig) -> Config:
    return attrs.evolve(Config(), models=models)


def write(path: Path, cfg: Config) -> Path:
    path.write_text(dump_config_yaml(cfg))
    return path


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "weights.bin").write_bytes(b"not a gguf at all, just bytes")
    (tmp_path / "real.gguf").write_bytes(header(model()))
    return tmp_path


def test_check_config_names_the_missing_memory(files: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = with_models(ModelConfig(name="ok", memory=1 << 30, command=PROGRAM),
                      ModelConfig(name="big", path="weights.bin", command=PROGRAM))
    assert check_config(write(files / "config.yaml", cfg), files) == 2
    err = capsys.readouterr().err
    assert "models[1].memory" in err
    assert "not a GGUF file" in err
    assert "memory: 6GiB" in err


@pytest.mark.parametrize("entry", [
    ModelConfig(name="big", command=PROGRAM),  # no path: nothing to read
    ModelConfig(name="big", path="nowhere.gguf", command=PROGRAM),
])
def test_check_config_without_a_readable_file(files: Path, entry: ModelConfig,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config(write(files / "config.yaml", with_models(entry)), files) == 2
    assert "models[0].memory" in capsys.readouterr().err


@pytest.mark.parametrize("entry", [
    ModelConfig(name="big", path="weights.bin", command=PROGRAM, memory=6 << 30),
    ModelConfig(name="big", path="real.gguf", command=PROGRAM),  # its size is read
    ModelConfig(name="big", path="weights.bin"),  # the bundled engine: a load-time problem
])
def test_check_config_accepts_a_size_it_can_tell(files: Path, entry: ModelConfig,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write(files / "config.yaml", with_models(entry))
    assert check_config(path, files) == 0, capsys.readouterr().err


def test_settings_refuse_it_at_start(files: Path) -> None:
    data = files / "data"
    data.mkdir()
    write(data / "config.yaml", with_models(
        ModelConfig(name="big", path=str(files / "weights.bin"), command=PROGRAM)))
    with pytest.raises(ConfigError) as caught:
        Settings.open(data)
    assert caught.value.path == "models[0].memory"


async def test_a_settings_write_changes_nothing(files: Path) -> None:
    settings = Settings.open(files / "data")
    before = settings.config
    text = settings.config_path.read_text()
    bad = ModelConfig(name="big", path=str(files / "weights.bin"), command=PROGRAM)
    with pytest.raises(ConfigError) as caught:
        await settings.edit(lambda cfg: attrs.evolve(cfg, models=(bad,)))
    assert caught.value.path == "models[0].memory"
    assert caught.value.status == 422
    assert settings.config is before
    assert settings.config_path.read_text() == text
    good = attrs.evolve(bad, path=str(files / "real.gguf"))
    assert (await settings.edit(lambda cfg: attrs.evolve(cfg, models=(good,)))).models == (good,)
