"""Side-by-side benchmark: the gateway vs a direct connection (and nginx, where installed).

Starts a Node mock model server (TCP + Unix socket), the gateway (``sluice serve``) and,
when ``nginx`` is on PATH, nginx as a reference C proxy; then runs each scenario in rounds,
interleaved (direct, sluice, nginx, direct, ...), with the Node load client ``bench/load.js``.
S7 adds a second pair of gateways: A (no backends, load balancing on, one network node) in
front of B (the mock as its backends, like ``sluice``), so that S3's and S5's loads also
run through two gateways (target ``forwarded``, A->B over loopback TCP). S8 holds streams by
the thousand (bench/held.py); S9 and S10 are models on demand (bench/ondemand.py): a managed
model's cold start against llama.cpp started directly, and the idle RSS of 20 unloaded ones;
S9CMD is S9 for a model served by a command of the user's own (bench/ondemand_command.py).
S11 is the Ollama API (bench/ollama.py): S3's stream on /api/chat (NDJSON) against
/v1/chat/completions (SSE) through the same gateway. S7TLS (bench/s7tls.py, only when named;
root) runs A -> B over SPEC §16's pinned TLS link against the plain one.
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

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import (
    aliases,
    held,
    keys,
    ollama,
    ondemand,
    ondemand_command,
    s7tls,
    s7tls_report,
    translate,
    watch,
)

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
# --smoke: each load as small as its checks allow (every request and stream whole, bodies
# equal to direct's, S7's served by B); S5 still holds 100 streams at once, paced.
SMOKE: dict[str, dict[str, Any]] = {
    "S1": {"count": 50},
    "S2": {"duration_s": 0.25},
    "S3": {"count": 10},
    "S4": {"duration_s": 0.25},
    "S5": {"concurrency": 100, "count": 100, "chunks": 5, "gap_ms": 20},
}
TARGET_TEXT = {
    "S1": "CPU ≤ 0.25 ms/req; added p50 ≤ 0.3 ms",
    "S2": "CPU ≤ 0.25 ms/req; ≥ 4,000 req/s",
    "S3": "CPU ≤ 3 ms/stream; added TTFB p50 ≤ 0.3 ms",
    "S4": "CPU ≤ 3 ms/stream; ≥ 300 streams/s",
    "S5": "1000/1000; none missing; gap p99 ≤ 250 ms; RSS ≤ 80 MB; CPU ≤ 5 s",
    "S6": "all bodies identical",
    "S7": "forwarded (A+B): CPU/stream and added TTFB p50 each ≤ twice one gateway's",
    "S8": held.TARGET_TEXT,
    "S9": ondemand.S9_TARGET,
    "S9CMD": ondemand_command.TARGET,
    "S10": ondemand.S10_TARGET,
    "S11": ollama.TARGET_TEXT,
    "S3T": translate.TARGET_TEXT,
}
S7_SHAPES = ("S3", "S5")  # the loads S7 also runs through gateway A -> gateway B
S7_MAX_RATIO = 2.0
KEYS = ("rps", "lat_p50", "lat_p99", "ttfb_p50", "ttfb_p99", "chunks_per_s", "gap_p50",
        "gap_p99", "started", "completed", "incomplete", "missing_streams", "missing_chunks",
        "proxy_cpu_s", "proxy_cpu_ms_per_req", "proxy_rss_mb", "mock_cpu_s", "client_cpu_s",
        "wall_s", "a_cpu_ms_per_req", "b_cpu_ms_per_req")


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


def http_call(target: dict[str, str], method: str, path: str, body: bytes | None = None,
              timeout: float = 2.0, headers: dict[str, str] | None = None
              ) -> tuple[int, dict[str, str], bytes]:
    """One request to a target's ``tcp`` or ``unix`` address (with these ``headers``):
    status, headers, body."""
    if "unix" in target:
        conn: http.client.HTTPConnection = UnixHTTPConnection(target["unix"], timeout)
    else:
        host, port = target["tcp"].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        sent = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers={**sent, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(target: dict[str, str], path: str) -> Any:
    """A GET's JSON answer; None unless it answered 200."""
    status, _headers, body = http_call(target, "GET", path)
    return json.loads(body) if status == 200 else None


def get_model_entries(target: dict[str, str]) -> list[dict[str, Any]]:
    doc = get_json(target, "/v1/models")
    return [m for m in (doc or {}).get("data", []) if isinstance(m, dict)]


def get_models(target: dict[str, str]) -> list[str]:
    return [m.get("id") for m in get_model_entries(target)]


