"""S8 — held streams scale flat (issue 14): how the gateway's cost grows with the number of
streams it holds at once.

For each N in :data:`HELD_N`: N concurrent SSE streams (one keep-alive connection each, the
connections opened over :data:`RAMP_MS`), each one chunk every 200 ms for 10 s (50 chunks),
direct to the mock, through the gateway and through nginx (when present), interleaved per
round. Every proxied measurement gets a fresh proxy: a gateway made for S8 alone
(``api.max_connections`` raised to :data:`MAX_CONNECTIONS`, the main gateway keeps the
default 1024) or an nginx with room for 2 x 4000 connections and a deeper listen backlog. So
the idle RSS taken just before the load is a process that has never held more streams, and
(peak - idle) / N is what one held stream costs. (At smoke size, which judges no figure,
the gateways are all started at the beginning of the run, and there is no warm-up or rest
before the idle RSS.)

Figures per N and target: streams delivered complete / started, missing chunks, idle and
peak RSS, (peak - idle) / N, proxy CPU, CPU per relayed chunk (CPU / (completed x chunks)),
chunk gap p50/p99 and the p99's ratio to direct's in the same round. The issue's targets are
judged on the gateway's row; nginx's figures are for reference.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HELD_N = (250, 1000, 2000, 4000)
SHAPE = {"chunks": 50, "gap_ms": 200}
RAMP_MS = 1000  # load.js opens the N connections over this long (the same for every N)
SMOKE_N = (20, 40)
SMOKE_SHAPE = {"chunks": 10, "gap_ms": 20}
SMOKE_RAMP_MS = 50
MAX_CONNECTIONS = 8192  # the S8 gateway's api.max_connections: above 4000 plus headroom
NGINX_CONNECTIONS = 16384  # worker_connections: each proxied stream takes two
NGINX_BACKLOG = 4096
WARM_UP = {"stream": True, "concurrency": 8, "count": 40, "chunks": 5, "gap_ms": 0}

CPU_GROWTH_MAX = 1.10  # CPU per chunk at the largest N / at the smallest
GAP_P99_MAX_RATIO = 1.25  # gap p99 / direct's, same round, at the largest N
KB_PER_STREAM_MAX = 25.0  # (peak - idle RSS) / N at the largest N
TARGET_TEXT = (f"CPU/chunk at 4000 ≤ x{CPU_GROWTH_MAX:g} of 250's; 4000/4000 delivered, gap "
               f"p99 ≤ x{GAP_P99_MAX_RATIO:g} direct's; RSS ≤ {KB_PER_STREAM_MAX:g} KB/stream")


def _base() -> Any:
    """bench/run.py's helpers (imported here: run.py imports this module)."""
    from bench import run as base

    return base


def _stop(kids: Any, proc: dict[str, Any]) -> None:
    """Stop one proxy started for one measurement (its process group) and forget it."""
    popen: subprocess.Popen[bytes] = proc["proc"]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    kids.procs[:] = [(n, p) for n, p in kids.procs if p is not popen]


def _spawn_gateway(kids: Any, tmp: Path, mock: dict[str, Any], name: str) -> dict[str, Any]:
    """An S8 gateway started (not waited for)."""
    return dict(_base().spawn_gateway(kids, tmp, name, _base().mock_backends(mock),
                                      api_extra=f"  max_connections: {MAX_CONNECTIONS}\n"))


def _gateway_ready(gw: dict[str, Any]) -> dict[str, Any]:
    base = _base()
    for tr in ("tcp", "unix"):
        base.wait_models({tr: gw[tr]}, base.MOCK_MODELS, gw["proc"], "the S8 gateway",
                         gw["log"])
    return {**gw, "pids": base.with_descendants(gw["pid"]), "procs": [("sluice S8", gw)]}


def serials(transports: list[str], rounds: int, ns: tuple[int, ...],
            targets: list[str]) -> list[tuple[str, int, int, str, str]]:
    """Every measurement of S8 in its order: transport, round, N, target and the name of
    its fresh proxy's folder."""
    order = [(tr, rnd, n, tg) for tr in transports for rnd in range(rounds) for n in ns
             for tg in targets]
    return [(tr, rnd, n, tg, f"h{i}") for i, (tr, rnd, n, tg) in enumerate(order, 1)]


def targets_of(nginx: bool) -> list[str]:
    return ["direct", "sluice"] + (["nginx"] if nginx else [])


def prestart(kids: Any, tmp: Path, mock: dict[str, Any], transports: list[str],
             rounds: int, nginx: bool) -> dict[str, dict[str, Any]]:
    """At smoke size: every S8 gateway the run will measure, started at once (each still
    fresh when its turn comes: it holds no stream before its own load); by folder name."""
    return {name: _spawn_gateway(kids, tmp, mock, name)
            for _tr, _rnd, _n, tg, name in serials(transports, rounds, SMOKE_N,
                                                   targets_of(nginx)) if tg == "sluice"}


