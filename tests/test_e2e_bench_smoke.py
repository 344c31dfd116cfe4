"""The benchmark harness itself cannot rot: a smoke run of every scenario must pass.

It checks correctness only (S6: every body byte-identical to the direct one; every request
and stream delivered whole; S7: S3's and S5's loads went through gateway A to gateway B and
nowhere else; S8: its held streams all delivered and every figure there; S9 and S10, where
the llama extra is installed: cold requests answered by the managed model and by its floor,
for the bundled engine and for S9CMD's command, and the idle gateways' catalogues (run by
tests/test_e2e_bench_smoke_models.py); S11: the Ollama chat streams and their SSE twins all
whole, and their figures there; S3T: the translated streams and their relayed twins whole;
S7TLS, run on its own: S1's and S3's loads through gateway A -> gateway B over the plain link
and over the pinned TLS link, every answer B's, the pinned one on B's node port), never a
wall-clock figure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


CORE = "S1,S2,S3,S4,S5,S6,S7,S8,S11,S3T"  # this file's; the model servers' (S9, S9CMD,
# S10) are tests/test_e2e_bench_smoke_models.py's, so the two halves run on two workers


def smoke(tmp_path: Path, scenarios: str, timeout: int = 600) -> dict[str, Any]:
    """``scripts/bench --smoke --scenarios ...``: its JSON, after it exited 0."""
    out = tmp_path / "smoke.json"
    proc = subprocess.run([str(ROOT / "scripts" / "bench"), "--smoke", "--scenarios", scenarios,
                           "--json", str(out)], capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["meta"]["smoke"] is True
    return result


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="the benchmark needs node")
def test_bench_smoke(tmp_path: Path) -> None:
    result = smoke(tmp_path, CORE)
    assert result["s6"]["all_equal"] is True, result["s6"]
    assert result["checks"]["all_complete"] is True, result["checks"]["problems"]
    assert result["checks"]["problems"] == []
    runs = result["runs"]
    assert {r["scenario"] for r in runs} == {"S1", "S2", "S3", "S4", "S5"}
    assert {r["transport"] for r in runs} == {"tcp", "unix"}
    assert {r["target"] for r in runs} == {"direct", "sluice", "forwarded"}
    for r in runs:
        load = r["load"]
        assert load["completed"] == load["started"] > 0, (r["scenario"], r["target"], load)
        assert load["missing_streams"] == 0
        assert len(load["digests"]) == 1
    check_s7(result)
    check_s8(result)
    check_s11(result)
    check_s3t(result)
    assert result["s9"] is result["s9cmd"] is result["s10"] is None  # not asked here


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="the benchmark needs node")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="S7TLS needs root and iproute2 (network namespaces)")
def test_bench_smoke_s7tls(tmp_path: Path) -> None:
    """S7TLS (issue 34) at smoke size: A -> B twice, plain and pinned, both transports."""
    result = smoke(tmp_path, "S7TLS", timeout=360)
    assert result["meta"]["scenarios"] == ["S7TLS"]
    assert result["checks"]["problems"] == []
    assert result["s7tls_skipped"] is None
    s7 = result["s7tls"]
    node_b = s7["node_b"]
    # A "pinned" holds B by its certificate; A "plain" by URL and key.
    assert s7["nodes_a"]["plain"] == [{"fingerprint": node_b, "link": "plain", "pin": None}]
    [pinned] = s7["nodes_a"]["pinned"]
    assert (pinned["fingerprint"], pinned["link"]) == (node_b, "pinned")
    assert pinned["pin"].startswith("sha256:")
    runs = s7["runs"]
    assert {(r["shape"], r["transport"], r["link"]) for r in runs} == {
        (sh, tr, link) for sh in ("S1", "S3", "S3 paced") for tr in ("tcp", "unix")
        for link in ("plain", "pinned")}
    for r in runs:
        load = r["load"]
        assert load["completed"] == load["started"] > 0, (r["shape"], r["link"], load)
        assert load["missing_streams"] == 0
        assert load["served_by"] == {f"node:{node_b}": load["completed"]}
        assert r["a_cpu_s"] > 0
        assert r["b_cpu_s"] > 0
        # B received the requests on the port of the link: TLS on its node port for the
        # pinned A, its API port for the plain one; over connections already open.
        got = r["b_bytes_in"]
        port, other = ("node_port", "api_port") if r["link"] == "pinned" else \
            ("api_port", "node_port")
        assert got[port] >= 100 * load["completed"], (r["link"], got)
        assert got[other] < got[port], (r["link"], got)
    assert set(s7["by_load"]) == {f"{sh}/{tr}" for sh in ("S1", "S3", "S3 paced")
                                  for tr in ("tcp", "unix")}
    for entry in s7["by_load"].values():
        assert entry["complete"] is True
        assert entry["bodies_equal"] is True  # plain's and pinned's bodies: one digest
        assert entry["served_by_b"] is True
        assert entry["through_link_port"] is True
        assert entry["rounds"] == 1
        for name in ("cpu_ratio", "cpu_ratio_a", "cpu_ratio_b"):
            assert entry[name] > 0, (name, entry)
        assert entry["added_ms"]["lat_p50"] is not None
        for link in ("plain", "pinned"):
            assert entry["median"][link]["cpu_us"] > 0
    assert s7["by_load"]["S3/tcp"]["median"]["pinned"]["cpu_us_per_chunk"] > 0
    assert s7["by_load"]["S1/tcp"]["median"]["pinned"]["cpu_us_per_chunk"] is None
    assert isinstance(s7["target_met"], bool)
    hs = s7["handshake"]
    assert set(hs["cpu_us"]) == set(hs["wall_us"]) == {
        "plain", "pinned", "plain fresh", "pinned fresh"}
    assert all(v > 0 for v in [*hs["cpu_us"].values(), *hs["wall_us"].values()])
    assert hs["connects"] == {"plain": 1, "pinned": 1}  # the reused pools kept one each
    assert hs["handshake_cpu_us"] is not None
    assert "| S1 | tcp |" in result["table"]


def check_s7(result: dict[str, Any]) -> None:
    """S7: S3's and S5's loads went through gateway A -> gateway B whole, with bodies equal to
    direct's, every answer served by B (``x-sluice-served-by: node:<B>``), and the two
    gateways' routing counters agree (each forwarded attempt reached B once, none failed)."""
    runs = result["runs"]
    s7 = result["s7"]
    node_b = s7["node_b"]
    forwarded = [r for r in runs if r["target"] == "forwarded"]
    assert {(r["scenario"], r["transport"]) for r in forwarded} == {
        (sc, tr) for sc in ("S3", "S5") for tr in ("tcp", "unix")}
    for r in forwarded:
        load = r["load"]
        assert load["completed"] == load["started"] > 0, (r["scenario"], load)
        assert load["missing_streams"] == 0
        assert load["served_by"] == {f"node:{node_b}": load["completed"]}, load["served_by"]
        assert set(r["part_cpu_s"]) == {"a", "b"}
    for r in runs:
        if r["target"] == "sluice":
            assert all(by.startswith("local:") for by in r["load"]["served_by"]), r["load"]
    for tr in ("tcp", "unix"):
        assert result["s6"]["by_target"][f"{tr}/forwarded"]["equal"] is True, result["s6"]
    assert set(s7["by_shape"]) == {"S3/tcp", "S3/unix", "S5/tcp", "S5/unix"}
    for entry in s7["by_shape"].values():
        assert entry["complete"] is True
        assert entry["bodies_equal"] is True
    ends = s7["distributed_status_a"]["endpoints"]
    assert [(e["fingerprint"], e["status"]) for e in ends] == [(node_b, "online")]
    a, b = s7["routing_stats_a"], s7["routing_stats_b"]
    [node] = a["nodes"]
    assert node["fingerprint"] == node_b
    assert node["failureCount"] == node["abortedCount"] == node["activeRequests"] == 0
    assert a["failovers"] == 0
    assert a["local"]["totalRequests"] == 0  # A has no backend: everything went to B
    assert b["nodes"] == []
    assert b["local"]["totalRequests"] == node["totalRequests"] == node["successCount"]


