"""The benchmark harness itself cannot rot: a smoke run of every scenario must pass.

It checks correctness only (S6: every body byte-identical to the direct one; every request
and stream delivered whole), never a wall-clock figure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="the benchmark needs node")
def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = subprocess.run([str(ROOT / "scripts" / "bench"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["smoke"] is True
    assert result["s6"]["all_equal"] is True, result["s6"]
    assert result["checks"]["all_complete"] is True, result["checks"]["problems"]
    assert result["checks"]["problems"] == []
    runs = result["runs"]
    assert {r["scenario"] for r in runs} == {"S1", "S2", "S3", "S4", "S5"}
    assert {r["transport"] for r in runs} == {"tcp", "unix"}
    assert {r["target"] for r in runs} == {"direct", "sluice"}
    for r in runs:
        load = r["load"]
        assert load["completed"] == load["started"] > 0, (r["scenario"], r["target"], load)
        assert load["missing_streams"] == 0
        assert len(load["digests"]) == 1
