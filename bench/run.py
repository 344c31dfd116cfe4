"""Side-by-side benchmark: the gateway vs a direct connection (and nginx, where installed).

Starts a Node mock model server (TCP + Unix socket), the gateway (``sluice serve``) and,
when ``nginx`` is on PATH, nginx as a reference C proxy; then runs each scenario in rounds,
interleaved (direct, sluice, nginx, direct, ...), with the Node load client ``bench/load.js``.
Prints a Markdown table and writes every figure as JSON. Usage: ``scripts/bench --help``.
Python standard library only; Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CLK = os.sysconf("SC_CLK_TCK")

SCENARIOS: dict[str, dict[str, Any]] = {
    "S1": {"stream": False, "concurrency": 1, "count": 2000},
    "S2": {"stream": False, "concurrency": 32, "duration_s": 10},
    "S3": {"stream": True, "chunks": 100, "gap_ms": 0, "concurrency": 1, "count": 300},
    "S4": {"stream": True, "chunks": 100, "gap_ms": 0, "concurrency": 64, "duration_s": 10},
    "S5": {"stream": True, "chunks": 50, "gap_ms": 200, "concurrency": 1000, "count": 1000},
}
SMOKE: dict[str, dict[str, Any]] = {
    "S1": {"count": 200},
    "S2": {"duration_s": 1},
    "S3": {"count": 30},
    "S4": {"duration_s": 1},
    "S5": {"concurrency": 100, "count": 100, "chunks": 10, "gap_ms": 50},
}
TARGET_TEXT = {
    "S1": "CPU ≤ 0.25 ms/req; added p50 ≤ 0.3 ms",
    "S2": "CPU ≤ 0.25 ms/req; ≥ 4,000 req/s",
    "S3": "CPU ≤ 3 ms/stream; added TTFB p50 ≤ 0.3 ms",
    "S4": "CPU ≤ 3 ms/stream; ≥ 300 streams/s",
    "S5": "1000/1000; none missing; gap p99 ≤ 250 ms; RSS ≤ 80 MB; CPU ≤ 5 s",
    "S6": "all bodies identical",
}
KEYS = ("rps", "lat_p50", "lat_p99", "ttfb_p50", "ttfb_p99", "chunks_per_s", "gap_p50",
        "gap_p99", "started", "completed", "incomplete", "missing_streams", "missing_chunks",
        "proxy_cpu_s", "proxy_cpu_ms_per_req", "proxy_rss_mb", "mock_cpu_s", "client_cpu_s",
        "wall_s")


# -- processes -------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """In a child: SIGTERM when the benchmark dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _child_setup() -> None:
    """In a server child: its own process group (killed whole at the end), dies with us."""
    os.setsid()
    _die_with_parent()


class Children:
    """Every process we start; :meth:`stop_all` kills their process groups."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=kw.pop("stdout", out), stderr=out,
                                    stdin=kw.pop("stdin", subprocess.DEVNULL),
                                    preexec_fn=_child_setup, **kw)
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers in the group
        self.procs.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def with_descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(stat[1])
    found = [pid]
    for p in found:
        found.extend(c for c, pp in parents.items() if pp == p)
    return found


class RssPeak(threading.Thread):
    """Samples the summed VmRSS of some pids every 100 ms; ``peak`` holds the largest."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.peak, self.done = pids, rss_bytes(pids), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak = max(self.peak, rss_bytes(self.pids))

    def stop(self) -> int:
        self.done.set()
        self.join()
        self.peak = max(self.peak, rss_bytes(self.pids))
        return self.peak


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def get_models(target: dict[str, str]) -> list[str]:
    if "unix" in target:
        conn: http.client.HTTPConnection = UnixHTTPConnection(target["unix"], 2.0)
    else:
        host, port = target["tcp"].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=2.0)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return []
        return [m.get("id") for m in json.loads(body).get("data", [])]
    finally:
        conn.close()


