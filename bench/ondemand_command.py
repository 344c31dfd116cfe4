"""S9CMD — a user's own model server run on demand (SPEC §11.1, issue 35): cold start.

S9 (bench/ondemand.py) for a ``models:`` entry with a ``command``: the bundled launcher run as
a user's command would be, ``<python> -m proxy.models.launcher --model ${MODEL} --alias
${NAME} --listen 127.0.0.1:${PORT}`` with S9's settings (:data:`CONTEXT`, :data:`PARALLEL`,
:data:`THREADS`), ``path`` the demo GGUF and ``keep_alive: 0s``, so it is stopped right after
each answer. A sample is S9's: one streamed chat completion (``max_tokens`` 1) sent to the
gateway while the model is unloaded, timed from the request to its first token.

Its floor is the very same command run by hand: the command line the gateway ran (read from
``/proc/PID/cmdline`` of its child in a warm-up), only the port in ``--listen`` another free
one, started as ``proxy/models/command.py`` starts it (a new session, the same environment,
its output to a file), then ``GET /health`` tried every ``HEALTH_POLL`` (the gateway's own
interval, proxy/models/process.py) until it answers 200, then the same request; timed from
the process's start to the first token. Rounds interleave the floor and the gateway (over
each transport); before each sample the model is ``unloaded`` and no server runs. The
figures: medians over rounds, the gateway's median minus the floor's and the paired
differences' median; the target: the gateway's own delay within :data:`MAX_ADDED_MS`.

Linux only (``/proc``); needs the ``llama`` extra (``xllamacpp``) and the demo GGUF.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import ondemand

SCENARIO = "S9CMD"
CONTEXT, PARALLEL, THREADS = 2048, 2, 0  # S9's model's settings (the models: defaults)
MAX_ADDED_MS = 50.0
TARGET = f"first token ≤ floor + {MAX_ADDED_MS:g} ms"
HEALTH_TIMEOUT = 0.5  # one GET /health of the floor's


def _base() -> Any:
    from bench import run as base

    return base


def health_poll() -> float:
    """Seconds between the gateway's /health tries while a server loads (the floor's too)."""
    from proxy.models.process import HEALTH_POLL

    return HEALTH_POLL


def command(smoke: bool = False) -> list[str]:
    """The entry's ``command``: the bundled launcher, as a user would write it (at smoke
    size with S9's smoke thread count, :data:`bench.ondemand.SMOKE_THREADS`)."""
    threads = ondemand.SMOKE_THREADS if smoke else THREADS
    return [sys.executable, "-m", "proxy.models.launcher", "--model", "${MODEL}",
            "--alias", "${NAME}", "--listen", "127.0.0.1:${PORT}", "--context", str(CONTEXT),
            "--parallel", str(PARALLEL), "--threads", str(threads)]


def start_command_gateway(kids: Any, tmp: Path, gguf: Path, name: str, smoke: bool = False
                          ) -> dict[str, Any]:
    """A gateway whose one model is the GGUF served by :func:`command` (``keep_alive: 0s``),
    no backends, no models folder; ready once it lists the model on both listeners."""
    base = _base()
    rest = (f"models:\n  - name: {ondemand.MODEL}\n    path: {json.dumps(os.fspath(gguf))}\n"
            f"    command: {json.dumps(command(smoke))}\n    keep_alive: 0s\n"
            "model_loading:\n  dirs: []\n")
    gw = base.spawn_gateway(kids, tmp, name, rest)
    for tr in ("tcp", "unix"):
        base.wait_models({tr: gw[tr]}, {ondemand.MODEL}, gw["proc"], "the S9CMD gateway",
                         gw["log"], timeout=60.0)
    return dict(gw)


def floor_argv(gateway_argv: list[str], port: int) -> list[str]:
    """The gateway's command line for its model server, listening on ``port`` instead."""
    argv = list(gateway_argv)
    argv[argv.index("--listen") + 1] = f"127.0.0.1:{port}"
    return argv


def _healthy(address: str) -> bool:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=HEALTH_TIMEOUT)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False  # refused while it loads (the launcher listens once it has loaded)
    finally:
        conn.close()


