"""The access keys' owner (proxy/access/key_store.py): immutable records replaced on change, and
every write (a key's use included) under the settings' one writer, computed from the keys
as they are then."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import yaml

from proxy.access.key_store import AccessKey
from proxy.settings.store import Settings
from proxy.timestamps import use_wall_clock

NOON = 1_750_000_000.0  # 2025-06-15T15:06:40Z


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    previous = use_wall_clock(lambda: NOON)
    yield Settings.open(tmp_path / "data")
    use_wall_clock(previous)


def slow_writes(settings: Settings, writes: list[str]) -> None:
    """File work takes a second of the (mock) clock, so other tasks run meanwhile."""

    async def in_thread(work: Callable[..., Any], *args: Any) -> Any:
        writes.append(getattr(work, "__name__", "?"))
        await trio.sleep(1)
        return work(*args)

    settings.in_thread = in_thread


def on_disk(settings: Settings) -> dict[str, Any]:
    stored = yaml.safe_load(settings.secrets_path.read_text())["access_keys"]
    assert len(stored) == 1
    entry: dict[str, Any] = stored[0]
    return entry


async def test_a_key_record_is_never_changed_in_place(settings: Settings) -> None:
    made, _ = await settings.keys.add("phone", {"rpm": 10})
    held_tuple = settings.keys.all
    held = held_tuple[0]
    assert held is made
    changed = await settings.keys.update(made.id, {"name": "tablet", "rpm": None,
                                                   "models": ["qwen*"]})
    assert changed is not None
    # The reader's record and tuple are as they were read.
    assert (held["name"], held.get("rpm"), held.limits.rpm) == ("phone", 10, 10)
    assert "models" not in held
    assert held_tuple == (held,)
    # The store holds a new record.
    assert settings.keys.all == (changed,)
    assert (changed["name"], changed.get("rpm"), changed["models"]) == \
        ("tablet", None, ("qwen*",))
    assert changed.limits.models == ("qwen*",)
    # A use is a new record too.
    await settings.keys.used(made.id)
    assert changed["last_used_at"] is None
    assert settings.keys.all[0]["last_used_at"] == "2025-06-15T15:06:40Z"
    # Nothing a reader gets can change the store's record.
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        held.id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        held["name"] = "other"  # type: ignore[index]
    copy = held.stored()
    copy["name"] = "other"
    assert held["name"] == "phone"
    assert isinstance(settings.keys.all[0]["models"], tuple)
    assert "hash" not in repr(held)
    assert held["hash"] not in repr(held)


async def test_a_stored_entry_is_written_back_as_it_was(settings: Settings) -> None:
    entry = {"name": "by hand", "id": "ak-1", "hash": "h", "models": ["a", "b*"], "note": [1]}
    settings.keys.load([entry])
    await settings.save_secrets()
    assert settings.keys.stored() == [entry]
    assert list(on_disk(settings)) == ["name", "id", "hash", "models", "note"]
    assert AccessKey.of(entry) == {**entry, "models": ("a", "b*")}  # read like the entry


@pytest.mark.parametrize("first", ["use", "update"])
async def test_a_use_and_an_update_at_once_both_stay(
        settings: Settings, autojump_clock: trio.testing.MockClock, first: str) -> None:
    made, _ = await settings.keys.add("phone")
    writes: list[str] = []
    slow_writes(settings, writes)

    async def use() -> None:
        await settings.keys.used(made.id)

    async def update() -> None:
        await settings.keys.update(made.id, {"name": "tablet", "rpm": 5})

    async with trio.open_nursery() as nursery:
        for task in ((use, update) if first == "use" else (update, use)):
            nursery.start_soon(task)
            await trio.testing.wait_all_tasks_blocked()
    key = settings.keys.all[0]
    assert (key["name"], key.get("rpm"), key["last_used_at"]) == \
        ("tablet", 5, "2025-06-15T15:06:40Z")
    stored = on_disk(settings)
    assert (stored["name"], stored["rpm"], stored["last_used_at"]) == \
        ("tablet", 5, "2025-06-15T15:06:40Z")
    assert len(writes) == 2


async def test_uses_in_one_minute_write_once_and_wait_for_no_write(
        settings: Settings, autojump_clock: trio.testing.MockClock) -> None:
    made, _ = await settings.keys.add("phone")
    writes: list[str] = []
    slow_writes(settings, writes)
    done: list[float] = []

    async def use() -> None:
        await settings.keys.used(made.id)
        done.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(use)
    assert len(writes) == 1
    # Only the first use waited for the write; the others returned at once.
    assert sorted(done) == [start] * 4 + [start + 1]


async def test_a_use_not_saved_is_logged_and_shown(
        settings: Settings, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    made, _ = await settings.keys.add("phone")
    before = settings.secrets_path.read_bytes()

    def full(path: Path, data: bytes, mode: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("proxy.settings.store.atomic_write", full)
    await settings.keys.used(made.id)
    assert settings.keys.all[0]["last_used_at"] == "2025-06-15T15:06:40Z"
    assert settings.secrets_path.read_bytes() == before
    assert "cannot record an access key's use in secrets.yaml: No space left on device" \
        in caplog.text