def _start_proxy(kids: Any, tmp: Path, mock: dict[str, Any], target: str,
                 name: str, started: dict[str, Any] | None = None) -> dict[str, Any]:
    if target == "sluice":
        return _gateway_ready(started or _spawn_gateway(kids, tmp, mock, name))
    nginx = _base().start_nginx(kids, tmp, mock, name=name, connections=NGINX_CONNECTIONS,
                                backlog=NGINX_BACKLOG)
    assert nginx is not None
    return dict(nginx)


def measure_one(kids: Any, tmp: Path, mock: dict[str, Any], target: str, transport: str,
                params: dict[str, Any], name: str, smoke: bool = False,
                started: dict[str, Any] | None = None) -> dict[str, Any]:
    """One measurement: a fresh proxy (unless direct; ``started``: the one :func:`prestart`
    started for it), a warm-up and a rest (not at smoke size, which judges no figure), the
    idle RSS, the load."""
    base = _base()
    env: dict[str, Any] = {"mock": mock}
    proxy = None
    if target != "direct":
        proxy = env[target] = _start_proxy(kids, tmp, mock, target, name, started)
    try:
        if not smoke:
            base.measure(env, target, transport, WARM_UP)  # lazy imports, first pool entries
        idle = None
        if proxy is not None:
            if not smoke:
                time.sleep(0.5)
            proxy["pids"] = base.with_descendants(proxy["pid"])
            idle = base.rss_bytes(proxy["pids"])
        run = base.measure(env, target, transport, params)
    finally:
        if proxy is not None:
            for _label, part in proxy["procs"]:
                _stop(kids, part)
    run["proxy_idle_rss_mb"] = None if idle is None else round(idle / 2**20, 2)
    return dict(run)


def figures(run: dict[str, Any], n: int, chunks: int) -> dict[str, Any]:
    load = run["load"]
    gap = load.get("gap_ms_stats") or {}
    cpu, peak, idle = run["proxy_cpu_s"], run["proxy_rss_mb"], run["proxy_idle_rss_mb"]
    done = load["completed"]
    return {
        "n": n, "started": load["started"], "completed": done,
        "missing_streams": load["missing_streams"], "missing_chunks": load["missing_chunks"],
        "idle_rss_mb": idle, "peak_rss_mb": peak,
        "kb_per_stream": None if idle is None else round((peak - idle) * 1024 / n, 2),
        "proxy_cpu_s": cpu,
        "cpu_us_per_chunk": None if cpu is None or not done else
        round(cpu * 1e6 / (done * chunks), 2),
        "gap_p50": gap.get("p50"), "gap_p99": gap.get("p99"),
        "mock_cpu_s": run["mock_cpu_s"], "client_cpu_s": load["client_cpu_s"],
        "wall_s": run["wall_s"],
    }


def run_s8(kids: Any, tmp: Path, mock: dict[str, Any], transports: list[str], rounds: int,
           smoke: bool, nginx: bool, started: dict[str, dict[str, Any]] | None = None
           ) -> dict[str, Any]:
    """Every measurement of S8, interleaved per round and N; returns the JSON section.
    ``started``: the smoke run's gateways, from :func:`prestart`."""
    ns, shape, ramp = (SMOKE_N, SMOKE_SHAPE, SMOKE_RAMP_MS) if smoke else \
        (HELD_N, SHAPE, RAMP_MS)
    targets = targets_of(nginx)
    runs: list[dict[str, Any]] = []
    for tr, rnd, n, tg, name in serials(transports, rounds, ns, targets):
        params = {"stream": True, "concurrency": n, "count": n, "ramp_ms": ramp, **shape}
        r = measure_one(kids, tmp, mock, tg, tr, params, name, smoke,
                        (started or {}).get(name) if tg == "sluice" else None)
        f = figures(r, n, shape["chunks"])
        runs.append({"scenario": "S8", "transport": tr, "round": rnd, "target": tg, "n": n,
                     "params": params, "figures": f, "load": r["load"]})
        print(f"S8 {tr:4} round {rnd + 1} N={n:<5} {tg:7}: {f['completed']}/"
              f"{f['started']} ok, gap p99 {f['gap_p99']} ms, proxy CPU "
              f"{f['proxy_cpu_s']} s ({f['cpu_us_per_chunk']} µs/chunk), RSS "
              f"{f['idle_rss_mb']} -> {f['peak_rss_mb']} MB", file=sys.stderr)
    summary = summarise(runs, transports, targets, ns)
    problems = [f"S8 {r['transport']} N={r['n']} {r['target']} round {r['round'] + 1}: "
                f"{r['load']['completed']}/{r['load']['started']} complete, "
                f"{r['load']['missing_chunks']} chunks missing {r['load']['errors']}"
                for r in runs if r["load"]["completed"] != r["load"]["started"]
                or r["load"]["missing_streams"] or r["load"]["timed_out"]]
    return {"n": list(ns), "shape": shape, "ramp_ms": ramp, "targets": targets,
            "max_connections": MAX_CONNECTIONS, "summary": summary["by_n"],
            "judged": summary["judged"], "problems": problems, "runs": runs}