def check_s8(result: dict[str, Any]) -> None:
    """S8 (held streams, tiny sizes): every N, transport and target ran and delivered every
    stream whole; the gateway's figures (idle and peak RSS, RSS per stream, CPU per chunk,
    gap ratio to direct) and the issue's three judgements are all there."""
    s8 = result["s8"]
    ns = s8["n"]
    assert len(ns) >= 2
    assert ns == sorted(ns)
    runs = s8["runs"]
    assert {(r["transport"], r["n"], r["target"]) for r in runs} == {
        (tr, n, tg) for tr in ("tcp", "unix") for n in ns for tg in ("direct", "sluice")}
    for r in runs:
        f = r["figures"]
        assert f["completed"] == f["started"] == r["n"], (r["transport"], r["target"], f)
        assert f["missing_streams"] == f["missing_chunks"] == 0
        assert len(r["load"]["digests"]) == 1
        if r["target"] == "sluice":
            assert f["idle_rss_mb"] > 0
            assert f["peak_rss_mb"] >= f["idle_rss_mb"]
            assert f["kb_per_stream"] is not None
            assert f["cpu_us_per_chunk"] is not None
            assert all(by.startswith("local:") for by in r["load"]["served_by"])
    for tr in ("tcp", "unix"):
        for n in ns:
            assert s8["summary"][f"{tr}/{n}/sluice"]["gap_p99_vs_direct"] is not None
        judged = s8["judged"][f"{tr}/sluice"]
        assert judged["delivered"] is True
        assert set(judged["met"]) == {"cpu_per_chunk", "delivered_gap", "rss_per_stream"}
        assert judged["cpu_per_chunk_growth"] is not None
    assert s8["problems"] == []