def wait_until(check: Any, proc: subprocess.Popen[bytes], name: str, goal: str, log: Path,
               timeout: float = 30.0) -> Any:
    """Poll ``check()`` every 100 ms until it returns something true (returned); raise when
    ``proc`` (``name``) exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}):\n{tail(log)}")
        try:
            got = check()
            if got:
                return got
        except (OSError, ValueError, http.client.HTTPException) as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{name}: {goal} not within {timeout} s ({last}):\n{tail(log)}")


def wait_models(target: dict[str, str], want: set[str], proc: subprocess.Popen[bytes],
                what: str, log: Path, timeout: float = 30.0) -> None:
    wait_until(lambda: want <= set(get_models(target)), proc, what,
               f"/v1/models listing {sorted(want)}", log, timeout)


def tail(log: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


# -- the targets -----------------------------------------------------------------------------

def start_mock(kids: Children, tmp: Path, prefix: tuple[str, ...] = (),
               name: str = "mock") -> dict[str, Any]:
    """The Node mock (``tmp/name.sock``, a free port), run after ``prefix`` (e.g. ``ip netns
    exec NS``)."""
    port, sock = free_port(), tmp / f"{name}.sock"
    log = tmp / f"{name}.log"
    proc = kids.start(name, [*prefix, "node", str(BENCH / "mock_upstream.js"), "--port",
                             str(port), "--unix", str(sock)], log, stdout=subprocess.PIPE,
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


MOCK_MODELS = {"bench-tcp", "bench-unix"}


def mock_backends(mock: dict[str, Any]) -> str:
    """config.yaml's ``backends:`` for the mock: one over TCP, one over its Unix socket."""
    return (f"backends:\n  - name: mock-tcp\n    url: http://{mock['tcp']}\n"
            f"  - name: mock-unix\n    url: unix:{mock['unix']}\n")


def spawn_gateway(kids: Children, tmp: Path, name: str, rest: str, api_extra: str = "",
                  secrets: str | None = None, prepare: Any = None,
                  prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """``sluice serve`` on its own data dir ``tmp/name``, socket folder ``tmp/s<name>`` and
    a free port. config.yaml: ``api:`` (the port, then ``api_extra``), ``local:``, then
    ``rest``; ``secrets`` is written as secrets.yaml (0600) when given; ``prepare(data)``
    runs once the data dir exists, before the start; ``prefix`` comes before the command
    (e.g. ``ip netns exec NS``). Returns its addresses, process and log (not waited on)."""
    data, sockdir, port = tmp / name, tmp / f"s{name}", free_port()
    data.mkdir(mode=0o700)
    sockdir.mkdir(mode=0o700)
    if prepare is not None:
        prepare(data)
    (data / "config.yaml").write_text(f"api:\n  port: {port}\n{api_extra}"
                                      f"local:\n  socket_dir: {sockdir}\n{rest}")
    if secrets is not None:
        path = data / "secrets.yaml"
        path.touch(mode=0o600)
        path.write_text(secrets)
    log = tmp / f"{name}.log"
    sluice = Path(sys.executable).parent / "sluice"
    proc = kids.start(name, [*prefix, str(sluice), "serve", "--data-dir", str(data)], log,
                      env=tree_env())
    return {"pid": proc.pid, "proc": proc, "log": log, "data": data,
            "tcp": f"127.0.0.1:{port}", "unix": str(sockdir / "sluice.sock")}


def write_result(out_path: Path, result: dict[str, Any], md: str, problems: list[str],
                 smoke: bool) -> int:
    """A run's JSON written, its tables printed, its problems listed; the exit code (a
    smoke run with problems fails)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(md)
    print(f"\nJSON: {out_path}", file=sys.stderr)
    if problems:
        print("problems:\n  " + "\n  ".join(problems), file=sys.stderr)
    return 1 if (smoke and problems) else 0


def tree_env() -> dict[str, str]:
    """The environment for a ``sluice`` child: this tree's ``proxy``/``protocol`` first on
    PYTHONPATH, so that a venv's editable install of another checkout (a git worktree's
    main) is not what gets measured."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def gateway_ready(gw: dict[str, Any]) -> dict[str, Any]:
    """The gateway ``spawn_gateway`` started, once it lists the mock's models on both
    listeners: with its pids and process, as :func:`measure` takes a target."""
    for tr in ("tcp", "unix"):
        wait_models({tr: gw[tr]}, MOCK_MODELS, gw["proc"], "the gateway", gw["log"])
    return {**gw, "pids": with_descendants(gw["pid"]), "procs": [("sluice", gw)]}


def create_access_key(gw: dict[str, Any], name: str, *limits: str) -> str:
    """``sluice keys create`` against a running gateway (its local socket, admin token);
    ``limits``: more options, e.g. ``--rpm 100``."""
    sluice = Path(sys.executable).parent / "sluice"
    proc = subprocess.run([str(sluice), "keys", "create", "--data-dir", str(gw["data"]),
                           "--name", name, *limits, "--json"], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                          env=tree_env())
    if proc.returncode != 0:
        raise RuntimeError(f"sluice keys create failed ({proc.returncode}): {proc.stderr}")
    return str(json.loads(proc.stdout)["key"])


