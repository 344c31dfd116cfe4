"""S9 and S10 — models on demand (issue 22): what a managed model costs before it is loaded.

**S9, cold start.** One managed model (the demo GGUF, SmolLM2-135M, a ``models:`` entry with
``keep_alive: 0s``, so it is unloaded right after each answer) behind a gateway of its own.
Each sample is one streamed chat completion (``max_tokens`` :data:`MAX_TOKENS`) sent to the
gateway while the model is unloaded, timed from the request to its first token: the first
SSE event whose delta carries content. Its floor: the same llama.cpp server started directly,
the way ``proxy/models/servers.py`` starts it (the very command line the gateway ran, read
from ``/proc`` in the warm-up; only ``--listen``, a socket in a folder of its own, and
``--parent`` differ), and asked the same request once, timed from the process's start to the
first token. Rounds interleave the floor and the gateway (over each transport); between
samples the model's server is gone (its state ``unloaded`` and no child process left). The
figure is the median over rounds of each, and the gateway's median minus the floor's (and
the paired differences' median). Also recorded: the floor's time to its ``listening`` line,
the gateway's own ``model ... loaded in`` time from its log, and when (clock tick
resolution, 10 ms) the model server's process started after the request was sent.

**S10, idle RSS with a catalogue.** Fresh gateways (:data:`CONFIGS`), started in turn per
round: one with no folder to scan (``model_loading.dirs: []``, so no managed model can
exist), and ones with the default ``models`` folder holding 0 (no folder), 1, 2 or
:data:`CATALOGUE` links to the GGUF, none loaded. The gateway's RSS once it is idle: it lists
its models, answers a few requests of the listing kind, rests :data:`SETTLE_S` and is
sampled :data:`RSS_SAMPLES` times; the median of those. The figures: medians over rounds,
and the differences of the medians (20 - none, 20 - 1, 20 - no folder).

Linux only (``/proc``); needs the ``llama`` extra (``xllamacpp``) and the demo GGUF (fetched
once into ``.cache/`` like the tests'; ``$SLUICE_TEST_CACHE`` elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import importlib.util
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

MODEL = "cold"
MAX_TOKENS = 1
PROMPT = [{"role": "user", "content": "Name three colours."}]
REQUEST_TIMEOUT = 60.0  # one cold request, load included
UNLOAD_TIMEOUT = 30.0  # after an answer, until the server is gone (keep_alive 0s, SIGTERM)
FLOOR_RETRIES = 50  # 503s (loading) the floor's one request may meet, 10 ms apart
CATALOGUE = 20  # S10: models in the big catalogue
NO_FOLDER = "no-folder"  # S10: a gateway that can have no managed model (dirs: [])
# S10's gateways: no folder to scan, then the default models folder with that many models
# (0: no such folder; 2: the second GGUF header read is where the step is, see
# docs/performance.md).
CONFIGS = (NO_FOLDER, "0", "1", "2", str(CATALOGUE))
SETTLE_S = 1.0  # S10: rest before sampling the idle RSS
RSS_SAMPLES = 5  # S10: samples 100 ms apart, their median
LISTING_CALLS = 3  # S10: GET /v1/models and status calls before the rest
SMOKE_CONFIGS = (NO_FOLDER, "0", "2")  # at smoke size: started at once, no rest, 1 sample
CHILD_POLL = 0.005  # S9: how often the gateway's new child is looked for (until found)
# S9's and S9CMD's model at smoke size: llama.cpp on one thread (the default, 0, is every
# core, each spinning: on a shared 2-core machine a cold start then costs 2-4x the CPU).
SMOKE_THREADS = 1

COLD_MAX_ADDED_MS = 300.0
RSS_MAX_ADDED_MB = 2.0
S9_TARGET = f"first token ≤ floor + {COLD_MAX_ADDED_MS:g} ms"
S10_TARGET = f"{CATALOGUE} unloaded models ≤ none + {RSS_MAX_ADDED_MB:g} MB"
LOADED_RE = re.compile(rf"model {MODEL} loaded in ([0-9.]+)s")


def _base() -> Any:
    """bench/run.py's helpers (imported here: run.py imports this module)."""
    from bench import run as base

    return base