def wait_models(target: dict[str, str], want: set[str], proc: subprocess.Popen[bytes],
                what: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{tail(log)}")
        try:
            if want <= set(get_models(target)):
                return
        except (OSError, ValueError, http.client.HTTPException) as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not list {sorted(want)} within {timeout} s ({last}):\n"
                       f"{tail(log)}")


def tail(log: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


# -- the three targets -----------------------------------------------------------------------

def start_mock(kids: Children, tmp: Path) -> dict[str, Any]:
    port, sock = free_port(), tmp / "mock.sock"
    log = tmp / "mock.log"
    proc = kids.start("mock", ["node", str(BENCH / "mock_upstream.js"), "--port", str(port),
                               "--unix", str(sock)], log, stdout=subprocess.PIPE,
                      stdin=subprocess.PIPE)
    stdout = proc.stdout
    assert stdout is not None
    ready: list[bytes] = []
    reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(10)
    if not ready or ready[0].strip() != b"ready":
        raise RuntimeError(f"the mock upstream did not start:\n{tail(log)}")
    return {"pid": proc.pid, "tcp": f"127.0.0.1:{port}", "unix": str(sock)}


def start_gateway(kids: Children, tmp: Path, mock: dict[str, Any]) -> dict[str, Any]:
    data, sockdir, port = tmp / "data", tmp / "s", free_port()
    data.mkdir(mode=0o700)
    sockdir.mkdir(mode=0o700)
    (data / "config.yaml").write_text(
        f"api:\n  port: {port}\nlocal:\n  socket_dir: {sockdir}\nbackends:\n"
        f"  - name: mock-tcp\n    url: http://{mock['tcp']}\n"
        f"  - name: mock-unix\n    url: unix:{mock['unix']}\n")
    sluice = Path(sys.executable).parent / "sluice"
    log = tmp / "gateway.log"
    proc = kids.start("sluice", [str(sluice), "serve", "--data-dir", str(data)], log)
    targets = {"tcp": f"127.0.0.1:{port}", "unix": str(sockdir / "sluice.sock")}
    for tr in ("tcp", "unix"):
        wait_models({tr: targets[tr]}, {"bench-tcp", "bench-unix"}, proc, "the gateway", log)
    return {"pid": proc.pid, "pids": with_descendants(proc.pid), "proc": proc, "log": log,
            **targets}


def start_nginx(kids: Children, tmp: Path, mock: dict[str, Any]) -> dict[str, Any] | None:
    binary = shutil.which("nginx")
    if binary is None:
        return None
    prefix, port = tmp / "nginx", free_port()
    prefix.mkdir()
    sock = prefix / "nginx.sock"
    location = ("proxy_http_version 1.1; proxy_set_header Connection \"\"; "
                "proxy_buffering off; proxy_request_buffering off;")
    user = "user root;\n" if os.geteuid() == 0 else ""  # so the worker may use the mock's socket
    (prefix / "nginx.conf").write_text(
        f"{user}worker_processes 1;\nworker_rlimit_nofile 16384;\ndaemon off;\n"
        f"error_log {prefix}/err.log;\npid {prefix}/nginx.pid;\n"
        "events { worker_connections 8192; }\n"
        "http {\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 60s;\n"
        f"  client_body_temp_path {prefix}/body;\n  proxy_temp_path {prefix}/proxy;\n"
        f"  upstream mock {{ server {mock['tcp']}; keepalive 128; "
        "keepalive_requests 1000000; }\n"
        f"  upstream mock_unix {{ server unix:{mock['unix']}; keepalive 128; "
        "keepalive_requests 1000000; }\n"
        f"  server {{ listen 127.0.0.1:{port}; "
        f"location / {{ proxy_pass http://mock; {location} }} }}\n"
        f"  server {{ listen unix:{sock}; "
        f"location / {{ proxy_pass http://mock_unix; {location} }} }}\n}}\n")
    log = prefix / "stderr.log"
    proc = kids.start("nginx", [binary, "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf"),
                                "-e", str(prefix / "err.log")], log)
    targets = {"tcp": f"127.0.0.1:{port}", "unix": str(sock)}
    wait_models({"tcp": targets["tcp"]}, {"bench-tcp"}, proc, "nginx", prefix / "err.log")
    wait_models({"unix": targets["unix"]}, {"bench-unix"}, proc, "nginx", prefix / "err.log")
    version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
    return {"pid": proc.pid, "pids": with_descendants(proc.pid), "version": version,
            "proc": proc, "log": prefix / "err.log", **targets}


