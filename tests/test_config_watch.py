"""The config.yaml watcher (SPEC §13) on trio's MockClock, with a fake stat source.

The file is real (written the ways editors write it); its signature comes from
:class:`FakeStat` (inode, size and a checksum of the content instead of mtime), so the
watcher's decisions never depend on the filesystem's timestamp granularity. Checks are at
t = 0, 2, 4 ... and a new signature is read once it held for 0.5 s.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from protocol.config import Config, dump_config_yaml
from proxy.files import FileSignature
from proxy.notifications import Notifications
from proxy.settings.config_watch import CHECK_EVERY, SETTLE, ConfigWatcher
from proxy.settings.store import Settings


class FakeStat:
    """A stat source: a regular file's (device 1, inode, size, crc32 of its bytes)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> FileSignature | None:
        self.calls += 1
        try:
            st = os.stat(path)
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None
        return (1, st.st_ino, len(data), zlib.crc32(data))


@attrs.define
class World:
    settings: Settings
    watcher: ConfigWatcher
    notes: Notifications
    seen: list[Config]

    @property
    def path(self) -> Path:
        return self.settings.config_path

    def codes(self) -> dict[str, str]:
        return {n["code"]: n["message"] for n in self.notes.all()}

    def text_with(self, **changes: object) -> str:
        cfg = self.settings.config
        timeouts = attrs.evolve(cfg.timeouts, **changes)  # type: ignore[arg-type]
        return dump_config_yaml(attrs.evolve(cfg, timeouts=timeouts))

    def rename_over(self, text: str) -> None:
        """vim/VS Code style: a temp file, renamed over config.yaml."""
        tmp = self.path.with_name(".config.yaml.swp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def in_place(self, text: str) -> None:
        """nano/echo style: truncate, then write, in one go."""
        self.path.write_text(text)

    def history(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(e.source, e.sections) for e in self.settings.file.history.entries()]


async def inline(work: Callable[..., Any], *args: Any) -> Any:
    return work(*args)


@pytest.fixture
async def world(tmp_path: Path, nursery: trio.Nursery) -> World:
    settings = Settings.open(tmp_path / "data")
    settings.file.stat = FakeStat()
    settings.file.signature = settings.file.stat(settings.config_path)
    settings.in_thread = inline  # no thread: the mock clock must not jump while one runs
    notes = Notifications()
    watcher = ConfigWatcher(settings, notes)
    seen: list[Config] = []
    settings.subscribe(seen.append)
    await nursery.start(watcher.run)
    return World(settings, watcher, notes, seen)


async def at(moment: float) -> None:
    """Sleep until the mock clock reads ``moment``."""
    await trio.sleep_until(moment)


async def test_constants_are_the_contract() -> None:
    assert CHECK_EVERY == 2.0
    assert SETTLE == 0.5


async def test_a_renamed_over_file_is_applied(autojump_clock: trio.testing.MockClock,
                                              world: World) -> None:
    await at(1.0)
    world.rename_over(world.text_with(connection=7.0))
    await at(2.1)  # seen at 2.0, not read yet: it must hold until 2.5
    assert world.seen == []
    await at(2.6)
    assert [c.timeouts.connection for c in world.seen] == [7.0]
    assert world.settings.config.timeouts.connection == 7.0
    assert world.codes()["config_reloaded"] == "config.yaml reloaded: timeouts"
    assert world.history() == [("file", ("timeouts",))]
    assert world.watcher.reloads == 1


async def test_truncate_then_write_applies_only_the_whole_file(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    full = world.text_with(connection=7.0)
    await at(1.9)
    world.path.write_text("")  # truncated ...
    await at(2.2)  # ... seen empty at 2.0 ...
    world.path.write_text(full[:len(full) // 2])  # ... half written (parses on its own) ...
    await at(2.4)
    world.path.write_text(full)  # ... whole
    await at(10.0)
    assert [c.timeouts.connection for c in world.seen] == [7.0]
    assert "config_invalid" not in world.codes()
    assert world.watcher.reloads == 1


async def test_two_quick_edits_make_one_reload_of_the_last(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    await at(1.9)
    world.in_place(world.text_with(connection=7.0))
    await at(2.3)  # seen at 2.0; changed again before it settled
    world.in_place(world.text_with(connection=8.0))
    await at(10.0)
    assert [c.timeouts.connection for c in world.seen] == [8.0]
    assert world.watcher.reloads == 1
    assert world.history() == [("file", ("timeouts",))]


async def test_a_file_written_twice_between_checks_is_read_once(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    await at(0.5)
    world.in_place(world.text_with(connection=7.0))
    await at(0.6)
    world.in_place(world.text_with(connection=9.0))
    await at(10.0)
    assert [c.timeouts.connection for c in world.seen] == [9.0]


async def test_the_gateways_own_writes_are_not_reloaded(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    stat = world.settings.file.stat
    assert isinstance(stat, FakeStat)
    await at(1.0)
    cfg = world.settings.config
    await world.settings.update(attrs.evolve(cfg, timeouts=attrs.evolve(cfg.timeouts,
                                                                        connection=5.0)))
    await at(30.0)
    assert [c.timeouts.connection for c in world.seen] == [5.0]  # the write's own, once
    assert world.watcher.reloads == 0
    assert world.history() == [("api", ("timeouts",))]
    assert stat.calls >= 15  # it kept looking


async def test_a_comment_only_edit_applies_nothing(autojump_clock: trio.testing.MockClock,
                                                   world: World) -> None:
    await at(1.0)
    world.in_place(world.path.read_text() + "# my note\n")
    await at(5.0)
    assert world.seen == []
    assert world.watcher.reloads == 0
    assert "config_reloaded" not in world.codes()
    assert world.history() == [("file", ())]  # the text before the note is kept


@pytest.mark.parametrize(("bad", "expected"), [
    ("api:\n  port: [1\n", "malformed YAML at line"),
    ("api:\n  prot: 1\n", "api.prot"),
    ("api:\n  port: 1\n  port: 2\n", "duplicate key 'port'"),
    ("api:\n  port: fast\n", "api.port"),
    ("timeouts:\n  connection: 99s\n", "timeouts.connection"),
    # SPEC §3.1, §11.1: a command model whose size cannot be read (no such file here)
    ("models:\n  - {name: big, path: weights.bin, command: [prog, x]}\n", "models[0].memory"),
])
async def test_an_invalid_file_keeps_the_running_settings(
        autojump_clock: trio.testing.MockClock, world: World, caplog: pytest.LogCaptureFixture,
        bad: str, expected: str) -> None:
    good = world.path.read_text()
    running = world.settings.config
    await at(1.0)
    with caplog.at_level(logging.WARNING, logger="sluice.notifications"):
        world.in_place(bad)
        await at(3.0)
    message = world.codes()["config_invalid"]
    assert message.startswith("config.yaml was not applied: ")
    assert expected in message
    assert "keeps running on its previous settings" in message
    assert [r.getMessage() for r in caplog.records] == [message]  # the WARNING, once
    assert world.settings.config is running
    assert world.seen == []
    await at(20.0)  # told once, not every 2 s
    assert len(caplog.records) == 1
    world.in_place(good.replace("connection: 10s", "connection: 6s"))
    await at(23.0)
    assert "config_invalid" not in world.codes()
    assert world.settings.config.timeouts.connection == 6.0


async def test_a_limit_is_named_with_its_field(autojump_clock: trio.testing.MockClock,
                                               world: World) -> None:
    world.in_place(world.text_with(connection=20.0))
    await at(3.0)
    message = world.codes()["config_invalid"]
    assert "timeouts.connection" in message
    assert "15s" in message


async def test_an_empty_file_is_never_applied(autojump_clock: trio.testing.MockClock,
                                              world: World) -> None:
    world.in_place("")
    await at(5.0)
    assert world.seen == []
    assert "empty" in world.codes()["config_invalid"]


async def test_a_removed_file_or_a_folder_keeps_the_settings(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    text = world.path.read_text()
    running = world.settings.config
    await at(1.0)
    world.path.unlink()
    await at(3.0)
    assert "the file is gone" in world.codes()["config_missing"]
    world.path.mkdir()
    await at(9.0)
    assert "config_missing" in world.codes()
    assert world.settings.config is running
    world.path.rmdir()
    world.path.write_text(text)
    await at(12.0)
    assert "config_missing" not in world.codes()
    assert world.settings.config is running  # the same text: nothing to apply
    # and a settings change writes the file again after it was removed
    world.path.unlink()
    await at(15.0)
    cfg = world.settings.config
    await world.settings.update(attrs.evolve(cfg, timeouts=attrs.evolve(cfg.timeouts,
                                                                        connection=4.0)))
    assert world.path.exists()
    await at(18.0)
    assert "config_missing" not in world.codes()


async def test_sighup_reads_at_once(autojump_clock: trio.testing.MockClock,
                                    world: World) -> None:
    await at(0.1)
    world.in_place(world.text_with(connection=3.0))
    world.watcher.hangup()
    await at(0.2)
    assert world.settings.config.timeouts.connection == 3.0


async def test_restart_fields_say_so(autojump_clock: trio.testing.MockClock,
                                     world: World) -> None:
    cfg = world.settings.config
    world.in_place(dump_config_yaml(attrs.evolve(
        cfg, api=attrs.evolve(cfg.api, port=4321, require_auth=True))))
    await at(3.0)
    codes = world.codes()
    assert codes["config_reloaded"] == ("config.yaml reloaded: api (api.port apply at the "
                                        "next start)")
    assert "api.port" in codes["restart_required"]
    assert world.settings.config.api.require_auth is True


async def test_a_write_takes_in_a_hand_edit_first(autojump_clock: trio.testing.MockClock,
                                                  world: World) -> None:
    """A settings change made before the watcher saw a hand edit does not undo it."""
    await at(1.0)
    world.in_place(world.text_with(connection=7.0))
    cfg = world.settings.config
    await world.settings.edit(lambda c: attrs.evolve(
        c, health_checks=attrs.evolve(c.health_checks, interval=9.0)))
    assert world.settings.config.timeouts.connection == 7.0
    assert world.settings.config.health_checks.interval == 9.0
    assert cfg.timeouts.connection == 10.0
    assert world.history() == [("api", ("health_checks", "timeouts")), ("file", ("timeouts",))]
    assert world.codes()["config_reloaded"] == "config.yaml reloaded: timeouts"
    await at(10.0)
    assert world.watcher.reloads == 1


async def test_a_write_replaces_an_invalid_edit_and_keeps_it(
        autojump_clock: trio.testing.MockClock, world: World) -> None:
    await at(1.0)
    world.in_place("api:\n  prot: 1\n")
    await at(3.0)
    assert "config_invalid" in world.codes()
    await world.settings.edit(lambda c: attrs.evolve(
        c, health_checks=attrs.evolve(c.health_checks, interval=9.0)))
    [kept] = world.settings.file.history.entries()
    assert world.settings.file.history.read(kept.id) == "api:\n  prot: 1\n"
    await at(6.0)
    assert "config_invalid" not in world.codes()