def unavailable() -> str | None:
    """Why S9 and S10 cannot run here (None: they can)."""
    if importlib.util.find_spec("xllamacpp") is None:
        return "the llama extra (xllamacpp) is not installed: scripts/install test,dev,llama"
    return None


@functools.cache
def demo_gguf() -> Path:
    """The demo GGUF, fetched once into the tests' cache (``.cache/`` or
    ``$SLUICE_TEST_CACHE``); checked (its sha256) once a run."""
    from proxy.demo import ensure_demo_model

    base = _base()
    return Path(ensure_demo_model(Path(os.environ.get("SLUICE_TEST_CACHE",
                                                      base.ROOT / ".cache"))))


def chat_body() -> bytes:
    return json.dumps({"model": MODEL, "messages": PROMPT, "max_tokens": MAX_TOKENS,
                       "stream": True}).encode()


def boot_seconds() -> float:
    """Now on the clock /proc's process start times count from (CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in CLOCK_BOOTTIME seconds (clock-tick resolution)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return float(int(fields[19]) / _base().CLK)


# -- one streamed request, timed -------------------------------------------------------------

def connect(target: dict[str, str], timeout: float) -> http.client.HTTPConnection:
    base = _base()
    if "unix" in target:
        return base.UnixHTTPConnection(target["unix"], timeout)  # type: ignore[no-any-return]
    host, port = target["tcp"].split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def first_token(target: dict[str, str], t0: float) -> dict[str, Any]:
    """POST the chat request to ``target``; milliseconds from ``t0`` (time.monotonic) to the
    answer's head and to its first token, and how the answer went (status, ``[DONE]``,
    events, served by)."""
    conn = connect(target, REQUEST_TIMEOUT)
    out: dict[str, Any] = {"status": None, "head_ms": None, "first_token_ms": None,
                           "done": False, "events": 0, "served_by": None}
    try:
        conn.request("POST", "/v1/chat/completions", body=chat_body(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["head_ms"] = round((time.monotonic() - t0) * 1000, 2)
        out["status"] = resp.status
        out["served_by"] = resp.getheader("x-sluice-served-by")
        if resp.status != 200:
            out["error"] = resp.read(2000).decode("utf-8", "replace")
            return out
        for _ in range(10_000):  # bounded: max_tokens 1 is a handful of events
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out["done"] = True
                break
            out["events"] += 1
            if out["first_token_ms"] is None and _has_content(data):
                out["first_token_ms"] = round((time.monotonic() - t0) * 1000, 2)
        resp.read()
    finally:
        conn.close()
    return out


def _has_content(data: bytes) -> bool:
    try:
        choices = json.loads(data).get("choices") or []
    except ValueError:
        return False
    return any(isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in choices)


# -- S9: the gateway's side ------------------------------------------------------------------

def start_cold_gateway(kids: Any, tmp: Path, gguf: Path, name: str, smoke: bool = False
                       ) -> dict[str, Any]:
    """A gateway whose one model is the GGUF as a ``models:`` entry (defaults but
    ``keep_alive: 0s``, and at smoke size :data:`SMOKE_THREADS`), no backends, no models
    folder; ready once it lists the model."""
    base = _base()
    threads = f"    threads: {SMOKE_THREADS}\n" if smoke else ""
    rest = (f"models:\n  - name: {MODEL}\n    path: {gguf}\n    keep_alive: 0s\n{threads}"
            "model_loading:\n  dirs: []\n")
    gw = base.spawn_gateway(kids, tmp, name, rest)
    for tr in ("tcp", "unix"):
        base.wait_models({tr: gw[tr]}, {MODEL}, gw["proc"], "the S9 gateway", gw["log"],
                         timeout=60.0)
    return {**gw, "procs": [("sluice S9", gw)]}


def model_state(gw: dict[str, Any]) -> str | None:
    for entry in _base().get_model_entries({"unix": gw["unix"]}):
        if entry.get("id") == MODEL:
            return str((entry.get("sluice") or {}).get("state"))
    return None


def wait_unloaded(gw: dict[str, Any]) -> None:
    """Until the model is ``unloaded`` and the gateway has no child process left."""
    base = _base()
    base.wait_until(lambda: model_state(gw) == "unloaded" and
                    base.with_descendants(gw["pid"]) == [gw["pid"]],
                    gw["proc"], "the S9 gateway", "its model unloaded, its server gone",
                    gw["log"], timeout=UNLOAD_TIMEOUT)


class ChildWatch(threading.Thread):
    """Finds the gateway's model server once it is started (its child, looked for every
    :data:`CHILD_POLL` s until it runs the launcher, then no more) and keeps its pid, start
    time and command line."""

    def __init__(self, gateway_pid: int) -> None:
        super().__init__(daemon=True)
        self.gateway_pid = gateway_pid
        self.done = threading.Event()
        self.pid: int | None = None
        self.start_time: float | None = None
        self.cmdline: list[str] | None = None

    def run(self) -> None:
        while not self.done.wait(CHILD_POLL):
            if self.pid is None:
                self.pid = _child(self.gateway_pid)
                self.start_time = None if self.pid is None else started_at(self.pid)
            if self.pid is not None and self._take_cmdline():
                return

    def _take_cmdline(self) -> bool:
        """True once the child's command line is known (it runs the launcher) or it is gone.
        An empty read is neither: /proc/PID/cmdline reads empty while the fork execs; nor is
        a user's command's guard (proxy/models/guard.py), which execs the command next."""
        cmdline = _cmdline(self.pid)
        if cmdline is None:
            return True
        if "--listen" in cmdline and "sluice-guard" not in cmdline[:4]:
            self.cmdline = cmdline
            return True
        return False

    def stop(self) -> None:
        """Stops polling; a server that was not seen exec'd yet (a busy machine can starve
        this thread for the whole cold start) is looked at once more, still running."""
        self.done.set()
        self.join()
        if self.pid is None:
            self.pid = _child(self.gateway_pid)
            self.start_time = None if self.pid is None else started_at(self.pid)
        if self.pid is not None and self.cmdline is None:
            self._take_cmdline()


def _child(pid: int) -> int | None:
    """A child of ``pid`` (from /proc/PID/task/*/children), if it has one."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids = (task / "children").read_text().split()
                if kids:
                    return int(kids[0])
    return None


def cold_via_gateway(gw: dict[str, Any], transport: str) -> dict[str, Any]:
    """One cold request through the gateway (the model unloaded before and after)."""
    base = _base()
    wait_unloaded(gw)
    log_size = Path(gw["log"]).stat().st_size
    watch = ChildWatch(gw["pid"])
    cpu0 = base.cpu_seconds([gw["pid"]])
    boot0, t0 = boot_seconds(), time.monotonic()
    watch.start()
    try:
        r = first_token({transport: gw[transport]}, t0)
    finally:
        watch.stop()
    r["gateway_cpu_ms"] = round((base.cpu_seconds([gw["pid"]]) - cpu0) * 1000, 1)
    wait_unloaded(gw)
    r["gateway_load_ms"] = _load_ms(Path(gw["log"]), log_size)
    r["spawn_ms"] = None if watch.start_time is None else \
        round((watch.start_time - boot0) * 1000, 1)
    r["server_argv"] = watch.cmdline
    return _after_spawn(r)


def _after_spawn(r: dict[str, Any]) -> dict[str, Any]:
    """``from_spawn_ms``: the first token's time from the model server's process start."""
    first, spawn = r.get("first_token_ms"), r.get("spawn_ms")
    r["from_spawn_ms"] = None if first is None or spawn is None else round(first - spawn, 1)
    return r


def _cmdline(pid: int | None) -> list[str] | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError):
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return [p.decode() for p in parts if p]
    return None


def _load_ms(log: Path, offset: int) -> float | None:
    """The gateway's ``model cold loaded in N s`` after ``offset`` in its log (10 ms)."""
    with contextlib.suppress(OSError), log.open("rb") as f:
        f.seek(offset)
        for _ in range(50):  # the INFO line is flushed within 0.2 s (proxy/logsetup.py)
            found = LOADED_RE.search(f.read().decode("utf-8", "replace"))
            if found:
                return round(float(found.group(1)) * 1000, 1)
            time.sleep(0.02)
            f.seek(offset)
    return None


# -- S9: the floor ---------------------------------------------------------------------------

def floor_argv(gateway_argv: list[str], listen: Path) -> list[str]:
    """The gateway's command line for its model server with our socket and our pid."""
    argv = list(gateway_argv)
    for flag, value in (("--listen", os.fspath(listen)), ("--parent", str(os.getpid()))):
        argv[argv.index(flag) + 1] = value
    return argv


def cold_floor(kids: Any, argv: list[str], listen: Path, log: Path) -> dict[str, Any]:
    """The model server started directly and asked the request once: milliseconds from the
    process's start to its ``listening`` line and to the first token. (Its ``--parent`` is
    this process: it stops by itself if the benchmark dies.)"""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(listen)
    with log.open("ab") as err:  # started as trio's open_process starts it in the gateway
        boot0, t0 = boot_seconds(), time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True, env=_base().tree_env())
    kids.procs.append(("floor", proc))  # stopped below, or with the rest on the way out
    out: dict[str, Any] = {}
    try:
        line = _read_line(proc, REQUEST_TIMEOUT)
        out["listening_ms"] = round((time.monotonic() - t0) * 1000, 2)
        start = started_at(proc.pid)
        out["spawn_ms"] = None if start is None else round((start - boot0) * 1000, 1)
        if not line.startswith("listening "):
            raise RuntimeError(f"the floor's server did not start: {line!r}\n"
                               f"{_base().tail(log)}")
        url = line.split(" ", 1)[1].strip()
        target = {"unix": url[len("unix:"):]} if url.startswith("unix:") else \
            {"tcp": url.split("://", 1)[-1]}
        retries = 0
        while True:
            r = first_token(target, t0)
            if r["status"] != 503 or retries >= FLOOR_RETRIES:
                break
            retries += 1
            time.sleep(0.01)
        out.update(r, retries=retries)
    finally:
        _stop(kids, proc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen)
    return _after_spawn(out)


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line of ``proc``'s stdout, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data and len(data) < 4096:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "replace")


def _stop(kids: Any, proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process we started (its process group: a gateway, a floor's server),
    SIGKILL after 10 s; reaped and forgotten."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    if proc.stdout is not None:
        proc.stdout.close()
    kids.procs[:] = [(n, p) for n, p in kids.procs if p is not proc]


# -- S9: the rounds --------------------------------------------------------------------------

def run_s9(kids: Any, tmp: Path, transports: list[str], rounds: int, smoke: bool = False
           ) -> dict[str, Any]:
    """S9's samples, interleaved per round (floor, then the gateway over each transport),
    after one warm-up of each (not recorded: page cache, the command line to copy). At
    smoke size, which judges no figure, the floor has no warm-up and the gateway's (a cold
    request over the Unix socket like any) is its Unix sample."""
    base = _base()
    gguf = demo_gguf()
    gw = start_cold_gateway(kids, tmp, gguf, "c9", smoke)
    folder = tmp / "f9"
    folder.mkdir(mode=0o700)
    listen = folder / f"m-{MODEL}.sock"
    floor_log = tmp / "floor.log"
    runs: list[dict[str, Any]] = []
    try:
        warm = cold_via_gateway(gw, "unix")
        argv = warm.pop("server_argv")
        if warm["first_token_ms"] is None or not argv:
            raise RuntimeError(f"S9 warm-up failed: {warm}\n{base.tail(gw['log'])}")
        argv = floor_argv(argv, listen)
        if not smoke:
            cold_floor(kids, argv, listen, floor_log)
        for rnd in range(rounds):
            for tg, tr in [("floor", "unix"), *(("sluice", t) for t in transports)]:
                r = cold_floor(kids, argv, listen, floor_log) if tg == "floor" else \
                    warm if smoke_sample(smoke, rnd, tg, tr) else cold_via_gateway(gw, tr)
                r.pop("server_argv", None)
                runs.append({"scenario": "S9", "round": rnd, "target": tg, "transport": tr,
                             **r})
                print(f"S9 round {rnd + 1} {tg:6} {tr:4}: first token {r['first_token_ms']} "
                      f"ms (head {r['head_ms']}, process started {r['spawn_ms']:+} ms"
                      + (f", listening {r['listening_ms']} ms" if tg == "floor" else
                         f", load {r['gateway_load_ms']} ms") + ")", file=sys.stderr)
    finally:
        _stop(kids, gw["proc"])
    return summarise_s9(runs, transports, argv, gguf)


def smoke_sample(smoke: bool, rnd: int, target: str, transport: str) -> bool:
    """Whether this sample of S9's (or S9CMD's) is the gateway's warm-up: at smoke size, the
    first round's Unix one."""
    return smoke and (rnd, target, transport) == (0, "sluice", "unix")


def summarise_s9(runs: list[dict[str, Any]], transports: list[str], argv: list[str],
                 gguf: Path, *, max_added_ms: float = COLD_MAX_ADDED_MS,
                 floor_key: str = "listening_ms") -> dict[str, Any]:
    """Medians over rounds (S9's, and S9CMD's: bench/ondemand_command.py, whose floor's own
    figure is ``floor_key`` and whose target is ``max_added_ms``)."""
    median = _base().median
    floor = {r["round"]: r for r in runs if r["target"] == "floor"}
    summary: dict[str, Any] = {}
    problems = [f"{r['scenario']} round {r['round'] + 1} {r['target']} {r['transport']}: "
                f"status {r['status']}, first token {r['first_token_ms']}, [DONE] "
                f"{r['done']} {r.get('error', '')[:200]}" for r in runs
                if r["status"] != 200 or r["first_token_ms"] is None or not r["done"]]
    problems += [f"{r['scenario']} round {r['round'] + 1} sluice {r['transport']}: served "
                 f"by {r['served_by']}" for r in runs
                 if r["target"] == "sluice" and r["served_by"] != f"local:{MODEL}"]
    keys = ("first_token_ms", "head_ms", "spawn_ms", "from_spawn_ms", floor_key,
            "gateway_load_ms", "gateway_cpu_ms")
    fl = {k: median([r.get(k) for r in floor.values()]) for k in keys}
    summary["floor"] = {**fl, "rounds": len(floor)}
    for tr in transports:
        mine = {r["round"]: r for r in runs if r["target"] == "sluice" and r["transport"] == tr}
        s = {k: median([r.get(k) for r in mine.values()]) for k in keys}
        s["rounds"] = len(mine)
        s["added_ms"] = None if s["first_token_ms"] is None or fl["first_token_ms"] is None \
            else round(s["first_token_ms"] - fl["first_token_ms"], 2)
        s["added_paired_ms"] = median([
            r["first_token_ms"] - floor[n]["first_token_ms"] for n, r in mine.items()
            if n in floor and r["first_token_ms"] is not None
            and floor[n]["first_token_ms"] is not None])
        s["ratio"] = _ratio(s["first_token_ms"], fl["first_token_ms"])
        for key in ("spawn_ms", "from_spawn_ms"):
            s[f"added_{key}"] = None if s[key] is None or fl[key] is None else \
                round(s[key] - fl[key], 2)
        s["met"] = s["added_ms"] is not None and s["added_ms"] <= max_added_ms
        summary[f"sluice/{tr}"] = s
    return {"model": MODEL, "gguf": os.fspath(gguf), "max_tokens": MAX_TOKENS,
            "server_argv": argv, "summary": summary, "problems": problems, "runs": runs}


def _ratio(x: Any, y: Any) -> float | None:
    return round(x / y, 3) if x is not None and y else None


# -- S10: idle RSS with a catalogue -----------------------------------------------------------

def spawn_catalogue_gateway(kids: Any, tmp: Path, gguf: Path, config: str,
                            name: str) -> dict[str, Any]:
    """A gateway of S10's ``config`` (:data:`CONFIGS`): no backends, and either no folder to
    scan (``model_loading.dirs: []``) or the default ``models`` folder with that many links
    to the GGUF (none when 0: no folder); started, not waited for."""
    n = _count(config)
    rest = "model_loading:\n  dirs: []\n" if config == NO_FOLDER else ""
    return dict(_base().spawn_gateway(kids, tmp, name, rest,
                                      prepare=lambda data: _link_models(data, gguf, n)))


def _count(config: str) -> int:
    return 0 if config == NO_FOLDER else int(config)


def start_catalogue_gateway(kids: Any, tmp: Path, gguf: Path, config: str, name: str,
                            started: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`spawn_catalogue_gateway` (or the one ``started`` so), ready once it lists its
    models, all unloaded."""
    base = _base()
    n = _count(config)
    gw = started or spawn_catalogue_gateway(kids, tmp, gguf, config, name)
    want = {f"m{i:02d}" for i in range(1, n + 1)}

    def ready() -> bool:
        listed = base.get_model_entries({"unix": gw["unix"]})
        return {m.get("id") for m in listed
                if (m.get("sluice") or {}).get("state") == "unloaded"} == want and \
            len(listed) == n

    base.wait_until(ready, gw["proc"], "the S10 gateway", f"its {n} models listed",
                    gw["log"], timeout=60.0)
    return dict(gw)


def _link_models(data: Path, gguf: Path, n: int) -> None:
    if n:
        folder = data / "models"
        folder.mkdir(mode=0o700)
        for i in range(1, n + 1):
            os.symlink(gguf, folder / f"m{i:02d}.gguf")


def idle_rss(kids: Any, tmp: Path, gguf: Path, config: str, name: str, smoke: bool = False,
             started: dict[str, Any] | None = None) -> dict[str, Any]:
    """One fresh gateway of ``config``: its idle RSS (MB), then it stops. (At smoke size,
    which judges no figure: one round of listing calls, no rest, one sample.)"""
    base = _base()
    gw = start_catalogue_gateway(kids, tmp, gguf, config, name, started)
    try:
        for _ in range(1 if smoke else LISTING_CALLS):
            for path in ("/v1/models", "/api/v1/inference/status", "/api/v1/models/local"):
                base.http_call({"unix": gw["unix"]}, "GET", path)
        if not smoke:
            time.sleep(SETTLE_S)
        pids = base.with_descendants(gw["pid"])
        samples = []
        for _ in range(1 if smoke else RSS_SAMPLES):
            samples.append(base.rss_bytes(pids))
            if not smoke:
                time.sleep(0.1)
        if gw["proc"].poll() is not None:
            raise RuntimeError(f"the S10 gateway exited:\n{base.tail(gw['log'])}")
        listed = len(base.get_model_entries({"unix": gw["unix"]}))
    finally:
        _stop(kids, gw["proc"])
    return {"rss_mb": round(base.median(samples) / 2**20, 3), "processes": len(pids),
            "listed": listed}


def run_s10(kids: Any, tmp: Path, rounds: int, smoke: bool) -> dict[str, Any]:
    """S10's gateways, one of each config per round, in turn (at smoke size all started at
    once, each measured in turn)."""
    configs = SMOKE_CONFIGS if smoke else CONFIGS
    gguf = demo_gguf()
    runs: list[dict[str, Any]] = []
    names = [(rnd, config, f"r{i}") for i, (rnd, config) in
             enumerate(((rnd, c) for rnd in range(rounds) for c in configs), 1)]
    started = {name: spawn_catalogue_gateway(kids, tmp, gguf, config, name)
               for _rnd, config, name in names} if smoke else {}
    for rnd, config, name in names:
        r = idle_rss(kids, tmp, gguf, config, name, smoke, started.get(name))
        runs.append({"scenario": "S10", "round": rnd, "config": config, **r})
        print(f"S10 round {rnd + 1} {_label(config)}: idle RSS {r['rss_mb']} MB "
              f"({r['processes']} process(es), {r['listed']} listed)", file=sys.stderr)
    return summarise_s10(runs, configs)


def _label(config: str) -> str:
    return "no folder (dirs: [])" if config == NO_FOLDER else f"{config} models"


def summarise_s10(runs: list[dict[str, Any]], configs: tuple[str, ...]) -> dict[str, Any]:
    """Medians of each config's idle RSS over rounds; the differences of the medians."""
    median = _base().median
    by: dict[str, float | None] = {
        c: median([r["rss_mb"] for r in runs if r["config"] == c]) for c in configs}
    big = configs[-1]

    def added(base: str) -> float | None:
        top, low = by[big], by.get(base)
        return None if top is None or low is None else round(top - low, 3)

    added_none = added("0")
    problems = [f"S10 round {r['round'] + 1} {_label(r['config'])}: {r['listed']} listed, "
                f"{r['processes']} processes" for r in runs
                if r["listed"] != (0 if r["config"] == NO_FOLDER else int(r["config"]))
                or r["processes"] != 1]
    return {"configs": list(configs), "rss_mb": by, "big": big,
            "added_vs_none_mb": added_none, "added_vs_one_mb": added("1"),
            "added_vs_no_folder_mb": added(NO_FOLDER),
            "met": added_none is not None and added_none <= RSS_MAX_ADDED_MB,
            "rounds": len({r["round"] for r in runs}), "problems": problems, "runs": runs}


# -- the report ------------------------------------------------------------------------------

def cold_rows(summary: dict[str, Any], smoke: bool, target: str, floor: tuple[str, str],
              ready: Any) -> list[list[str]]:
    """S9's and S9CMD's table rows: the floor (``floor``: its label and transport, ``ready``
    its ready column) and the gateway over each transport."""
    fmt = _base().fmt
    rows = []
    for key, e in summary.items():
        is_floor = key == "floor"
        rows.append([
            floor[0] if is_floor else "sluice", floor[1] if is_floor else key.split("/")[1],
            f"{fmt(e['first_token_ms'])} ms",
            "" if is_floor else f"{fmt(e['added_ms'], sign='+')} ms (paired "
            f"{fmt(e['added_paired_ms'], sign='+')} ms, x{fmt(e['ratio'])})",
            f"{fmt(e['spawn_ms'], sign='+')} ms",
            f"{fmt(e['from_spawn_ms'])} ms" + ("" if is_floor else
                                               f" ({fmt(e['added_from_spawn_ms'], sign='+')})"),
            ready(e) if is_floor else f"loaded in {fmt(e['gateway_load_ms'])} ms (its log)",
            "" if is_floor else f"{fmt(e['gateway_cpu_ms'])} ms", str(e["rounds"]),
            "" if is_floor else target,
            "—" if is_floor or smoke else ("met" if e["met"] else "not met")])
    return rows


def tables(s9: dict[str, Any] | None, s10: dict[str, Any] | None, smoke: bool) -> str:
    base = _base()
    fmt, markdown = base.fmt, base.markdown
    parts = []
    if s9 is not None:
        head = ["S9 cold start", "Transport", "First token (median)", "vs floor",
                "Server process started", "First token after it started",
                "Listening / loaded", "Gateway CPU", "Rounds", "Issue target", "Met"]
        rows = cold_rows(s9["summary"], smoke, S9_TARGET, floor=("floor (llama.cpp direct)",
                                                               "its socket"),
                         ready=lambda e: f"listening {fmt(e['listening_ms'])} ms")
        parts.append(markdown(head, rows))
    if s10 is not None:
        configs, big = s10["configs"], s10["big"]
        head = ["S10 idle RSS", *(_label(c) for c in configs), f"{big} - none",
                f"{big} - 1", f"{big} - no folder", "Rounds", "Issue target", "Met"]
        rss = s10["rss_mb"]
        def mb(value: Any, sign: str = "") -> str:
            return "—" if value is None else f"{fmt(value, sign=sign)} MB"

        rows = [["sluice", *(mb(rss[c]) for c in configs),
                 mb(s10["added_vs_none_mb"], "+"), mb(s10["added_vs_one_mb"], "+"),
                 mb(s10["added_vs_no_folder_mb"], "+"), str(s10["rounds"]),
                 S10_TARGET, "—" if smoke else ("met" if s10["met"] else "not met")]]
        parts.append(markdown(head, rows))
    return "\n\n".join(parts)