# -- measuring -------------------------------------------------------------------------------

def run_load(target: dict[str, str], model: str, params: dict[str, Any]) -> dict[str, Any]:
    limit = params["duration_s"] + 20 if "duration_s" in params else 50
    args = {"target": target, "model": model, "time_limit_s": limit, **params}
    proc = subprocess.run(["node", str(BENCH / "load.js"), json.dumps(args)],
                          capture_output=True, text=True, timeout=limit + 20,
                          preexec_fn=_die_with_parent)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"load.js failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def measure(env: dict[str, Any], target: str, transport: str,
            params: dict[str, Any]) -> dict[str, Any]:
    proxy = env.get(target)
    addr = {transport: (proxy if proxy else env["mock"])[transport]}
    pids = proxy["pids"] if proxy else []
    mock_pids = [env["mock"]["pid"]]
    sampler = RssPeak(pids)
    sampler.start()
    cpu0, mock0, t0 = cpu_seconds(pids), cpu_seconds(mock_pids), time.monotonic()
    try:
        load = run_load(addr, f"bench-{transport}", params)
    finally:
        peak = sampler.stop()
    wall = time.monotonic() - t0
    for name in ("sluice", "nginx"):
        if name in env and env[name]["proc"].poll() is not None:
            raise RuntimeError(f"{name} exited ({env[name]['proc'].returncode}) during "
                               f"{target}/{transport}:\n{tail(env[name]['log'])}")
    return {"load": load, "wall_s": round(wall, 3),
            "proxy_cpu_s": round(cpu_seconds(pids) - cpu0, 3) if proxy else None,
            "proxy_rss_mb": round(peak / 2**20, 1) if proxy else None,
            "mock_cpu_s": round(cpu_seconds(mock_pids) - mock0, 3)}


def metrics(run: dict[str, Any]) -> dict[str, Any]:
    load = run["load"]
    lat, ttfb, gap = load.get("latency_ms") or {}, load.get("ttfb_ms") or {}, \
        load.get("gap_ms_stats") or {}
    per = max(load["completed"], 1)
    cpu = run["proxy_cpu_s"]
    return {
        "rps": load["requests_per_s"], "lat_p50": lat.get("p50"), "lat_p99": lat.get("p99"),
        "ttfb_p50": ttfb.get("p50"), "ttfb_p99": ttfb.get("p99"),
        "chunks_per_s": load["chunks_per_s"] if load["stream"] else None,
        "gap_p50": gap.get("p50"), "gap_p99": gap.get("p99"),
        "started": load["started"], "completed": load["completed"],
        "incomplete": load["incomplete"], "missing_streams": load["missing_streams"],
        "missing_chunks": load["missing_chunks"], "proxy_cpu_s": cpu,
        "proxy_cpu_ms_per_req": None if cpu is None else round(cpu * 1000 / per, 4),
        "proxy_rss_mb": run["proxy_rss_mb"], "mock_cpu_s": run["mock_cpu_s"],
        "client_cpu_s": load["client_cpu_s"], "wall_s": run["wall_s"],
    }


