"""A request sent the moment a streamed answer ends, against the real llama.cpp (issue 21):
its time to first token, and how many such requests fail, for each gateway given (source
trees, e.g. a git worktree of an older commit) and for a direct client, in interleaved
rounds.

llama.cpp closes its connection after every streamed answer while announcing keep-alive, so
the direct client opens a fresh connection for every request (what a client that knows this
does: the cost of a connection is in its figures). Each gateway is asked over one keep-alive
connection (Unix socket), as agents and chat front ends do: a streamed answer, then at once
the next streamed request, whose time from sending to its first body byte is measured.

    .venv/bin/python bench/after_stream.py --rounds 3 --cycles 60 \\
        before=/tmp/wt-before after=$PWD

Needs the demo GGUF (``.cache/models/``, fetched by the e2e tests or ``scripts/serve``'s
data folder: ``--model PATH``). Standard library only (with bench/run.py); Linux only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import run as bench

MODEL = "smollm2-135m"
GGUF = Path(__file__).resolve().parent.parent / ".cache" / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "stream": True, "max_tokens": max_tokens,
                       "temperature": 0, "messages": [{"role": "user", "content": "Say hi"}]}
                      ).encode()


def start_llama(kids: bench.Children, tmp: Path, model: Path) -> str:
    sock = tmp / "llama.sock"
    log = tmp / "llama.log"
    proc = kids.start("llama", [sys.executable, "-m", "proxy.models.launcher", "--model",
                                str(model), "--alias", MODEL, "--listen", str(sock),
                                "--context", "1024", "--parallel", "2", "--threads", "1"],
                      log, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("listening "):
        raise RuntimeError(f"llama.cpp did not start:\n{bench.tail(log)}")
    return str(sock)


def start_gateway(kids: bench.Children, tmp: Path, name: str, tree: str,
                  llama: str) -> dict[str, Any]:
    data, sockdir, port = tmp / name, tmp / f"s{name}", bench.free_port()
    data.mkdir(mode=0o700)
    sockdir.mkdir(mode=0o700)
    (data / "config.yaml").write_text(
        f"api:\n  port: {port}\nlocal:\n  socket_dir: {sockdir}\n"
        f"backends:\n  - name: llama\n    url: unix:{llama}\n")
    log = tmp / f"{name}.log"
    sluice = Path(sys.executable).parent / "sluice"
    proc = kids.start(name, [str(sluice), "serve", "--data-dir", str(data), "--log-level",
                             "WARNING"], log, env=dict(os.environ, PYTHONPATH=tree))
    gw = {"unix": str(sockdir / "sluice.sock")}
    bench.wait_models(gw, {MODEL}, proc, name, log)
    return gw


def connection(unix: str) -> http.client.HTTPConnection:
    return bench.UnixHTTPConnection(unix, 60)


def streamed(conn: http.client.HTTPConnection, max_tokens: int) -> tuple[int, float | None]:
    """Send a streamed request; its status and seconds to the first body byte (None when
    it failed), after reading the whole answer."""
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body(max_tokens),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.read1(65536)
    ttft = time.perf_counter() - start
    rest = resp.read()
    ok = resp.status == 200 and (first + rest).endswith(b"data: [DONE]\n\n")
    return resp.status, ttft if ok else None


def run_cycles(unix: str, cycles: int, fresh: bool) -> tuple[list[float], int]:
    """``cycles`` times: a stream, then at once the measured one. ``fresh``: a new
    connection per request (the direct client), else one for all."""
    times: list[float] = []
    failed = 0
    conn = connection(unix)
    try:
        for _ in range(cycles):
            for measured in (False, True):
                if fresh:
                    conn.close()
                    conn = connection(unix)
                try:
                    _status, ttft = streamed(conn, 1 if measured else 8)
                except (OSError, http.client.HTTPException):
                    ttft = None
                    conn.close()
                    conn = connection(unix)
                if ttft is None:
                    failed += 1
                elif measured:
                    times.append(ttft)
    finally:
        conn.close()
    return times, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--model", type=Path, default=GGUF)
    ap.add_argument("gateways", nargs="+", help="NAME=PATH of a source tree")
    args = ap.parse_args(argv)
    kids = bench.Children()
    with tempfile.TemporaryDirectory(prefix="sl-after-") as folder:
        try:
            return _run(kids, Path(folder), args)
        finally:
            kids.stop_all()


def _run(kids: bench.Children, tmp: Path, args: argparse.Namespace) -> int:
    llama = start_llama(kids, tmp, args.model)
    targets: dict[str, tuple[str, bool]] = {"direct": (llama, True)}
    for spec in args.gateways:
        name, _, tree = spec.partition("=")
        targets[name] = (start_gateway(kids, tmp, name, tree, llama)["unix"], False)
    times: dict[str, list[float]] = {name: [] for name in targets}
    failures = dict.fromkeys(targets, 0)
    for _ in range(args.rounds):
        for name, (unix, fresh) in targets.items():
            got, failed = run_cycles(unix, args.cycles, fresh)
            times[name] += got
            failures[name] += failed
    direct = statistics.median(times["direct"]) * 1000
    print(f"{args.rounds} rounds x {args.cycles} cycles (stream, then at once a streamed "
          "request, max_tokens 1): time to first body byte of the second, median")
    for name in targets:
        ms = statistics.median(times[name]) * 1000 if times[name] else float("nan")
        added = "" if name == "direct" else f", added {ms - direct:+.2f} ms"
        print(f"  {name:8} {ms:7.2f} ms{added}; failed {failures[name]} of "
              f"{args.rounds * args.cycles * 2} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