def cold_floor(kids: Any, argv: list[str], log: Path) -> dict[str, Any]:
    """The command run by hand and asked the request once its /health answers 200:
    milliseconds from the process's start to that 200 and to the first token."""
    base = _base()
    address = argv[argv.index("--listen") + 1]
    poll = health_poll()
    with log.open("ab") as out:  # as command.py starts it: its own session, output kept
        boot0, t0 = ondemand.boot_seconds(), time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=base.tree_env())
    kids.procs.append(("floor", proc))  # stopped below, or with the rest on the way out
    res: dict[str, Any] = {"health_polls": 0}
    try:
        deadline = t0 + ondemand.REQUEST_TIMEOUT
        while True:
            res["health_polls"] += 1
            if _healthy(address):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the floor's server did not answer /health (exit "
                                   f"{proc.returncode}):\n{base.tail(log)}")
            time.sleep(poll)
        res["healthy_ms"] = round((time.monotonic() - t0) * 1000, 2)
        start = ondemand.started_at(proc.pid)
        res["spawn_ms"] = None if start is None else round((start - boot0) * 1000, 1)
        res.update(ondemand.first_token({"tcp": address}, t0))
    finally:
        ondemand._stop(kids, proc)
    return ondemand._after_spawn(res)


def run_s9cmd(kids: Any, tmp: Path, transports: list[str], rounds: int, smoke: bool = False
              ) -> dict[str, Any]:
    """S9CMD's samples, interleaved per round (the floor, then the gateway over each
    transport), after one warm-up of each (not recorded: page cache, the command line). At
    smoke size the floor has no warm-up and the gateway's is its Unix sample (S9's way)."""
    base = _base()
    gguf = ondemand.demo_gguf()
    gw = start_command_gateway(kids, tmp, gguf, "c9cmd", smoke)
    floor_log = tmp / "floor-cmd.log"
    runs: list[dict[str, Any]] = []
    try:
        warm = ondemand.cold_via_gateway(gw, "unix")
        argv = warm.pop("server_argv")
        if warm["first_token_ms"] is None or not argv:
            raise RuntimeError(f"S9CMD warm-up failed: {warm}\n{base.tail(gw['log'])}")
        argv = floor_argv(argv, base.free_port())
        if not smoke:
            cold_floor(kids, argv, floor_log)
        for rnd in range(rounds):
            for tg, tr in [("floor", "tcp"), *(("sluice", t) for t in transports)]:
                r = cold_floor(kids, argv, floor_log) if tg == "floor" else \
                    warm if ondemand.smoke_sample(smoke, rnd, tg, tr) else \
                    ondemand.cold_via_gateway(gw, tr)
                r.pop("server_argv", None)
                runs.append({"scenario": SCENARIO, "round": rnd, "target": tg,
                             "transport": tr, **r})
                print(f"S9CMD round {rnd + 1} {tg:6} {tr:4}: first token "
                      f"{r['first_token_ms']} ms (process started {r['spawn_ms']:+} ms, "
                      + (f"health 200 at {r['healthy_ms']} ms after {r['health_polls']} "
                         "tries" if tg == "floor" else
                         f"load {r['gateway_load_ms']} ms") + ")", file=sys.stderr)
    finally:
        ondemand._stop(kids, gw["proc"])
    result = ondemand.summarise_s9(runs, transports, argv, gguf, max_added_ms=MAX_ADDED_MS,
                                   floor_key="healthy_ms")
    return {**result, "command": command(smoke), "health_poll_s": health_poll()}


def table(s: dict[str, Any], smoke: bool) -> str:
    base = _base()
    fmt = base.fmt
    head = ["S9CMD cold start", "Transport", "First token (median)", "vs floor",
            "Server process started", "First token after it started", "Ready",
            "Gateway CPU", "Rounds", "Issue target", "Met"]
    rows = ondemand.cold_rows(s["summary"], smoke, TARGET,
                              floor=("floor (the command by hand)", "tcp"),
                              ready=lambda e: f"/health 200 at {fmt(e['healthy_ms'])} ms")
    return base.markdown(head, rows)  # type: ignore[no-any-return]
