"""S7TLS (issue 34): S7's two gateways over SPEC §16's pinned TLS 1.3 node link against the
plain link (URL + access key), in the same run.

Gateway B serves the Node mock and opens its node listener, which needs external access:
so B and its mock run in network namespace ``b``, and two A gateways in namespace ``a``
(tests/netns.py's ``Lan``: a veth pair, private addresses, removed at the end), where
binding 0.0.0.0 reaches nothing but the other namespace. ``plain`` has B as a node by URL
with a key B made (``sluice keys create``); ``pinned`` paired with B by a code (``sluice
pair`` on B, ``sluice nodes add URL --code`` on A), so it reaches B only over TLS on B's
node port. Both A's are otherwise alike (load balancing on, no backends).

The load client (bench/load.js) reaches an A over its Unix socket (from here) or its
loopback TCP port (run inside namespace ``a``). Per shape and transport, rounds interleave
the links (ABBA). CPU is A's and B's own, summed over their threads from
``/proc/PID/task/*/schedstat`` (nanoseconds, not 10 ms ticks). Figures: A+B CPU per request
(and per chunk), pinned/plain ratios paired per round, added latency and TTFB p50 (pinned
minus plain, paired), new TCP connections in B's namespace per run (reuse), and what one
handshake costs, from bench/tls_link.py (one process, both ends).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import s7tls_report
from bench.s7tls_report import LINKS

SHAPES: dict[str, dict[str, Any]] = {  # S1's, S3's, and S3's paced 1 ms a chunk
    "S1": {"stream": False, "concurrency": 1, "count": 2000},
    "S3": {"stream": True, "chunks": 100, "gap_ms": 0, "concurrency": 1, "count": 300},
    "S3 paced": {"stream": True, "chunks": 100, "gap_ms": 1, "concurrency": 1, "count": 100},
}
SMOKE: dict[str, dict[str, Any]] = {
    "S1": {"count": 100}, "S3": {"count": 10}, "S3 paced": {"count": 4, "chunks": 20}}
WARM = ({"stream": False, "concurrency": 1, "count": 200},
        {"stream": True, "chunks": 100, "concurrency": 1, "count": 20})
HANDSHAKES = {False: ("--rounds", "7", "--requests", "1000", "--handshakes", "300"),
              True: ("--rounds", "1", "--requests", "20", "--handshakes", "10")}
NODE_PORT = 39443  # inside namespace b: nothing else there
LB = "load_balancing:\n  enabled: true\n  strategy: priority\n  failover_enabled: true\n"


def _base() -> Any:
    """bench/run.py's helpers (imported here: run.py imports this module)."""
    from bench import run as base
    return base


def unavailable() -> str | None:
    """Why S7TLS cannot run here, or None."""
    if os.geteuid() != 0:
        return "S7TLS runs gateways in two network namespaces: it needs root"
    if shutil.which("ip") is None:
        return "S7TLS needs the ip command (iproute2)"
    return None


