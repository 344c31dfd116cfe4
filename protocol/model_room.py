"""Which loaded models to unload so that one more model fits (SPEC §11, models on demand).

Managed llama.cpp servers are loaded when a request needs them, within a memory budget
(bytes) and at most ``max_loaded`` of them at once (0 = no count limit). Before it loads a
model, the lifecycle owner asks :func:`make_room` which loaded models to unload first. The
answer is :class:`Room` (unload these, possibly none) or :class:`NoRoom` (the model cannot
fit even with every idle model unloaded: 503 ``model_memory_exhausted``, worded by
:func:`no_room_message`).

A model with a request in flight, or one that is loading or unloading (``busy``), is pinned:
never chosen, its memory counted as used. An unloading model's memory is freed only when it
is gone, so the caller waits for it and asks again. The idle models are taken least recently
used first (ties by name) until the new model fits: the shortest such prefix, not the
smallest set that would fit (no knapsack), so recently used models stay loaded.

Decisions only, no I/O: sizes, counts and clock values in, a value out. The memory budget's
``auto`` setting is :func:`memory_budget_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from protocol.config.schema import AUTO_BUDGET


@dataclass(frozen=True, slots=True)
class Loaded:
    """A model whose server holds memory: loaded, loading or unloading."""

    name: str
    memory: int  # bytes: its estimate until loaded, then its server's measured RSS
    in_flight: int  # requests in flight to it
    last_used: float  # monotonic clock value of its last use
    busy: bool = False  # loading or unloading: counted, never chosen


@dataclass(frozen=True, slots=True)
class Room:
    """The model fits once these models are unloaded (least recently used first)."""

    unload: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NoRoom:
    """The model cannot fit even with every idle model unloaded.

    ``reason`` is ``"memory"`` when the budget is short (even if the count is too), else
    ``"count"``. ``pinned_bytes`` and ``pinned_count`` are what the pinned models hold.
    """

    model: str
    estimate: int
    budget: int
    max_loaded: int
    pinned_bytes: int
    pinned_count: int
    reason: Literal["memory", "count"]


def is_pinned(model: Loaded) -> bool:
    """Whether a model may not be unloaded for room: in use, loading or unloading."""
    return model.busy or model.in_flight > 0


def make_room(name: str, estimate: int, loaded: Iterable[Loaded], *, budget: int,
              max_loaded: int) -> Room | NoRoom:
    """What to unload so that model ``name`` (``estimate`` bytes) fits beside the others.

    Already fitting, or ``name`` already among ``loaded``: ``Room(())``. The answer does
    not depend on the order of ``loaded``.
    """
    models = list(loaded)
    if any(m.name == name for m in models):
        return Room()

    def fits(used: int, count: int) -> bool:
        return used + estimate <= budget and (max_loaded <= 0 or count + 1 <= max_loaded)

    used = sum(m.memory for m in models)
    count = len(models)
    idle = sorted((m for m in models if not is_pinned(m)), key=lambda m: (m.last_used, m.name))
    unload: list[str] = []
    for model in idle:
        if fits(used, count):
            break
        unload.append(model.name)
        used -= model.memory
        count -= 1
    if fits(used, count):
        return Room(tuple(unload))
    # Every idle model is unloaded here: what is left is what the pinned ones hold.
    return NoRoom(model=name, estimate=estimate, budget=budget, max_loaded=max_loaded,
                  pinned_bytes=used, pinned_count=count,
                  reason="memory" if used + estimate > budget else "count")


def format_bytes(n: int) -> str:
    """A size for people: ``"512 B"``, ``"1.5 KiB"``, ``"3.0 MiB"``, ``"1.2 GiB"``."""
    for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if round(n / unit, 1) >= 1:
            return f"{n / unit:.1f} {suffix}"
    return f"{n} B"


def no_room_message(no_room: NoRoom) -> str:
    """The message of the 503 ``model_memory_exhausted`` answer."""
    need = f"model '{no_room.model}' needs an estimated {format_bytes(no_room.estimate)}"
    if no_room.reason == "count":
        return (f"model '{no_room.model}' cannot be loaded: max_loaded is "
                f"{no_room.max_loaded} and {no_room.pinned_count} loaded models are in use")
    if no_room.estimate > no_room.budget:
        return f"{need}, more than the memory budget of {format_bytes(no_room.budget)}"
    return (f"{need}; the memory budget is {format_bytes(no_room.budget)} and "
            f"{format_bytes(no_room.pinned_bytes)} is held by models in use")


def memory_budget_bytes(setting: int, physical_ram: int) -> int:
    """The memory budget in bytes from ``model_loading.memory_budget`` as the config holds
    it: ``AUTO_BUDGET`` (0, written ``auto``) is 75% of ``physical_ram`` (rounded down),
    anything else a byte count as given."""
    if setting == AUTO_BUDGET:
        return physical_ram * 3 // 4
    return setting