def check_s3t(result: dict[str, Any]) -> None:
    """S3T: each translated stream (Messages, Responses) and its relayed twin ran over each
    transport, every answer whole and checked, and each ratio there (no verdict at smoke
    size)."""
    s3t = result["s3t"]
    assert s3t["problems"] == []
    assert {(r["transport"], r["target"]) for r in s3t["runs"]} == {
        (tr, tg) for tr in ("tcp", "unix") for tg in s3t["targets"]}
    for tr in ("tcp", "unix"):
        entry = s3t["summary"][tr]
        assert entry["complete"] is True
        for tg in ("messages", "responses"):
            assert entry[tg]["cpu_ratio"] > 0, (tr, tg, entry)


def check_s9(result: dict[str, Any]) -> None:
    """S9 (cold start): the floor (llama.cpp started with the gateway's own command line for
    its model server) and the gateway over each transport each answered a cold streamed
    request whole, with a first token; the gateway's answers came from the managed model."""
    s9 = result["s9"]
    argv = s9["server_argv"]
    assert {"proxy.models.launcher", "--listen", "--parent"} <= set(argv), argv
    check_cold_runs(s9, "unix", ["listening_ms"])
    for r in s9["runs"]:
        if r["target"] == "floor":
            assert r["retries"] == 0, r


def check_cold_runs(s9: dict[str, Any], floor_transport: str, floor_needs: list[str]
                    ) -> None:
    """S9's and S9CMD's runs: the floor over ``floor_transport`` and the gateway over each
    transport each answered a cold streamed request whole, with a first token and every
    figure (``floor_needs`` the floor's own); the gateway's from the managed model."""
    runs = s9["runs"]
    assert {(r["target"], r["transport"]) for r in runs} == {
        ("floor", floor_transport), ("sluice", "tcp"), ("sluice", "unix")}
    for r in runs:
        assert (r["status"], r["done"]) == (200, True), r
        assert r["events"] >= 1, r
        needed = ["first_token_ms", "spawn_ms", "from_spawn_ms"]
        if r["target"] == "sluice":
            assert r["served_by"] == f"local:{s9['model']}", r
            needed += ["gateway_load_ms", "gateway_cpu_ms"]
        else:
            needed += floor_needs
        assert all(r[key] is not None for key in needed), r
    assert set(s9["summary"]) == {"floor", "sluice/tcp", "sluice/unix"}
    for key in ("sluice/tcp", "sluice/unix"):
        assert s9["summary"][key]["added_ms"] is not None
        assert s9["summary"][key]["added_paired_ms"] is not None
    assert s9["problems"] == []


