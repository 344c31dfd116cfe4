"""Several gateways side by side in one run: the gateway CPU per request (S1, S2) or per
stream (S3, S4) of each, over interleaved rounds, as medians and as ratios to the first.

Each gateway is ``sluice serve`` run from its own source tree (PYTHONPATH), e.g. a git
worktree of an older commit, so that "before" and "after" are measured in the same minutes
of this shared, noisy machine; ``:WARNING`` sets its log level, ``:watch`` adds one
live-events subscriber and a /metrics scrape a second while it runs (bench/watch.py).

    .venv/bin/python bench/compare.py --rounds 8 --scenarios S1,S3 \\
        before=/work/wt-old after=$PWD watched=$PWD::watch

Standard library only (with bench/run.py); Linux only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import run as bench


def _spec(text: str) -> tuple[str, str, str, bool]:
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    if not name or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH[:LEVEL][:watch], got {text!r}")
    level = parts[1] if len(parts) > 1 and parts[1] else "INFO"
    return name, parts[0], level, "watch" in parts[2:]


def _start(kids: bench.Children, tmp: Path, mock: dict[str, Any], name: str, path: str,
           level: str, watch: bool) -> dict[str, Any]:
    data, sockdir, port = tmp / name, tmp / f"s{name}", bench.free_port()
    data.mkdir(mode=0o700)
    sockdir.mkdir(mode=0o700)
    (data / "config.yaml").write_text(f"api:\n  port: {port}\nlocal:\n  socket_dir: {sockdir}\n"
                                      f"{bench.mock_backends(mock)}")
    log = tmp / f"{name}.log"
    sluice = Path(sys.executable).parent / "sluice"
    proc = kids.start(name, [str(sluice), "serve", "--data-dir", str(data), "--log-level", level],
                      log, env=dict(os.environ, PYTHONPATH=path), cwd=str(tmp))
    gw = {"pid": proc.pid, "proc": proc, "log": log, "tcp": f"127.0.0.1:{port}",
          "unix": str(sockdir / "sluice.sock")}
    for tr in ("tcp", "unix"):
        bench.wait_models({tr: gw[tr]}, bench.MOCK_MODELS, proc, name, log)
    return {**gw, "pids": bench.with_descendants(proc.pid), "procs": [(name, gw)],
            "watch": watch}


def _scaled(params: dict[str, Any], scale: float) -> dict[str, Any]:
    out = dict(params)
    if "count" in out:
        out["count"] = max(1, round(out["count"] * scale))
    if "duration_s" in out:
        out["duration_s"] = out["duration_s"] * scale
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--scenarios", default="S1,S3")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply each round's count or duration (the CPU figures from /proc "
                         "are in 10 ms ticks: a longer round reads them finer)")
    ap.add_argument("gateways", nargs="+", type=_spec, help="NAME=PATH[:LEVEL][:watch]")
    opts = ap.parse_args(argv)
    scenarios = [s.strip().upper() for s in opts.scenarios.split(",") if s.strip()]
    if any(s not in ("S1", "S2", "S3", "S4") for s in scenarios):
        ap.error("scenarios: S1, S2, S3, S4")
    kids = bench.Children()
    tmp = Path(tempfile.mkdtemp(prefix="slc-", dir="/tmp"))
    env: dict[str, Any] = {"mock": bench.start_mock(kids, tmp)}
    try:
        for name, path, level, watch in opts.gateways:
            env[name] = _start(kids, tmp, env["mock"], name, path, level, watch)
        for name, *_ in opts.gateways:  # warm-up, not recorded
            bench.measure(env, name, "unix", {"stream": False, "concurrency": 8, "count": 400})
        cpu: dict[tuple[str, str, str], list[float]] = {}
        for sc in scenarios:
            for turn in range(max(1, opts.rounds)):
                names = [name for name, *_ in opts.gateways]
                names = names[turn % len(names):] + names[:turn % len(names)]  # who goes first
                for tr in ("tcp", "unix"):
                    for name in names:
                        r = bench.measure(env, name, tr, _scaled(bench.SCENARIOS[sc],
                                                                 opts.scale))
                        done = max(r["load"]["completed"], 1)
                        cpu.setdefault((sc, tr, name), []).append(1000 * r["proxy_cpu_s"] / done)
        first = opts.gateways[0][0]
        print("| scenario | transport | gateway | CPU ms per request/stream (median) | "
              "ratio to " + first + " | rounds |")
        print("|---|---|---|---|---|---|")
        for (sc, tr, name), values in cpu.items():
            base = statistics.median(cpu[(sc, tr, first)])
            mid = statistics.median(values)
            runs = ", ".join(f"{v:.3f}" for v in values)
            print(f"| {sc} | {tr} | {name} | {mid:.3f} | {mid / base:.3f} | {runs} |")
    finally:
        kids.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
