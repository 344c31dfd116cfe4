"""config.yaml's history (SPEC §13): names, header lines, the cap of 100, restore."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from protocol.config import dump_config_yaml, parse_config_text
from protocol.config_history import (
    KEEP,
    entry_of,
    kept_text,
    new_id,
    split_kept,
    to_drop,
    valid_id,
)
from protocol.errors import ConfigError
from proxy.settings.config_history import ConfigHistory
from proxy.settings.store import Settings

NOON = 1_796_212_800.0  # 2026-12-02T12:00:00Z


def test_ids_sort_by_time_and_never_collide() -> None:
    first = new_id(NOON, "api", [])
    assert first == "20261202T120000.000Z-api"
    second = new_id(NOON, "file", [first])  # the same millisecond: the next one
    assert second == "20261202T120000.001Z-file"
    assert sorted([second, first]) == [first, second]
    assert new_id(NOON + 0.5, "restore", []) == "20261202T120000.500Z-restore"
    with pytest.raises(ValueError, match="unknown source"):
        new_id(NOON, "console", [])


def test_entries_and_header_lines() -> None:
    text = kept_text("api:\n  port: 1\n", "file", ["api", "timeouts"])
    assert text.startswith("# sluice config-history: ")
    assert split_kept(text) == "api:\n  port: 1\n"
    assert split_kept("api: {}\n") == "api: {}\n"  # a file without them stays as it is
    entry = entry_of("20261202T120000.250Z-file.yaml", text)
    assert entry is not None
    assert entry.to_json() == {"id": "20261202T120000.250Z-file",
                               "at": "2026-12-02T12:00:00.250Z", "source": "file",
                               "sections": ["api", "timeouts"]}
    for name in ("notes.yaml", "20261202T120000.250Z-file.yml", "../x-file.yaml",
                 "20261202T120000.250Z-hack.yaml"):
        assert entry_of(name) is None
    assert not valid_id("../../etc/passwd")
    assert not valid_id("20261202T120000.250Z-file/../x")


def test_to_drop_keeps_the_newest() -> None:
    ids = [f"20261202T1200{i:02d}.000Z-api" for i in range(5)]
    assert to_drop(ids, 3) == ids[:2]
    assert to_drop(ids[:2], 3) == []
    assert KEEP == 100


def test_the_folder_keeps_the_last_100(tmp_path: Path) -> None:
    history = ConfigHistory(tmp_path / "config-history")
    for i in range(105):
        history.keep(f"# version {i}\n", "api", ("api",), NOON + i)
    entries = history.entries()
    assert len(entries) == 100
    assert len(list((tmp_path / "config-history").iterdir())) == 100
    assert history.read(entries[0].id) == "# version 104\n"  # newest first
    assert history.read(entries[-1].id) == "# version 5\n"
    assert (tmp_path / "config-history").stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600
               for p in (tmp_path / "config-history").iterdir())
    assert history.read("20000101T000000.000Z-api") is None
    assert history.read("../config.yaml") is None


@pytest.mark.slow
async def test_settings_changes_are_capped_at_100(tmp_path: Path) -> None:
    settings = Settings.open(tmp_path / "data")
    for i in range(103):
        await settings.edit(lambda c, i=i: attrs.evolve(  # type: ignore[misc]
            c, observability=attrs.evolve(c.observability, request_log_size=i + 1)))
    entries = settings.file.history.entries()
    assert len(entries) == 100
    assert {e.source for e in entries} == {"api"}
    assert {e.sections for e in entries} == {("observability",)}
    newest = settings.file.history.read(entries[0].id)
    assert newest is not None
    assert parse_config_text(newest).observability.request_log_size == 102


async def test_restore_applies_a_version_and_keeps_the_current(tmp_path: Path) -> None:
    settings = Settings.open(tmp_path / "data")
    original = settings.config_path.read_text()
    seen: list[object] = []
    settings.subscribe(seen.append)
    await settings.edit(lambda c: attrs.evolve(c, timeouts=attrs.evolve(c.timeouts,
                                                                         connection=3.0)))
    [kept] = settings.file.history.entries()
    restored = await settings.restore(kept.id)
    assert restored is not None
    assert restored.timeouts.connection == 10.0
    assert settings.config.timeouts.connection == 10.0
    assert settings.config_path.read_text() == original  # the file as it was, verbatim
    assert len(seen) == 2
    sources = [e.source for e in settings.file.history.entries()]
    assert sources == ["restore", "api"]
    assert await settings.restore("20000101T000000.000Z-api") is None


async def test_restore_of_a_version_invalid_today_changes_nothing(tmp_path: Path) -> None:
    settings = Settings.open(tmp_path / "data")
    folder = tmp_path / "data" / "config-history"
    folder.mkdir()
    (folder / "20261202T120000.000Z-file.yaml").write_text("api:\n  prot: 1\n")
    before = settings.config_path.read_bytes()
    with pytest.raises(ConfigError, match=r"api\.prot"):
        await settings.restore("20261202T120000.000Z-file")
    assert settings.config_path.read_bytes() == before
    assert dump_config_yaml(settings.config) == before.decode()