def summarise(runs: list[dict[str, Any]], transports: list[str], targets: list[str],
              ns: tuple[int, ...]) -> dict[str, Any]:
    """Medians over rounds per (transport, N, target); ratios paired per round."""
    median = _base().median
    by_n: dict[str, Any] = {}
    judged: dict[str, Any] = {}
    for tr in transports:
        mine = [r for r in runs if r["transport"] == tr]
        fig = {(r["round"], r["n"], r["target"]): r["figures"] for r in mine}
        rounds = sorted({r["round"] for r in mine})
        for n in ns:
            for tg in targets:
                per = [fig[(k, n, tg)] for k in rounds if (k, n, tg) in fig]
                if not per:
                    continue
                s = {key: median([f[key] for f in per]) for key in per[0] if key != "n"}
                s["rounds"] = len(per)
                s["all_complete"] = all(f["completed"] == f["started"] == n and
                                        not f["missing_streams"] for f in per)
                s["gap_p99_vs_direct"] = median([
                    _ratio(fig[(k, n, tg)]["gap_p99"], fig[(k, n, "direct")]["gap_p99"])
                    for k in rounds if (k, n, tg) in fig and (k, n, "direct") in fig])
                by_n[f"{tr}/{n}/{tg}"] = s
        lo, hi = ns[0], ns[-1]
        for tg in targets[1:]:
            growth = median([_ratio(fig[(k, hi, tg)]["cpu_us_per_chunk"],
                                    fig[(k, lo, tg)]["cpu_us_per_chunk"])
                             for k in rounds if (k, hi, tg) in fig and (k, lo, tg) in fig])
            top = by_n.get(f"{tr}/{hi}/{tg}")
            if top is None:
                continue
            entry = {"n_low": lo, "n_high": hi, "cpu_per_chunk_growth": growth,
                     "delivered": top["all_complete"],
                     "gap_p99_vs_direct": top["gap_p99_vs_direct"],
                     "kb_per_stream": top["kb_per_stream"]}
            entry["met"] = {
                "cpu_per_chunk": growth is not None and growth <= CPU_GROWTH_MAX,
                "delivered_gap": bool(top["all_complete"]) and
                top["gap_p99_vs_direct"] is not None and
                top["gap_p99_vs_direct"] <= GAP_P99_MAX_RATIO,
                # Divided by N: only meaningful when all N were held.
                "rss_per_stream": None if not top["all_complete"] else
                top["kb_per_stream"] is not None and top["kb_per_stream"] <= KB_PER_STREAM_MAX,
            }
            judged[f"{tr}/{tg}"] = entry
    return {"by_n": by_n, "judged": judged}


def _ratio(x: Any, y: Any) -> float | None:
    return round(x / y, 3) if x is not None and y else None


def tables(s8: dict[str, Any], smoke: bool) -> str:
    """S8's two Markdown tables: the figures per N, and the issue's targets."""
    base = _base()
    fmt, markdown = base.fmt, base.markdown
    head = ["S8 N", "Transport", "Target", "Delivered", "Missing chunks", "Idle RSS",
            "Peak RSS", "(peak-idle)/N", "Proxy CPU", "CPU/chunk", "Gap p50", "Gap p99",
            "p99 / direct"]
    rows = []
    for key, s in s8["summary"].items():
        tr, n, tg = key.split("/")
        proxied = tg != "direct"
        rows.append([
            n, tr, tg, f"{fmt(s['completed'])}/{fmt(s['started'])}",
            fmt(s["missing_chunks"]),
            f"{fmt(s['idle_rss_mb'])} MB" if proxied else "",
            f"{fmt(s['peak_rss_mb'])} MB" if proxied else "",
            f"{fmt(s['kb_per_stream'])} KB" if proxied else "",
            f"{fmt(s['proxy_cpu_s'])} s" if proxied else "",
            f"{fmt(s['cpu_us_per_chunk'])} µs" if proxied else "",
            f"{fmt(s['gap_p50'])} ms", f"{fmt(s['gap_p99'])} ms",
            f"x{fmt(s['gap_p99_vs_direct'])}" if proxied else ""])
    judged_head = ["S8 target", "Transport", "Target", "CPU/chunk N-high / N-low",
                   "Delivered at N-high", "Gap p99 / direct at N-high",
                   "RSS/stream at N-high", "Issue target", "Met"]
    judged_rows = []
    for key, e in s8["judged"].items():
        tr, tg = key.split("/")
        met = "—"
        if tg == "sluice" and not smoke:
            missed = [name for name, ok in e["met"].items() if ok is False]
            unknown = [name for name, ok in e["met"].items() if ok is None]
            met = "met" if not missed else "not met: " + ", ".join(missed)
            if unknown:
                met += "; undetermined: " + ", ".join(unknown)
        judged_rows.append([
            f"S8 ({e['n_low']} -> {e['n_high']})", tr, tg,
            f"x{fmt(e['cpu_per_chunk_growth'])}", "all" if e["delivered"] else "INCOMPLETE",
            f"x{fmt(e['gap_p99_vs_direct'])}", f"{fmt(e['kb_per_stream'])} KB",
            TARGET_TEXT if tg == "sluice" else "", met])
    return str(markdown(head, rows)) + "\n\n" + str(markdown(judged_head, judged_rows))
