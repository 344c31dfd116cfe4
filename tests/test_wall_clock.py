"""The gateway's one wall clock (proxy/timestamps.py): swapped once with use_wall_clock, it
is the clock of a request record's ``startedAt``, an event's ``at``, a pairing code's expiry
and a config-history file's name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from proxy.observe.access_log import AccessLog
from proxy.observe.feed import encode_frame
from proxy.observe.reports import Reports
from proxy.timestamps import now_iso, use_wall_clock, wall
from tests.test_exchange import FakeSource, context, run

MOMENT = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.fixture
def stopped_wall_clock() -> Iterator[None]:
    previous = use_wall_clock(lambda: MOMENT)
    try:
        yield
    finally:
        use_wall_clock(previous)


def test_the_clock_swaps_and_comes_back() -> None:
    previous = use_wall_clock(lambda: MOMENT)
    try:
        assert (wall(), now_iso()) == (MOMENT, "2023-11-14T22:13:20Z")
    finally:
        assert use_wall_clock(previous)() == MOMENT
    assert wall() != MOMENT


async def test_records_events_and_history_read_the_one_wall_clock(
        tmp_path: Path, stopped_wall_clock: None) -> None:
    ctx = context(tmp_path)
    ctx = attrs.evolve(ctx, reports=Reports(AccessLog(), ctx.hub))
    seen: list[tuple[str, float, Any]] = []
    ctx.hub.subscribe(lambda kind, at, data: seen.append((kind, at, data)),
                      ("request", "pairing"))

    await run(ctx, FakeSource(b"GET", b"/v1/models", []))
    ctx.hub.drain()
    (entry,) = ctx.request_log.query()
    assert entry["startedAt"] == "2023-11-14T22:13:20.000Z"
    kind, at, _ = seen.pop()
    assert kind == "request"
    assert MOMENT <= at < MOMENT + 1  # started, plus its duration on trio's clock

    issued = ctx.pairing.issue()
    assert issued["expiresAt"] == "2023-11-14T22:18:20Z"  # five minutes on
    kind, at, data = seen.pop()
    assert (kind, at) == ("pairing", MOMENT)
    assert json.loads(encode_frame(kind, at, data))["at"] == "2023-11-14T22:13:20.000Z"

    await ctx.settings.edit(lambda cfg: attrs.evolve(
        cfg, observability=attrs.evolve(cfg.observability, request_log_size=7)))
    assert [p.name for p in (tmp_path / "config-history").iterdir()] == [
        "20231114T221320.000Z-api.yaml"]