def check_s9cmd(result: dict[str, Any]) -> None:
    """S9CMD (cold start of a command model): the floor ran the gateway's own child's command
    line (the configured command with its placeholders filled in, only the port its own),
    waited for /health and answered; the gateway over each transport answered from the
    managed model; every figure is there."""
    s9 = result["s9cmd"]
    argv, cmd = s9["server_argv"], s9["command"]
    assert "${MODEL}" in cmd, cmd
    assert "${PORT}" not in " ".join(argv), argv
    port = argv.index("--listen") + 1
    assert argv[:port] + argv[port + 1:] == [
        s9["gguf"] if a == "${MODEL}" else s9["model"] if a == "${NAME}" else a
        for i, a in enumerate(cmd) if i != port], (cmd, argv)
    assert argv[port].startswith("127.0.0.1:")
    check_cold_runs(s9, "tcp", ["healthy_ms"])
    for r in s9["runs"]:
        if r["target"] == "floor":
            assert r["health_polls"] >= 1, r
            assert 0 < r["healthy_ms"] <= r["first_token_ms"], r


def check_s10(result: dict[str, Any]) -> None:
    """S10 (idle RSS): each smoke gateway listed its catalogue (nothing, nothing, two
    unloaded models), was one process (nothing loaded), and has an RSS figure."""
    s10 = result["s10"]
    assert s10["configs"] == ["no-folder", "0", "2"]
    assert [(r["config"], r["listed"], r["processes"]) for r in s10["runs"]] == [
        ("no-folder", 0, 1), ("0", 0, 1), ("2", 2, 1)]
    assert all(r["rss_mb"] > 0 for r in s10["runs"])
    assert s10["added_vs_none_mb"] is not None
    assert s10["added_vs_no_folder_mb"] is not None
    assert s10["problems"] == []


def check_s11(result: dict[str, Any]) -> None:
    """S11 (the Ollama API): every target and transport ran, each stream whole (NDJSON: the
    mock's text in 100 lines, the last one done; SSE: equal to direct's), and the figures
    are there: CPU per stream through the gateway, TTFL, the ratio and the difference."""
    s11 = result["s11"]
    runs = s11["runs"]
    assert {(r["transport"], r["target"]) for r in runs} == {
        (tr, tg) for tr in ("tcp", "unix") for tg in ("direct", "v1", "ollama")}
    for r in runs:
        assert r["completed"] == r["started"] == r["count"] > 0, r
        assert r["errors"] == {}, r
        assert r["ttfl_p50"] is not None
        assert r["lines"] == s11["shape"]["chunks"] + (1 if r["target"] != "ollama" else 0)
        if r["target"] == "direct":
            assert r["cpu_ms_per_stream"] is None
        else:
            assert r["cpu_ms_per_stream"] is not None
        if r["target"] != "ollama":
            assert len(r["digests"]) == 1
    for tr in ("tcp", "unix"):
        entry = s11["summary"][tr]
        assert entry["complete"] is True
        for target in ("v1", "ollama"):  # (a ratio needs v1's CPU above one clock tick)
            assert entry["median"][target]["cpu_ms_per_stream"] is not None
        assert "cpu_ratio" in entry
        assert entry["ttfl_added_ms"] is not None
        assert set(entry["met"]) == {"cpu", "ttfl"}
    assert s11["problems"] == []