def cpu_ns(pids: list[int]) -> int:
    """On-CPU nanoseconds of these processes, summed over their threads."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def passive_opens(pid: int) -> int:
    """TCP connections accepted so far in the network namespace of ``pid``."""
    head, values = [line.split() for line in Path(f"/proc/{pid}/net/snmp").read_text()
                    .splitlines() if line.startswith("Tcp:")][:2]
    return int(values[head.index("PassiveOpens")])


def bytes_in(prefix: tuple[str, ...]) -> dict[int, int]:
    """Bytes received so far by each local port's established TCP connections in a network
    namespace (``ss -tin`` run after ``prefix``)."""
    done = subprocess.run([*prefix, "ss", "-Htin", "state", "established"],
                          capture_output=True, text=True, timeout=30, check=True)
    got: dict[int, int] = {}
    port = 0
    for line in done.stdout.splitlines():
        if line[:1].isspace():
            for field in line.split():
                if field.startswith("bytes_received:"):
                    got[port] = got.get(port, 0) + int(field.split(":")[1])
        elif line.strip():
            port = int(line.split()[2].rsplit(":", 1)[1])
    return got


def cli(prefix: tuple[str, ...], *args: str) -> Any:
    """``sluice ARGS --json`` run after ``prefix``; its JSON answer."""
    base = _base()
    sluice = Path(sys.executable).parent / "sluice"
    done = subprocess.run([*prefix, str(sluice), *args, "--json"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          preexec_fn=base._die_with_parent, env=base.tree_env())
    if done.returncode != 0:
        raise RuntimeError(f"sluice {' '.join(args)}: {done.returncode} {done.stderr}")
    return json.loads(done.stdout)


def start(kids: Any, tmp: Path, lan: Any) -> dict[str, Any]:
    """The mock and B in namespace b, A ``plain`` and A ``pinned`` in namespace a, each A
    ready once it lists the mock's models as remote, B is online and one chat through it
    was served by B."""
    base = _base()
    ns_a, ns_b = tuple(lan.prefix("a")), tuple(lan.prefix("b"))
    mock = base.start_mock(kids, tmp, ns_b, name="mockb")
    b = base.spawn_gateway(kids, tmp, "b", base.mock_backends(mock), prefix=ns_b,
                           api_extra="  require_auth: true\n  allow_external_access: true\n"
                                     f"  node_port: {NODE_PORT}\n")
    pinned = base.spawn_gateway(kids, tmp, "at", LB, prefix=ns_a)  # needs nothing of B's
    base.wait_models({"unix": b["unix"]}, base.MOCK_MODELS, b["proc"], "gateway B", b["log"])
    health = base.get_json({"unix": b["unix"]}, "/health")
    fingerprint = base.get_json({"unix": b["unix"]}, "/api/v1/node/identity")["fingerprint"]
    if health.get("nodePort") != NODE_PORT:
        raise RuntimeError(f"gateway B has no node listener: /health {health}")
    b_url = f"http://{lan.addr['b']}:{b['tcp'].rsplit(':', 1)[1]}"
    key = base.create_access_key(b, "bench plain A")
    node = (f"nodes:\n  - fingerprint: {fingerprint}\n    name: bench-b\n"
            f"    base_url: {b_url}\n    priority: 1\n    enabled: true\n")
    a = {"plain": base.spawn_gateway(kids, tmp, "ap", LB + node, prefix=ns_a,
                                     secrets=json.dumps({"node_keys": {fingerprint: key}})),
         "pinned": pinned}
    for gw in a.values():
        base.wait_until(lambda gw=gw: base.get_json({"unix": gw["unix"]}, "/health"),
                        gw["proc"], "gateway A", "/health", gw["log"])
    code = cli(ns_b, "pair", "--data-dir", str(b["data"]))["code"]
    paired = cli(ns_a, "nodes", "add", b_url, "--code", code, "--data-dir",
                 str(a["pinned"]["data"]))
    if (paired.get("fingerprint"), paired.get("link")) != (fingerprint, "pinned"):
        raise RuntimeError(f"pairing A with B did not pin B: {paired}")
    b_pids = base.with_descendants(b["pid"])
    for link, gw in a.items():
        _ready(base, gw, fingerprint, f"gateway A ({link})")
        gw.update(link=link, ns=ns_a, a_pids=base.with_descendants(gw["pid"]))
    b.update(pids=b_pids, ns=ns_b, node_port=NODE_PORT, api_port=int(b["tcp"].rsplit(":", 1)[1]))
    with ThreadPoolExecutor() as pool:  # the two CLIs side by side
        listed = {link: pool.submit(cli, (), "nodes", "list", "--data-dir", str(gw["data"]))
                  for link, gw in a.items()}
        nodes = {link: future.result() for link, future in listed.items()}
    return {"mock": mock, "b": b, "a": a, "fingerprint": fingerprint,
            "node_port": NODE_PORT, "b_url": b_url, "nodes": nodes}


def _ready(base: Any, gw: dict[str, Any], fingerprint: str, name: str) -> None:
    unix = {"unix": gw["unix"]}

    def remote() -> bool:
        entries = {m.get("id"): m.get("owned_by") for m in base.get_model_entries(unix)}
        return all(entries.get(model) == "remote" for model in base.MOCK_MODELS)

    def online() -> bool:
        ends = (base.get_json(unix, "/api/v1/pool/distributed-status") or {}).get("endpoints")
        return [e.get("status") for e in ends or []] == ["online"]

    for check, goal in ((remote, "the mock's models listed as remote"), (online, "B online")):
        base.wait_until(check, gw["proc"], name, goal, gw["log"])
    body = json.dumps({"model": "bench-unix", "messages": [{"role": "user", "content": "hi"}]})
    status, headers, answer = base.http_call(unix, "POST", "/v1/chat/completions",
                                             body.encode(), timeout=10.0)
    if status != 200 or headers.get("x-sluice-served-by") != f"node:{fingerprint}":
        raise RuntimeError(f"{name} did not forward to B: {status} {answer[:300]!r}\n"
                           f"{base.tail(gw['log'])}")


def measure(env: dict[str, Any], link: str, tr: str, params: dict[str, Any]
            ) -> dict[str, Any]:
    """One load through A ``link`` over transport ``tr``: A's and B's CPU, wall time, TCP
    connections accepted in B's namespace, and the bytes B received on its node port and
    on its API port meanwhile (on connections open before and after)."""
    base = _base()
    gw, b = env["a"][link], env["b"]
    in0 = bytes_in(b["ns"])
    a0, b0, opens0 = cpu_ns(gw["a_pids"]), cpu_ns(b["pids"]), passive_opens(b["pid"])
    t0 = time.monotonic()
    load = base.run_load({tr: gw[tr]}, f"bench-{tr}", params,
                         prefix=gw["ns"] if tr == "tcp" else ())
    wall = time.monotonic() - t0
    a1, b1, opens1 = cpu_ns(gw["a_pids"]), cpu_ns(b["pids"]), passive_opens(b["pid"])
    in1 = bytes_in(b["ns"])
    for name, proc in (("gateway B", b), *((f"gateway A ({k})", v)
                                           for k, v in env["a"].items())):
        if proc["proc"].poll() is not None:
            raise RuntimeError(f"{name} exited ({proc['proc'].returncode}) during {link}/"
                               f"{tr}:\n{base.tail(proc['log'])}")
    return {"load": load, "wall_s": round(wall, 3), "a_cpu_s": (a1 - a0) / 1e9,
            "b_cpu_s": (b1 - b0) / 1e9, "b_accepted": opens1 - opens0,
            "b_bytes_in": {port: max(0, in1.get(b[port], 0) - in0.get(b[port], 0))
                           for port in ("node_port", "api_port")}}


def handshake(tmp: Path, smoke: bool) -> dict[str, Any]:
    """bench/tls_link.py's figures: a fresh pinned connection against a fresh plain one
    (CPU of both ends, wall), and a reused one each."""
    base = _base()
    out = tmp / "tls_link.json"
    done = subprocess.run([sys.executable, str(base.BENCH / "tls_link.py"), *HANDSHAKES[smoke],
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, preexec_fn=base._die_with_parent,
                          env=base.tree_env(), cwd=base.ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"bench/tls_link.py failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    cpu, wall = doc["cpu_us"], doc["wall_us"]
    doc["handshake_cpu_us"] = round(cpu["pinned fresh"] - cpu["plain fresh"], 1)
    doc["handshake_wall_ms"] = round((wall["pinned fresh"] - wall["plain fresh"]) / 1000, 3)
    doc["reused_cpu_ratio"] = round(cpu["pinned"] / cpu["plain"], 3)
    return doc


def run_s7tls(transports: list[str], rounds: int, smoke: bool) -> dict[str, Any]:
    """Every measurement of S7TLS; returns the JSON section (``problems`` among it)."""
    from tests.netns import Lan  # the namespaces the LAN tests use
    base = _base()
    kids = base.Children()
    tmp = Path(tempfile.mkdtemp(prefix="slt-", dir="/tmp"))
    lan = Lan()
    runs: list[dict[str, Any]] = []
    try:
        lan.make()
        env = start(kids, tmp, lan)
        for tr in transports if not smoke else ():  # a smoke run judges no figure
            for link in LINKS:
                for params in WARM:
                    measure(env, link, tr, params)
        for shape, params in SHAPES.items():
            params = {**params, **(SMOKE[shape] if smoke else {})}
            for tr in transports:
                for n in range(rounds):
                    for link in LINKS if n % 2 == 0 else LINKS[::-1]:
                        r = measure(env, link, tr, params)
                        runs.append({"shape": shape, "transport": tr, "round": n,
                                     "link": link, "params": params, **r})
                        ld = r["load"]
                        print(f"S7TLS {shape:8} {tr:4} round {n + 1} {link:6}: "
                              f"{ld['completed']}/{ld['started']} ok, A+B CPU "
                              f"{r['a_cpu_s'] + r['b_cpu_s']:.3f} s, {r['wall_s']} s",
                              file=sys.stderr)
        hs = handshake(tmp, smoke)
        result = s7tls_report.summary(runs, list(SHAPES), transports, env["fingerprint"])
        result.update(runs=runs, handshake=hs, node_b=env["fingerprint"],
                      node_port=env["node_port"], b_url=env["b_url"], lan=repr(lan),
                      nodes_a={link: [{k: n.get(k) for k in ("fingerprint", "link", "pin")}
                                      for n in nodes] for link, nodes in env["nodes"].items()})
        result["problems"] += s7tls_report.problems(result)
        return result
    finally:
        base.LOADS.close()  # a smoke run's load clients in namespace a end before it does
        kids.stop_all()
        lan.remove()
        shutil.rmtree(tmp, ignore_errors=True)

