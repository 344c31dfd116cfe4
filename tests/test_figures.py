"""The figures recorder and scripts/figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.figures import Figures, percentile
from tests.show_figures import table

ROOT = Path(__file__).resolve().parent.parent


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


def test_scripts_figures(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    f = Figures()
    f.count("crashes", 0)
    f.write(path)
    shown = subprocess.run([str(ROOT / "scripts" / "figures"), str(path)], capture_output=True,
                           text=True, check=True)
    assert "| crashes | 0 |" in shown.stdout
    missing = subprocess.run([sys.executable, str(ROOT / "tests" / "show_figures.py"),
                              str(tmp_path / "none.json")], capture_output=True, text=True)
    assert missing.returncode == 1
    assert "no figures yet" in missing.stderr