def start_forwarded(kids: Children, tmp: Path, mock: dict[str, Any]) -> dict[str, Any]:
    """S7's pair. Gateway B serves the mock exactly as ``sluice`` does, and asks for an
    access key even from loopback (``require_auth``), as a node on another computer would.
    Gateway A has no backends, load balancing on (priority, failover) and B as its one node,
    over TCP, with that key in its secrets.yaml ``node_keys``. Ready once A lists the mock's
    models as ``owned_by: "remote"`` on both of its listeners and one request through A was
    served by B."""
    b = spawn_gateway(kids, tmp, "b", mock_backends(mock), api_extra="  require_auth: true\n")
    wait_models({"unix": b["unix"]}, MOCK_MODELS, b["proc"], "gateway B", b["log"])
    fingerprint = str(get_json({"unix": b["unix"]}, "/api/v1/node/identity")["fingerprint"])
    key = create_access_key(b, "bench gateway A")
    status, _headers, _body = http_call({"tcp": b["tcp"]}, "GET", "/v1/models")
    if status != 401:  # else the key below would not be what lets A in
        raise RuntimeError(f"gateway B (require_auth) answered {status} without a key")
    a = spawn_gateway(
        kids, tmp, "a",
        "load_balancing:\n  enabled: true\n  strategy: priority\n  failover_enabled: true\n"
        f"nodes:\n  - fingerprint: {fingerprint}\n    name: bench-b\n"
        f"    base_url: http://{b['tcp']}\n    priority: 1\n    enabled: true\n",
        secrets=json.dumps({"node_keys": {fingerprint: key}}) + "\n")

    def remote(tr: str) -> bool:
        entries = {m.get("id"): m.get("owned_by") for m in get_model_entries({tr: a[tr]})}
        return all(entries.get(model) == "remote" for model in MOCK_MODELS)

    for tr in ("tcp", "unix"):
        wait_until(lambda tr=tr: remote(tr), a["proc"], "gateway A",
                   f"/v1/models over {tr} listing {sorted(MOCK_MODELS)} as owned_by remote",
                   a["log"])

    def online() -> Any:
        doc = get_json({"unix": a["unix"]}, "/api/v1/pool/distributed-status")
        ends = (doc or {}).get("endpoints") or []
        return doc if [e.get("status") for e in ends] == ["online"] else None

    distributed = wait_until(online, a["proc"], "gateway A", "node B online", a["log"])
    body = json.dumps({"model": "bench-tcp", "messages": [{"role": "user", "content": "hi"}]})
    status, headers, answer = http_call({"tcp": a["tcp"]}, "POST", "/v1/chat/completions",
                                        body.encode(), timeout=10.0)
    served_by = headers.get("x-sluice-served-by")
    if status != 200 or served_by != f"node:{fingerprint}":
        raise RuntimeError(f"gateway A did not forward a request to B: {status}, served by "
                           f"{served_by!r}: {answer[:300]!r}\n{tail(a['log'])}")
    a_pids, b_pids = with_descendants(a["pid"]), with_descendants(b["pid"])
    return {**a, "pids": a_pids + b_pids, "parts": {"a": a_pids, "b": b_pids},
            "procs": [("gateway A", a), ("gateway B", b)], "fingerprint": fingerprint,
            "b": {"tcp": b["tcp"], "unix": b["unix"]},
            "distributed_status": distributed}


def settled_routing_stats(target: dict[str, str], timeout: float = 5.0) -> Any:
    """A gateway's /api/v1/pool/routing-stats once nothing is in flight (the last attempt's
    bookkeeping may trail the client's last byte), or as it is after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        doc = get_json(target, "/api/v1/pool/routing-stats")
        active = [n.get("activeRequests") for n in (doc or {}).get("nodes", [])]
        active.append(((doc or {}).get("local") or {}).get("activeRequests"))
        if doc is None or not any(active) or time.monotonic() >= deadline:
            return doc
        time.sleep(0.05)


def start_nginx(kids: Children, tmp: Path, mock: dict[str, Any], name: str = "nginx",
                connections: int = 8192, backlog: int = 511) -> dict[str, Any] | None:
    """nginx in front of the mock (``tmp/name``); ``connections``: worker_connections (each
    proxied stream takes two), ``backlog``: the listen backlog (nginx's default, 511)."""
    binary = shutil.which("nginx")
    if binary is None:
        return None
    prefix, port = tmp / name, free_port()
    prefix.mkdir()
    sock = prefix / "nginx.sock"
    location = ("proxy_http_version 1.1; proxy_set_header Connection \"\"; "
                "proxy_buffering off; proxy_request_buffering off;")
    user = "user root;\n" if os.geteuid() == 0 else ""  # so the worker may use the mock's socket
    (prefix / "nginx.conf").write_text(
        f"{user}worker_processes 1;\nworker_rlimit_nofile {2 * connections};\ndaemon off;\n"
        f"error_log {prefix}/err.log;\npid {prefix}/nginx.pid;\n"
        f"events {{ worker_connections {connections}; }}\n"
        "http {\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 60s;\n"
        f"  client_body_temp_path {prefix}/body;\n  proxy_temp_path {prefix}/proxy;\n"
        f"  upstream mock {{ server {mock['tcp']}; keepalive 128; "
        "keepalive_requests 1000000; }\n"
        f"  upstream mock_unix {{ server unix:{mock['unix']}; keepalive 128; "
        "keepalive_requests 1000000; }\n"
        f"  server {{ listen 127.0.0.1:{port} backlog={backlog}; "
        f"location / {{ proxy_pass http://mock; {location} }} }}\n"
        f"  server {{ listen unix:{sock} backlog={backlog}; "
        f"location / {{ proxy_pass http://mock_unix; {location} }} }}\n}}\n")
    log = prefix / "stderr.log"
    proc = kids.start("nginx", [binary, "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf"),
                                "-e", str(prefix / "err.log")], log)
    targets = {"tcp": f"127.0.0.1:{port}", "unix": str(sock)}
    wait_models({"tcp": targets["tcp"]}, {"bench-tcp"}, proc, "nginx", prefix / "err.log")
    wait_models({"unix": targets["unix"]}, {"bench-unix"}, proc, "nginx", prefix / "err.log")
    version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
    entry = {"pid": proc.pid, "proc": proc, "log": prefix / "err.log", **targets}
    return {**entry, "pids": with_descendants(proc.pid), "version": version,
            "procs": [("nginx", entry)]}


