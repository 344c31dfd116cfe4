"""S12 (issue 33): multi-turn conversations across two computers, on real llama.cpp.

Two SmolLM2 servers (1 thread, 2 slots each) behind two ``sluice serve`` node gateways, a
third gateway balancing over them (bench/multiturn_cluster.py). U users at once, each a
conversation: a shared system prompt (~350 words), a private document (~250 words), then
turns of ~40 words, each re-sending the history, 16 tokens answered
(bench/multiturn_texts.py, bench/multiturn_workload.py). Measured at the client, through
the balancing gateway: the time to first token of every turn after the first (p50, p90),
the share of prompt tokens the servers reused, the gateway's affinity mix, for every
strategy and for an oracle (user i pinned by hand to node i % 2: sent straight to that
node's gateway). The whole cluster is started afresh for every strategy, so each starts
cold (but at smoke size, which judges no figure: one cluster, its balancer of the one
strategy, runs the oracle first, then that strategy). Controls (``--controls``): negative
(every request a new conversation sharing no prefix; cache-aware against least-loaded)
and hotspot (one conversation sending most requests; each server's share of requests and
of busy time). Figures and targets:
bench/multiturn_report.py.

    flock /tmp/sluice-cpu.lock .venv/bin/python bench/multiturn.py --controls --rounds 1
    .venv/bin/python bench/multiturn.py --smoke --controls --json /tmp/s12.json

Also ``scripts/bench --scenarios S12`` (with ``--rounds``, ``--smoke``, ``--json``). Needs
the llama extra (xllamacpp) and the demo GGUF (fetched once into ``.cache/models/`` as the
e2e tests do, or ``--gguf PATH``). Standard library only; Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import multiturn_report as report
from bench import multiturn_workload as workload
from bench.multiturn_cluster import Cluster
from bench.run import write_result

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("oracle", "round-robin", "least-loaded", "cache-aware")
RUN_DEADLINE_S = 900.0  # one strategy's whole load, bounded
SMOKE = {"users": [2], "turns": [2], "strategies": ["oracle", "cache-aware"],
         "max_tokens": 4, "scale": 0.1, "negative": (2, 1), "hotspot": (2, 1, 2)}
FULL = {"negative": (4, 3), "hotspot": (3, 1, 6)}  # (users, requests); (fan-out, others, turns)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", default="4,8", help="users at once, one run each (4,8)")
    ap.add_argument("--turns", default="6,5", help="turns per conversation, one per --users")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="the balancing gateway's strategies, and 'oracle' (by hand)")
    ap.add_argument("--controls", action="store_true",
                    help="also the negative and hotspot controls")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="the texts' sizes, times the issue's (system ~350 words, document "
                         "~250, turns ~40)")
    ap.add_argument("--context", type=int, default=4096, help="llama.cpp context, all slots")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny: 2 users, 2 turns, the oracle then cache-aware on one cluster, "
                         "texts a tenth of "
                         "the size, 4 tokens (the controls tiny too); exit 1 unless every "
                         "request was answered")
    ap.add_argument("--gguf", type=Path, default=None, help="the SmolLM2 GGUF to serve")
    ap.add_argument("--json", type=Path, default=None,
                    help="where to write every figure (default bench/results/s12.json, "
                         "s12-smoke.json for --smoke)")
    return ap


def gguf_path(given: Path | None) -> Path:
    if given is not None:
        return given
    from proxy.demo import ensure_demo_model

    cache = Path(os.environ.get("SLUICE_TEST_CACHE", ROOT / ".cache"))
    return ensure_demo_model(cache)


def _lean(records: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The records as kept in the JSON: the server's short name, the answer's length only."""
    return [{**{k: v for k, v in r.items() if k != "answer"},
             "served_by": labels.get(str(r["served_by"]), r["served_by"]),
             "answer_chars": len(r.get("answer") or "")} for r in records]