def median(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarise(runs: list[dict[str, Any]], scenarios: list[str], transports: list[str],
              targets: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sc in scenarios:
        for tr in transports:
            mine = [r for r in runs if r["scenario"] == sc and r["transport"] == tr]
            direct = {r["round"]: metrics(r) for r in mine if r["target"] == "direct"}
            for tg in targets:
                rounds = {r["round"]: metrics(r) for r in mine if r["target"] == tg}
                if not rounds:
                    continue
                s: dict[str, Any] = {k: median([m[k] for m in rounds.values()]) for k in KEYS}
                s["rounds"] = len(rounds)
                paired = [(m, direct[n]) for n, m in rounds.items() if n in direct]
                s["ratio_vs_direct"] = {
                    k: median([m[k] / d[k] if m[k] is not None and d[k] else None
                               for m, d in paired])
                    for k in ("rps", "lat_p50", "lat_p99", "ttfb_p50", "ttfb_p99",
                              "chunks_per_s", "gap_p99")}
                s["added_vs_direct_ms"] = {
                    k: median([m[k] - d[k] if m[k] is not None and d[k] is not None else None
                               for m, d in paired])
                    for k in ("lat_p50", "lat_p99", "ttfb_p50", "ttfb_p99", "gap_p99")}
                s["direct_gap_p99"] = median([d["gap_p99"] for d in direct.values()])
                s["all_rounds_complete"] = all(m["completed"] == m["started"] and
                                               not m["missing_streams"] for m in rounds.values())
                out[f"{sc}/{tr}/{tg}"] = s
    return out


def bodies_check(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """S6: every target's bodies hash like direct's, per scenario, transport and round."""
    result: dict[str, Any] = {}
    direct = {(r["scenario"], r["transport"], r["round"]): set(r["load"]["digests"])
              for r in runs if r["target"] == "direct"}
    for r in runs:
        key = f"{r['transport']}/{r['target']}"
        want = direct.get((r["scenario"], r["transport"], r["round"]), set())
        got = set(r["load"]["digests"])
        ok = len(want) == 1 and got == want
        entry = result.setdefault(key, {"equal": True, "checked": 0, "mismatches": []})
        entry["checked"] += 1
        if not ok:
            entry["equal"] = False
            entry["mismatches"].append({"scenario": r["scenario"], "round": r["round"],
                                        "direct": sorted(want), "got": sorted(got)})
    return result


# -- the report ------------------------------------------------------------------------------

def fmt(v: Any, digits: int = 3, sign: str = "") -> str:
    if v is None:
        return "—"
    if sign:
        return f"{v:+.{digits}g}"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if isinstance(v, float) else f"{v:,}"


def judge(sc: str, s: dict[str, Any], equal: bool) -> list[str]:
    """The parts of the issue's target that this sluice row misses."""
    add = s["added_vs_direct_ms"]
    cpu = s["proxy_cpu_ms_per_req"]
    checks = {
        "S1": [("CPU/req", cpu is not None and cpu <= 0.25),
               ("added p50", add["lat_p50"] is not None and add["lat_p50"] <= 0.3)],
        "S2": [("CPU/req", cpu is not None and cpu <= 0.25), ("req/s", s["rps"] >= 4000)],
        "S3": [("CPU/stream", cpu is not None and cpu <= 3),
               ("added TTFB", add["ttfb_p50"] is not None and add["ttfb_p50"] <= 0.3)],
        "S4": [("CPU/stream", cpu is not None and cpu <= 3), ("streams/s", s["rps"] >= 300)],
        "S5": [("delivered", s["started"] == 1000 and s["all_rounds_complete"]),
               ("gap p99", s["gap_p99"] is not None and s["gap_p99"] <= 250),
               ("RSS", s["proxy_rss_mb"] is not None and s["proxy_rss_mb"] <= 80),
               ("CPU", s["proxy_cpu_s"] is not None and s["proxy_cpu_s"] <= 5)],
        "S6": [("bodies", equal)],
    }[sc]
    return [name for name, ok in checks if not ok]


def row(sc: str, tr: str, tg: str, s: dict[str, Any], smoke: bool) -> list[str]:
    ratio, add, cpu = s["ratio_vs_direct"], s["added_vs_direct_ms"], s["proxy_cpu_ms_per_req"]
    vs = ""
    if sc in ("S1", "S2"):
        res = (f"p50 {fmt(s['lat_p50'])} ms, p99 {fmt(s['lat_p99'])} ms" if sc == "S1"
               else f"{fmt(s['rps'])} req/s, p50 {fmt(s['lat_p50'])} ms")
        if tg != "direct":
            vs = (f"{fmt(add['lat_p50'], sign='+')} ms p50 (x{fmt(ratio['lat_p50'])})" if sc == "S1"
                  else f"x{fmt(ratio['rps'])} req/s")
        cpu_txt = "" if cpu is None else f"{fmt(cpu)} ms/req"
    elif sc in ("S3", "S4"):
        res = (f"TTFB p50 {fmt(s['ttfb_p50'])} ms, p99 {fmt(s['ttfb_p99'])} ms, "
               f"{fmt(s['chunks_per_s'])} chunks/s" if sc == "S3"
               else f"{fmt(s['rps'])} streams/s, {fmt(s['chunks_per_s'])} chunks/s")
        if tg != "direct":
            vs = (f"{fmt(add['ttfb_p50'], sign='+')} ms TTFB p50 (x{fmt(ratio['ttfb_p50'])})"
                  if sc == "S3" else f"x{fmt(ratio['rps'])} streams/s")
        cpu_txt = "" if cpu is None else f"{fmt(cpu)} ms/stream"
    else:
        res = (f"{s['completed']}/{s['started']} delivered, {s['missing_streams']} streams missing "
               f"chunks, gap p99 {fmt(s['gap_p99'])} ms")
        if tg != "direct":
            vs = f"gap p99 direct {fmt(s['direct_gap_p99'])} ms"
        cpu_txt = "" if s["proxy_cpu_s"] is None else f"{fmt(s['proxy_cpu_s'])} s total"
    rss = "" if s["proxy_rss_mb"] is None else f"{fmt(s['proxy_rss_mb'])} MB"
    wall = s["wall_s"] or 1
    load = "/".join(f"{100 * (x or 0) / wall:.0f}" for x in
                    (s["client_cpu_s"], s["mock_cpu_s"], s["proxy_cpu_s"]))
    met = "—"
    if tg == "sluice" and not smoke:
        missed = judge(sc, s, True)
        met = "met" if not missed else "not met: " + ", ".join(missed)
    return [sc, tr, tg, res, vs, cpu_txt, rss, load,
            TARGET_TEXT[sc] if tg == "sluice" else "", met]


def table(summary: dict[str, Any], s6: dict[str, Any], rounds: int, smoke: bool) -> str:
    head = ["Scenario", "Transport", "Target", f"Result (median of {rounds})",
            "vs direct (paired)", "Proxy CPU", "Proxy peak RSS",
            "CPU % client/mock/proxy", "Issue target", "Met"]
    rows = []
    for key, s in summary.items():
        sc, tr, tg = key.split("/")
        rows.append(row(sc, tr, tg, s, smoke))
    for key, entry in s6.items():
        tr, tg = key.split("/")
        if tg == "direct":
            continue
        res = "bodies = direct's" if entry["equal"] else \
            f"{len(entry['mismatches'])} of {entry['checked']} runs differ"
        met = "—" if tg != "sluice" else ("met" if entry["equal"] else "not met")
        rows.append(["S6", tr, tg, res, "", "", "", "", TARGET_TEXT["S6"] if tg == "sluice"
                     else "", met])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="S1,S2,S3,S4,S5,S6")
    ap.add_argument("--transport", choices=("tcp", "unix", "both"), default="both")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run of every scenario, 1 round, no nginx; exit 1 unless every "
                         "body equals direct's and every request completed")
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    ap.add_argument("--json", type=Path, default=None,
                    help="where to write the JSON (default bench/results/latest.json, "
                         "smoke.json for --smoke)")
    opts = ap.parse_args(argv)
    wanted = [s.strip().upper() for s in opts.scenarios.split(",") if s.strip()]
    bad = [s for s in wanted if s not in (*SCENARIOS, "S6")]
    if bad:
        ap.error(f"unknown scenario(s): {', '.join(bad)}")
    scenarios = [s for s in SCENARIOS if s in wanted or (wanted == ["S6"])]
    rounds = 1 if opts.smoke else max(1, opts.rounds)
    transports = ["tcp", "unix"] if opts.transport == "both" else [opts.transport]
    out_path = opts.json or BENCH / "results" / ("smoke.json" if opts.smoke else "latest.json")
    if shutil.which("node") is None:
        print("node is needed (apt-get install -y nodejs)", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # S5: 1000 streams, 2 hops

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    kids = Children()
    tmp = Path(tempfile.mkdtemp(prefix="slb-", dir="/tmp"))  # short: socket paths ≤ 103 bytes
    try:
        env: dict[str, Any] = {"mock": start_mock(kids, tmp)}
        env["sluice"] = start_gateway(kids, tmp, env["mock"])
        if not (opts.smoke or opts.no_nginx):
            nginx = start_nginx(kids, tmp, env["mock"])
            if nginx is not None:
                env["nginx"] = nginx
        targets: list[str] = [t for t in ("direct", "sluice", "nginx") if t == "direct" or t in env]
        print(f"targets: {', '.join(targets)}; transports: {', '.join(transports)}; "
              f"rounds: {rounds}", file=sys.stderr)
        for tr in transports:  # warm-up: connections, pools, JIT (not recorded)
            for tg in targets:
                measure(env, tg, tr, {"stream": False, "concurrency": 8, "count": 400})
                measure(env, tg, tr, {"stream": True, "concurrency": 8, "count": 40})
        runs: list[dict[str, Any]] = []
        for sc in scenarios:
            params = {**SCENARIOS[sc], **(SMOKE[sc] if opts.smoke else {})}
            for tr in transports:
                for n in range(rounds):
                    for tg in targets:
                        r = measure(env, tg, tr, params)
                        runs.append({"scenario": sc, "transport": tr, "round": n,
                                     "target": tg, "params": params, **r})
                        ld = r["load"]
                        print(f"{sc} {tr:4} round {n + 1} {tg:6}: {ld['completed']}/"
                              f"{ld['started']} ok, {ld['requests_per_s']:,.0f}/s, proxy CPU "
                              f"{r['proxy_cpu_s']} s, {r['wall_s']} s", file=sys.stderr)
        summary = summarise(runs, scenarios, transports, targets)
        s6 = bodies_check(runs)
        problems = [f"{r['scenario']} {r['transport']} {r['target']} round {r['round'] + 1}: "
                    f"{r['load']['completed']}/{r['load']['started']} complete "
                    f"{r['load']['errors']}" for r in runs
                    if r["load"]["incomplete"] or r["load"]["timed_out"]
                    or r["load"]["completed"] != r["load"]["started"]]
        problems += [f"S6 {k}: {v['mismatches'][:3]}" for k, v in s6.items() if not v["equal"]]
        md = table(summary, s6, rounds, opts.smoke)
        result = {
            "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": opts.smoke,
                     "rounds": rounds, "scenarios": scenarios, "transports": transports,
                     "targets": targets, "cpus": os.cpu_count(), "machine": platform.platform(),
                     "python": platform.python_version(),
                     "node": subprocess.run(["node", "--version"], capture_output=True,
                                            text=True).stdout.strip(),
                     "nginx": env.get("nginx", {}).get("version"),
                     "nofile": [soft, hard]},
            "summary": summary,
            "s6": {"all_equal": all(v["equal"] for v in s6.values()), "by_target": s6},
            "checks": {"all_complete": not any(p for p in problems if not p.startswith("S6")),
                       "problems": problems},
            "table": md,
            "runs": runs,
        }
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n")
        print(md)
        print(f"\nJSON: {out_path}", file=sys.stderr)
        if problems:
            print("problems:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1 if (opts.smoke and problems) else 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
