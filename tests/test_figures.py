"""The figures recorder and scripts/figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.figures import Figures, percentile
from tests.show_figures import main, table


def test_kinds_and_merge(tmp_path: Path) -> None:
    path = tmp_path / "figures.json"
    path.write_text(json.dumps({"figures": {"old": {"kind": "count", "value": 1}}}))
    f = Figures()
    f.count("tried", 3)
    f.count("tried")
    for v in (5.0, 1.0, 3.0, 2.0, 4.0):
        f.sample("ms", v)
    f.peak("attempts", 1)
    f.peak("attempts", 2)
    f.peak("attempts", 1)
    f.note("lan", {"runs": 2, "byte_exact": 2})
    f.write(path)
    doc = json.loads(path.read_text())["figures"]
    assert doc["old"]["value"] == 1  # kept from an earlier run
    assert doc["tried"]["value"] == 4
    assert doc["ms"]["value"] == {"n": 5, "p50": 3.0, "p99": 5.0, "max": 5.0}
    assert doc["attempts"]["value"] == 2
    assert doc["lan"]["value"] == {"runs": 2, "byte_exact": 2}
    assert doc["tried"]["measured"].endswith("Z")
    text = table(json.loads(path.read_text()))
    assert "| tried | 4 |" in text
    assert "| ms | p50 3.0, p99 5.0, max 5.0 (n=5) |" in text


def test_percentile() -> None:
    assert percentile([1.0], 0.99) == 1.0
    assert percentile([float(i) for i in range(1, 101)], 0.5) == 50.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_show_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/figures runs tests/show_figures.py's main (here in process)."""
    path = tmp_path / "f.json"
    f = Figures()
    f.count("crashes", 0)
    f.write(path)
    assert main([str(path)]) == 0
    assert "| crashes | 0 |" in capsys.readouterr().out
    assert main([str(tmp_path / "none.json")]) == 1
    assert "no figures yet" in capsys.readouterr().err


def test_workers_figures_merge_like_one_run(tmp_path: Path) -> None:
    """pytest-xdist's workers each record their share; the controller's merge writes what
    one process recording everything would (tests/workers.py)."""
    one, first, second = Figures(), Figures(), Figures()
    for i, share in enumerate([first, second, first, second, second]):
        for f in (one, share):
            f.count("tried", i + 1)
            f.sample("ms", float(10 - i))
            f.peak("attempts", [3, 1, 2, 5, 4][i])
    for f in (one, second):
        f.note("lan", {"runs": 2})
    merged = Figures()
    for share in (first, second):
        merged.merge(json.loads(json.dumps(share.raw())))  # as xdist hands it over
    assert merged.entries() == one.entries()
    assert merged.entries()["tried"]["value"] == 15
    assert merged.entries()["ms"]["value"] == {"n": 5, "p50": 8.0, "p99": 10.0, "max": 10.0}
    assert merged.entries()["attempts"]["value"] == 5
    merged.write(tmp_path / "f.json")
    assert json.loads((tmp_path / "f.json").read_text())["figures"]["tried"]["value"] == 15