def run_strategy(gguf: Path, opts: argparse.Namespace, strategy: str, users: int,
                 turns: int, shared: Cluster | None = None
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One strategy's run on a fresh cluster (or on ``shared``, the smoke run's one cluster,
    already warm, its balancer of ``strategy`` unless that is the oracle): its turn records
    and the gateway's view."""
    if shared is not None:
        return _run_on(shared, opts, strategy, users, turns)
    with Cluster(gguf, "round-robin" if strategy == report.ORACLE else strategy,
                 opts.context) as c:
        c.warm_up()
        return _run_on(c, opts, strategy, users, turns)


def _run_on(c: Cluster, opts: argparse.Namespace, strategy: str, users: int, turns: int
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if strategy == report.ORACLE:
        records = workload.conversations(c.node_target, c.node_label, users, turns,
                                         opts.max_tokens, RUN_DEADLINE_S, opts.scale)
        view: dict[str, Any] = {}
    else:
        if c.strategy != strategy:
            raise RuntimeError(f"{strategy} asked of a cluster balancing by {c.strategy}")
        records = workload.conversations(lambda u: c.target(), lambda u: "balancer",
                                         users, turns, opts.max_tokens, RUN_DEADLINE_S,
                                         opts.scale)
        view = c.gateway_view()
    return _lean(records, c.labels()), {"started_s": c.started_s, **view}


def run_controls(gguf: Path, opts: argparse.Namespace, shapes: dict[str, Any]
                 ) -> dict[str, Any]:
    """Both controls, each on fresh clusters: their records and figures."""
    n_users, n_requests = shapes["negative"]
    negative: dict[str, Any] = {"users": n_users, "requests": n_requests, "records": {}}
    for strategy in ("least-loaded", "cache-aware"):
        with Cluster(gguf, strategy, opts.context) as c:
            c.warm_up()
            got = workload.negative(c.target(), n_users, n_requests, opts.max_tokens,
                                    RUN_DEADLINE_S, opts.scale)
            negative["records"][strategy] = _lean(got, c.labels())
        print(f"S12 negative {strategy}: {len(got)} requests", file=sys.stderr)
    fan_out, others, turns = shapes["hotspot"]
    with Cluster(gguf, "cache-aware", opts.context) as c:
        c.warm_up()
        got, wall = workload.hotspot(c.target(), fan_out, others, turns, opts.max_tokens,
                                     RUN_DEADLINE_S, opts.scale)
        hot_records = _lean(got, c.labels())
    print(f"S12 hotspot: {len(got)} requests in {wall:.1f} s", file=sys.stderr)
    return {"negative": negative,
            "hotspot": {"strategy": "cache-aware", "fan_out": fan_out, "others": others,
                        "turns": turns, "wall_s": round(wall, 2), "records": hot_records}}


def summarise_controls(raw: dict[str, Any]) -> dict[str, Any]:
    neg, hot = raw["negative"], raw["hotspot"]
    recs = hot["records"]
    return {
        "negative": {"users": neg["users"], "requests": neg["requests"],
                     "by_strategy": {s: report.measure(r, later_only=False)
                                     for s, r in neg["records"].items()}},
        "hotspot": {**{k: v for k, v in hot.items() if k != "records"},
                    "requests": len(recs),
                    "hot_share": round(sum(1 for r in recs if r["hot"]) / (len(recs) or 1), 3),
                    "servers": report.busy(recs, hot["wall_s"]),
                    "figures": report.measure(recs, later_only=False)},
    }


def problems_of(runs: list[dict[str, Any]], controls: dict[str, Any] | None) -> list[str]:
    out = []
    for run in runs:
        want = run["users"] * run["turns"]
        bad = [r for r in run["records"] if r["status"] != 200 or not r["done"]
               or r["ttft_s"] is None]
        if len(run["records"]) != want or bad:
            out.append(f"S12 {run['strategy']} {run['users']}x{run['turns']} round "
                       f"{run['round'] + 1}: {len(run['records']) - len(bad)}/{want} turns "
                       f"answered {[(r['user'], r['turn'], r['error']) for r in bad][:3]}")
    if controls:
        for name, part in (("negative", controls["negative"]["records"]),
                           ("hotspot", {"cache-aware": controls["hotspot"]["records"]})):
            for strategy, recs in part.items():
                bad = [r for r in recs if r["status"] != 200 or not r["done"]]
                if bad or not recs:
                    out.append(f"S12 {name} {strategy}: {len(bad)} of {len(recs)} failed")
    return out


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    if importlib.util.find_spec("xllamacpp") is None:
        print("S12 needs the llama extra (xllamacpp)", file=sys.stderr)
        return 2
    shapes = dict(FULL)
    if opts.smoke:
        opts.users, opts.turns = SMOKE["users"], SMOKE["turns"]
        opts.strategies, opts.max_tokens, opts.rounds = SMOKE["strategies"], 4, 1
        opts.scale = SMOKE["scale"]
        shapes = {"negative": SMOKE["negative"], "hotspot": SMOKE["hotspot"]}
    else:
        opts.users, opts.turns = _ints(opts.users), _ints(opts.turns)
        opts.strategies = [s.strip() for s in opts.strategies.split(",") if s.strip()]
    if len(opts.users) != len(opts.turns):
        parser().error("--users and --turns need as many values each")
    out_path = opts.json or ROOT / "bench" / "results" / (
        "s12-smoke.json" if opts.smoke else "s12.json")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    began = time.monotonic()
    gguf = gguf_path(opts.gguf)
    runs: list[dict[str, Any]] = []
    raw_controls: dict[str, Any] | None = None
    balanced = [s for s in opts.strategies if s != report.ORACLE]
    try:
        for n in range(max(1, opts.rounds)):
            with contextlib.ExitStack() as stack:
                shared = None
                if opts.smoke and len(balanced) <= 1:  # one cluster: the oracle, then it
                    shared = stack.enter_context(Cluster(
                        gguf, balanced[0] if balanced else "round-robin", opts.context))
                    shared.warm_up()
                for users, turns in zip(opts.users, opts.turns, strict=True):
                    # each round in another order, so that no strategy gains from its place
                    order = opts.strategies[n % len(opts.strategies):] + \
                        opts.strategies[:n % len(opts.strategies)]
                    for strategy in order:
                        records, view = run_strategy(gguf, opts, strategy, users, turns,
                                                     shared)
                        runs.append({"strategy": strategy, "users": users, "turns": turns,
                                     "round": n, "records": records, "gateway": view})
                        f = report.measure(records)
                        print(f"S12 {users}x{turns} round {n + 1} {strategy:12}: p50 "
                              f"{f['ttft_p50_s']} s, p90 {f['ttft_p90_s']} s, reused "
                              f"{f['reused_share']}, {f['affinity']}", file=sys.stderr)
            if opts.controls:
                got = run_controls(gguf, opts, shapes)
                if raw_controls is None:
                    raw_controls = got
                else:  # pooled over rounds
                    for s, recs in got["negative"]["records"].items():
                        raw_controls["negative"]["records"][s] += recs
                    raw_controls["hotspot"]["records"] += got["hotspot"]["records"]
                    raw_controls["hotspot"]["wall_s"] += got["hotspot"]["wall_s"]
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    tables = [report.strategy_table(users, turns, {
        s: report.measure([r for run in runs if (run["users"], run["turns"], run["strategy"])
                           == (users, turns, s) for r in run["records"]])
        for s in opts.strategies}) for users, turns in zip(opts.users, opts.turns, strict=True)]
    controls = summarise_controls(raw_controls) if raw_controls else None
    met = report.judge(tables, controls)
    problems = problems_of(runs, raw_controls)
    md = report.markdown(tables, controls, met, max(1, opts.rounds))
    result = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": opts.smoke,
                       "rounds": max(1, opts.rounds), "users": opts.users,
                       "turns": opts.turns, "strategies": opts.strategies,
                       "max_tokens": opts.max_tokens, "context": opts.context,
                       "gguf": str(gguf), "cpus": os.cpu_count(),
                       "machine": platform.platform(), "python": platform.python_version(),
                       "wall_s": round(time.monotonic() - began, 1)},
              "tables": tables, "controls": controls, "met": met, "problems": problems,
              "table": md, "runs": runs, "control_records": raw_controls}
    return write_result(out_path, result, md, problems, opts.smoke)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
