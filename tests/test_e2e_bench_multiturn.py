"""S12's harness cannot rot (bench/multiturn.py, issue 33): a smoke run on real llama.cpp
(two SmolLM2 servers behind two node gateways and a balancing gateway; 2 users, 2 turns,
the oracle and cache-aware, short texts, 4 tokens) must answer every turn, and its report
must hold every figure with sane values: positive TTFTs, counted tokens, tokens reused on
the second turn under cache-aware, the affinity the gateway reported. Never a wall-clock
threshold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_e2e_llama import gguf  # noqa: F401 (fixture)

pytest.importorskip("xllamacpp")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_multiturn_smoke(tmp_path: Path, gguf: Path) -> None:  # noqa: F811
    out = tmp_path / "s12.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "multiturn.py"), "--smoke",
                           "--gguf", str(gguf), "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["smoke"] is True
    assert result["problems"] == []
    assert result["meta"]["strategies"] == ["oracle", "cache-aware"]
    runs = result["runs"]
    assert sorted(r["strategy"] for r in runs) == ["cache-aware", "oracle"]
    for run in runs:
        records = run["records"]
        assert sorted((r["user"], r["turn"]) for r in records) == [(0, 1), (0, 2), (1, 1),
                                                                  (1, 2)]
        for r in records:
            assert (r["status"], r["done"], r["error"]) == (200, True, None), r
            assert 0 < r["ttft_s"] <= r["total_s"], r
            assert r["prompt_tokens"] > 0, r
            assert 0 < r["completion_tokens"] <= 4, r
            assert r["cached_tokens"] is not None, r
            assert r["served_by"] in ("a", "b", "local:llama-a", "local:llama-b"), r
        first = {r["user"]: r["served_by"] for r in records if r["turn"] == 1}
        if run["strategy"] == "oracle":  # pinned by hand: user i on node i % 2
            assert first == {0: "local:llama-a", 1: "local:llama-b"}
            assert all(r["affinity"] is None for r in records)
        else:  # through the balancing gateway, which saw both nodes
            assert set(run["gateway"]["routing_stats"]["nodes"][0]) >= {"fingerprint"}
            assert all(r["affinity"] in ("hit", "session", "miss", "spill") for r in records)
            assert len(run["gateway"]["request_log"]) == len(records)
            for r in records:
                if r["turn"] == 2:  # its history is warm on the server it went back to
                    assert r["served_by"] == first[r["user"]], records
                    assert r["affinity"] == "hit", r
                    assert r["cached_tokens"] > 0, r
    [table] = result["tables"]
    assert (table["users"], table["turns"]) == (2, 2)
    for name, f in table["by_strategy"].items():
        assert (f["measured"], f["answered"], f["failed"]) == (2, 2, []), (name, f)
        assert f["ttft_p50_s"] > 0
        assert f["ttft_p90_s"] >= f["ttft_p50_s"]
        assert 0 < f["reused_share"] <= 1, (name, f)
    assert table["by_strategy"]["oracle"]["p50_vs_oracle"] == 1.0
    assert table["by_strategy"]["cache-aware"]["p50_vs_oracle"] is not None
    assert set(result["met"]) == {"2 users"}
    assert "| 2 x 2 | cache-aware |" in result["table"]