# -- measuring -------------------------------------------------------------------------------

class LoadClient:
    """One ``node bench/load.js --serve`` run after ``prefix``: loads one after another."""

    def __init__(self, prefix: tuple[str, ...]) -> None:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.proc = subprocess.Popen([*prefix, "node", str(BENCH / "load.js"), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, preexec_fn=_die_with_parent)

    def run(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps(args).encode() + b"\n")
        stdin.flush()
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not got or not got[0].strip():
            self.close()
            self.err.seek(0)
            raise RuntimeError(f"load.js --serve gave no answer ({self.proc.returncode}): "
                               f"{self.err.read()[-2000:].decode(errors='replace')}")
        return dict(json.loads(got[0]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


class LoadClients:
    """While ``on`` (a smoke run, which judges no figure): one resident load client per
    prefix for every load, instead of a node process a load (its start costs more than a
    smoke load)."""

    def __init__(self) -> None:
        self.on = False
        self.clients: dict[tuple[str, ...], LoadClient] = {}

    def get(self, prefix: tuple[str, ...]) -> LoadClient:
        if prefix not in self.clients:
            self.clients[prefix] = LoadClient(prefix)
        return self.clients[prefix]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


LOADS = LoadClients()


def run_load(target: dict[str, str], model: str, params: dict[str, Any],
             headers: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
             ) -> dict[str, Any]:
    limit = params["duration_s"] + 20 if "duration_s" in params else 50
    args = {"target": target, "model": model, "time_limit_s": limit, **params,
            **({"headers": headers} if headers else {})}
    if LOADS.on:
        return LOADS.get(prefix).run(args, limit + 20)
    proc = subprocess.run([*prefix, "node", str(BENCH / "load.js"), json.dumps(args)],
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
    watcher = None
    if proxy and proxy.get("watch"):
        unix = {"unix": proxy["unix"]}
        watcher = watch.started(proxy["unix"], lambda path: http_call(unix, "GET", path)[0])
    pids = proxy["pids"] if proxy else []
    parts: dict[str, list[int]] = proxy.get("parts", {}) if proxy else {}
    mock_pids = [env["mock"]["pid"]]
    sampler = RssPeak(pids)
    sampler.start()
    part0 = {name: cpu_seconds(p) for name, p in parts.items()}
    cpu0, mock0, t0 = cpu_seconds(pids), cpu_seconds(mock_pids), time.monotonic()
    try:
        model = proxy.get("model", "bench") if proxy else "bench"  # "aliased": the alias
        load = run_load(addr, f"{model}-{transport}", params,
                        proxy.get("headers") if proxy else None)  # "keyed", "limited"
    finally:
        peak = sampler.stop()
        watched = watcher.stop() if watcher is not None else None
    wall = time.monotonic() - t0
    for entry in env.values():
        for name, proc in entry.get("procs", ()):
            if proc["proc"].poll() is not None:
                raise RuntimeError(f"{name} exited ({proc['proc'].returncode}) during "
                                   f"{target}/{transport}:\n{tail(proc['log'])}")
    return {"load": load, "wall_s": round(wall, 3), "watched": watched,
            "proxy_cpu_s": round(cpu_seconds(pids) - cpu0, 3) if proxy else None,
            "part_cpu_s": {name: round(cpu_seconds(p) - part0[name], 3)
                           for name, p in parts.items()},
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
        **{f"{name}_cpu_ms_per_req": None if part is None else round(part * 1000 / per, 4)
           for name in ("a", "b") for part in [run.get("part_cpu_s", {}).get(name)]},
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


def ratio(x: Any, y: Any) -> float | None:
    return round(x / y, 3) if x is not None and y is not None and y > 0 else None


def s7_summary(summary: dict[str, Any], s6: dict[str, Any],
               transports: list[str]) -> dict[str, Any]:
    """S7: the forwarded path (client -> A -> B -> mock) against one gateway (``sluice``):
    CPU per stream of A+B and of A alone, added TTFB and latency vs direct, and their
    ratios (of the medians over rounds) to one gateway's."""
    out: dict[str, Any] = {}
    for sc in S7_SHAPES:
        for tr in transports:
            fw, one = summary.get(f"{sc}/{tr}/forwarded"), summary.get(f"{sc}/{tr}/sluice")
            if fw is None or one is None:
                continue
            cpu = {"forwarded": fw["proxy_cpu_ms_per_req"], "a": fw["a_cpu_ms_per_req"],
                   "b": fw["b_cpu_ms_per_req"], "one_gateway": one["proxy_cpu_ms_per_req"]}
            added = {k: {"forwarded": fw["added_vs_direct_ms"][k],
                         "one_gateway": one["added_vs_direct_ms"][k]}
                     for k in ("ttfb_p50", "lat_p50", "ttfb_p99", "lat_p99")}
            entry: dict[str, Any] = {
                "cpu_ms_per_stream": cpu,
                "cpu_ratio": ratio(cpu["forwarded"], cpu["one_gateway"]),
                "cpu_ratio_a": ratio(cpu["a"], cpu["one_gateway"]),
                "added_ms": added,
                "added_ratio": {k: ratio(v["forwarded"], v["one_gateway"])
                                for k, v in added.items()},
                "gap_p99": {"forwarded": fw["gap_p99"], "one_gateway": one["gap_p99"],
                            "direct": fw["direct_gap_p99"]},
                "complete": fw["all_rounds_complete"],
                "bodies_equal": s6.get(f"{tr}/forwarded", {}).get("equal", False),
                "rounds": fw["rounds"],
            }
            entry["missed"], entry["undetermined"] = judge_s7(entry)
            out[f"{sc}/{tr}"] = entry
    return out


def judge_s7(e: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The parts of the issue's S7 target missed, and those the figures cannot decide (one
    gateway's added TTFB at or below zero: no ratio)."""
    missed, undetermined = [], []
    if not (e["complete"] and e["bodies_equal"]):
        missed.append("delivery")
    for name, value in (("CPU", e["cpu_ratio"]), ("added TTFB", e["added_ratio"]["ttfb_p50"])):
        if value is None:
            undetermined.append(name)
        elif value > S7_MAX_RATIO:
            missed.append(name)
    return missed, undetermined


def s7_met(e: dict[str, Any]) -> str:
    if e["missed"]:
        return "not met: " + ", ".join(e["missed"])
    if e["undetermined"]:
        return "undetermined: " + ", ".join(e["undetermined"])
    return "met"


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
    if tg == "forwarded" and s["a_cpu_ms_per_req"] is not None:
        cpu_txt += (f"{', ' if cpu_txt else ''}A {fmt(s['a_cpu_ms_per_req'])} + "
                    f"B {fmt(s['b_cpu_ms_per_req'])} ms/stream")
    rss = "" if s["proxy_rss_mb"] is None else f"{fmt(s['proxy_rss_mb'])} MB"
    wall = s["wall_s"] or 1
    load = "/".join(f"{100 * (x or 0) / wall:.0f}" for x in
                    (s["client_cpu_s"], s["mock_cpu_s"], s["proxy_cpu_s"]))
    met = "—"
    if tg == "sluice" and not smoke:
        missed = judge(sc, s, True)
        met = "met" if not missed else "not met: " + ", ".join(missed)
    if tg == "forwarded":
        met = "see S7" if not smoke else "—"
        return [f"S7 ({sc})", tr, "forwarded", res, vs, cpu_txt, rss, load, "", met]
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
        ours = tg in ("sluice", "forwarded")
        met = "—" if not ours else ("met" if entry["equal"] else "not met")
        rows.append(["S6", tr, tg, res, "", "", "", "", TARGET_TEXT["S6"] if ours else "",
                     met])
    return markdown(head, rows)


def markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def s7_table(s7: dict[str, Any], smoke: bool) -> str:
    """S7 beside one gateway: medians over rounds, ratios of those medians."""
    head = ["Load", "Transport", "CPU/stream A+B", "A alone", "B alone", "one gateway",
            "A+B / one", "A / one", "added TTFB p50 fwd / one (ratio)",
            "added latency p50 fwd / one (ratio)", "Delivered, bodies", "Issue target", "Met"]
    rows = []
    for key, e in s7.items():
        sc, tr = key.split("/")
        cpu, add, rat = e["cpu_ms_per_stream"], e["added_ms"], e["added_ratio"]
        rows.append([
            f"S7 ({sc})", tr, f"{fmt(cpu['forwarded'])} ms", f"{fmt(cpu['a'])} ms",
            f"{fmt(cpu['b'])} ms", f"{fmt(cpu['one_gateway'])} ms",
            f"x{fmt(e['cpu_ratio'])}", f"x{fmt(e['cpu_ratio_a'])}",
            f"{fmt(add['ttfb_p50']['forwarded'], sign='+')} / "
            f"{fmt(add['ttfb_p50']['one_gateway'], sign='+')} ms (x{fmt(rat['ttfb_p50'])})",
            f"{fmt(add['lat_p50']['forwarded'], sign='+')} / "
            f"{fmt(add['lat_p50']['one_gateway'], sign='+')} ms (x{fmt(rat['lat_p50'])})",
            ("all" if e["complete"] else "INCOMPLETE") + ", " +
            ("= direct's" if e["bodies_equal"] else "DIFFER"),
            TARGET_TEXT["S7"], "—" if smoke else s7_met(e)])
    return markdown(head, rows)


# -- main ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="S1,S2,S3,S4,S5,S6,S7,S8,S9,S9CMD,S10,S11,S3T",
                    help="S6 alone means every scenario; S7 runs S3's and S5's loads "
                         "(which it adds) also through gateway A -> gateway B; S8 holds "
                         "250..4000 streams at once (bench/held.py); S9 cold start of a "
                         "managed model, S9CMD the same for a model whose server is a "
                         "command (bench/ondemand_command.py), S10 idle RSS with 20 "
                         "unloaded ones (bench/ondemand.py; they need the llama extra); "
                         "S11 an "
                         "Ollama /api/chat stream against /v1/chat/completions "
                         "(bench/ollama.py); S3T a Messages stream translated to Chat "
                         "Completions against the chat stream relayed (bench/translate.py); "
                         "S7TLS (only when named; needs root) S1's and "
                         "S3's loads through A -> B over the pinned TLS link against the "
                         "plain one (bench/s7tls.py); S12 (named alone) multi-turn "
                         "conversations on two llama.cpp servers behind gateways, every "
                         "strategy against an oracle, with both controls (bench/multiturn.py); "
                         "S13 (named alone) the queue on one real llama.cpp slot, before and "
                         "after (bench/scheduling.py)")
    ap.add_argument("--transport", choices=("tcp", "unix", "both"), default="both")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run of every scenario, 1 round, no nginx, no warm-ups, one "
                         "resident load client (docs/performance.md); exit 1 unless every "
                         "body equals direct's and every request completed")
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    ap.add_argument("--watch", action="store_true",
                    help="add target 'watched': the same gateway with one live-events "
                         "subscriber and a /metrics scrape every second while it runs")
    ap.add_argument("--aliased", action="store_true",
                    help="add target 'aliased': the same gateway, given model aliases "
                         "(bench/aliases.py), asked for the alias; a table of its CPU per "
                         "request against the unaliased one's (issue 23)")
    ap.add_argument("--keyed", action="store_true",
                    help="add targets 'keyed' and 'limited': the same gateway sent an access "
                         "key without limits, and one with a models pattern and an rpm "
                         "(bench/keys.py); a table of the limited key's CPU per request "
                         "against the unlimited one's (issue 24)")
    ap.add_argument("--json", type=Path, default=None,
                    help="where to write the JSON (default bench/results/latest.json, "
                         "smoke.json for --smoke)")
    opts = ap.parse_args(argv)
    wanted = [s.strip().upper() for s in opts.scenarios.split(",") if s.strip()]
    if "S12" in wanted:  # its own harness on real llama.cpp (bench/multiturn.py), alone
        if wanted != ["S12"]:
            ap.error("S12 runs alone: --scenarios S12")
        from bench import multiturn

        return multiturn.main(["--controls", "--rounds", str(max(1, opts.rounds))]
                              + (["--smoke"] if opts.smoke else [])
                              + (["--json", str(opts.json)] if opts.json else []))
    if "S13" in wanted:  # its own harness on real llama.cpp (bench/scheduling.py), alone
        if wanted != ["S13"]:
            ap.error("S13 runs alone: --scenarios S13")
        from bench import scheduling

        return scheduling.main((["--smoke"] if opts.smoke else [])
                               + (["--json", str(opts.json)] if opts.json else []))
    bad = [s for s in wanted
           if s not in (*SCENARIOS, "S6", "S7", "S8", "S9", "S9CMD", "S10", "S11", "S3T",
                        "S7TLS")]
    if bad:
        ap.error(f"unknown scenario(s): {', '.join(bad)}")
    every = wanted == ["S6"]
    s7 = every or "S7" in wanted
    s8 = every or "S8" in wanted
    s9, s10 = every or "S9" in wanted, every or "S10" in wanted
    s9cmd = every or "S9CMD" in wanted
    s11 = every or "S11" in wanted
    s3t = every or "S3T" in wanted
    s7tls_on = "S7TLS" in wanted
    scenarios = [s for s in SCENARIOS if s in wanted or every or (s7 and s in S7_SHAPES)]
    rounds = 1 if opts.smoke else max(1, opts.rounds)
    transports = ["tcp", "unix"] if opts.transport == "both" else [opts.transport]
    out_path = opts.json or BENCH / "results" / ("smoke.json" if opts.smoke else "latest.json")
    if shutil.which("node") is None:
        print("node is needed (apt-get install -y nodejs)", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # S8: 4000 streams, 2 hops

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    kids = Children()
    tmp = Path(tempfile.mkdtemp(prefix="slb-", dir="/tmp"))  # short: socket paths ≤ 103 bytes
    LOADS.on = opts.smoke
    try:
        env: dict[str, Any] = {}
        s8_started: dict[str, Any] = {}
        if scenarios or s7 or s8 or s11 or s3t:
            env["mock"] = start_mock(kids, tmp)
            # The gateway starts while S7's pair and nginx do (before any measurement).
            started = spawn_gateway(kids, tmp, "data", mock_backends(env["mock"])
                                    + (aliases.CONFIG if opts.aliased else ""))
            if s7:
                env["forwarded"] = start_forwarded(kids, tmp, env["mock"])
            if s8 and opts.smoke:  # S8's fresh gateways start while the loads before it run
                s8_started = held.prestart(kids, tmp, env["mock"], transports, rounds,
                                           nginx=False)  # (no nginx at smoke size)
            if (scenarios or s8) and not (opts.smoke or opts.no_nginx):
                nginx = start_nginx(kids, tmp, env["mock"])
                if nginx is not None:
                    env["nginx"] = nginx
            env["sluice"] = gateway_ready(started)
        if opts.watch and "sluice" in env:
            env["watched"] = {**env["sluice"], "watch": True, "procs": []}
        alias_problems: list[str] = []
        if opts.aliased and "sluice" in env:
            env["aliased"] = {**env["sluice"], "model": aliases.PREFIX, "procs": []}
            alias_problems = aliases.check(http_call, env["sluice"], transports)
        key_problems: list[str] = []
        if opts.keyed and "sluice" in env:
            made = {"keyed": create_access_key(env["sluice"], "bench unlimited"),
                    "limited": create_access_key(env["sluice"], "bench limited", *keys.LIMITED)}
            for name, key in made.items():
                env[name] = {**env["sluice"], "headers": keys.headers(key), "procs": []}
            key_problems = keys.check(http_call, env["sluice"], made, transports)
        targets: list[str] = [t for t in ("direct", "sluice", "aliased", "keyed", "limited",
                                          "watched", "nginx", "forwarded")
                              if t in env or (t == "direct" and "mock" in env)]
        print(f"targets: {', '.join(targets)}; transports: {', '.join(transports)}; "
              f"rounds: {rounds}", file=sys.stderr)
        # Warm-up (connections, pools, JIT); not at smoke size, which checks no figure.
        for tr in transports if scenarios and not opts.smoke else ():
            for tg in targets:
                measure(env, tg, tr, {"stream": False, "concurrency": 8, "count": 400})
                measure(env, tg, tr, {"stream": True, "concurrency": 8, "count": 40})
        runs: list[dict[str, Any]] = []
        for sc in scenarios:
            params = {**SCENARIOS[sc], **(SMOKE[sc] if opts.smoke else {})}
            mine = [t for t in targets if t != "forwarded" or sc in S7_SHAPES]
            for tr in transports:
                for n in range(rounds):
                    # --aliased: every other round the other way round (ABBA), so that no
                    # target gains from its place in a round
                    for tg in (mine[::-1] if (opts.aliased or opts.keyed) and n % 2 else mine):
                        r = measure(env, tg, tr, params)
                        runs.append({"scenario": sc, "transport": tr, "round": n,
                                     "target": tg, "params": params, **r})
                        ld = r["load"]
                        print(f"{sc} {tr:4} round {n + 1} {tg:9}: {ld['completed']}/"
                              f"{ld['started']} ok, {ld['requests_per_s']:,.0f}/s, proxy CPU "
                              f"{r['proxy_cpu_s']} s, {r['wall_s']} s", file=sys.stderr)
        s11_result: dict[str, Any] | None = None
        if s11:
            s11_result = ollama.run_s11(env, transports, rounds, opts.smoke)
        s3t_result = translate.run_s3t(env, transports, rounds, opts.smoke) if s3t else None
        s8_result: dict[str, Any] | None = None
        if s8:
            s8_result = held.run_s8(kids, tmp, env["mock"], transports, rounds, opts.smoke,
                                    nginx="nginx" in env, started=s8_started)
        s9_result: dict[str, Any] | None = None
        s10_result: dict[str, Any] | None = None
        s9cmd_result: dict[str, Any] | None = None
        skipped = ondemand.unavailable() if s9 or s9cmd or s10 else None
        if skipped is not None:
            print(f"S9, S9CMD, S10 skipped: {skipped}", file=sys.stderr)
        else:
            if s9:
                s9_result = ondemand.run_s9(kids, tmp, transports, rounds, opts.smoke)
            if s9cmd:
                s9cmd_result = ondemand_command.run_s9cmd(kids, tmp, transports, rounds,
                                                          opts.smoke)
            if s10:
                s10_result = ondemand.run_s10(kids, tmp, rounds, opts.smoke)
        s7tls_result: dict[str, Any] | None = None
        s7tls_skipped = s7tls.unavailable() if s7tls_on else None
        if s7tls_skipped is not None:
            print(f"S7TLS skipped: {s7tls_skipped}", file=sys.stderr)
        elif s7tls_on:
            s7tls_result = s7tls.run_s7tls(transports, rounds, opts.smoke)
        summary = summarise(runs, scenarios, transports, targets)
        s6 = bodies_check(runs)
        problems = [f"{r['scenario']} {r['transport']} {r['target']} round {r['round'] + 1}: "
                    f"{r['load']['completed']}/{r['load']['started']} complete "
                    f"{r['load']['errors']}" for r in runs
                    if r["load"]["incomplete"] or r["load"]["timed_out"]
                    or r["load"]["completed"] != r["load"]["started"]]
        problems += [f"S6 {k}: {v['mismatches'][:3]}" for k, v in s6.items() if not v["equal"]]
        s7_result: dict[str, Any] | None = None
        md = table(summary, s6, rounds, opts.smoke) if runs else ""
        alias_result = None
        if opts.aliased:
            alias_result = aliases.summary(runs, scenarios, transports,
                                           lambda r: metrics(r)["proxy_cpu_ms_per_req"])
            problems += alias_problems
            md += "\n\n" + aliases.table(alias_result, opts.smoke)
        key_result = None
        if opts.keyed:
            key_result = keys.summary(runs, scenarios, transports,
                                      lambda r: metrics(r)["proxy_cpu_ms_per_req"],
                                      lambda r: metrics(r)["lat_p50"])
            problems += key_problems
            md += "\n\n" + keys.table(key_result, opts.smoke)
        if s7:
            fw = env["forwarded"]
            by_node = f"node:{fw['fingerprint']}"
            problems += [f"S7 {r['scenario']} {r['transport']} round {r['round'] + 1}: served "
                         f"by {r['load']['served_by']}, not only {by_node}" for r in runs
                         if r["target"] == "forwarded" and
                         set(r["load"]["served_by"]) != {by_node}]
            by_shape = s7_summary(summary, s6, transports)
            s7_result = {
                "node_b": fw["fingerprint"], "distributed_status_a": fw["distributed_status"],
                "routing_stats_a": settled_routing_stats({"unix": fw["unix"]}),
                "routing_stats_b": settled_routing_stats({"unix": fw["b"]["unix"]}),
                "by_shape": by_shape,
            }
            md += "\n\n" + s7_table(by_shape, opts.smoke)
        if s8_result is not None:
            problems += s8_result["problems"]
            md += ("\n\n" if md else "") + held.tables(s8_result, opts.smoke)
        if s11_result is not None:
            problems += s11_result["problems"]
            md += ("\n\n" if md else "") + ollama.table(s11_result, opts.smoke)
        if s3t_result is not None:
            problems += s3t_result["problems"]
            md += ("\n\n" if md else "") + translate.table(s3t_result, opts.smoke)
        if s7tls_result is not None:
            problems += s7tls_result["problems"]
            md += ("\n\n" if md else "") + s7tls_report.tables(s7tls_result, opts.smoke)
        for part in (s9_result, s9cmd_result, s10_result):
            problems += part["problems"] if part is not None else []
        if s9_result is not None or s10_result is not None:
            md += ("\n\n" if md else "") + ondemand.tables(s9_result, s10_result, opts.smoke)
        if s9cmd_result is not None:
            md += ("\n\n" if md else "") + ondemand_command.table(s9cmd_result, opts.smoke)
        result = {
            "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": opts.smoke,
                     "rounds": rounds,
                     "scenarios": scenarios + [name for name, on in
                                               (("S8", s8), ("S9", s9),
                                                ("S9CMD", s9cmd), ("S10", s10),
                                                ("S11", s11), ("S3T", s3t),
                                                ("S7TLS", s7tls_on)) if on],
                     "transports": transports,
                     "targets": targets, "cpus": os.cpu_count(), "machine": platform.platform(),
                     "python": platform.python_version(),
                     "node": subprocess.run(["node", "--version"], capture_output=True,
                                            text=True).stdout.strip(),
                     "nginx": env.get("nginx", {}).get("version"),
                     "nofile": [soft, hard]},
            "summary": summary,
            "s6": {"all_equal": all(v["equal"] for v in s6.values()), "by_target": s6},
            "s7": s7_result,
            "aliased": alias_result,
            "keyed": key_result,
            "s8": s8_result,
            "s9": s9_result,
            "s9cmd": s9cmd_result,
            "s10": s10_result,
            "s11": s11_result,
            "s3t": s3t_result,
            "s7tls": s7tls_result,
            "s7tls_skipped": s7tls_skipped,
            "ondemand_skipped": skipped,
            "checks": {"all_complete": not any(p for p in problems if not p.startswith("S6")),
                       "problems": problems},
            "table": md,
            "runs": runs,
        }
        return write_result(out_path, result, md, problems, opts.smoke)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        LOADS.close()
        kids.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
