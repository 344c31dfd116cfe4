"""S12's two computers on one machine: two llama.cpp servers (the bundled launcher, 1 thread
and 2 slots each, on Unix sockets), a ``sluice serve`` node gateway in front of each (its
server as its one backend), and a third gateway balancing over the two as network nodes
(no backends, load balancing on, the strategy under test, health checks every second so
that the nodes' slots are fresh). Every process has its own data dir; all five start at
once and are stopped (process groups, SIGTERM then SIGKILL) when the cluster ends, so each
strategy starts cold. Standard library only (with bench/run.py's process helpers)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from bench import multiturn_texts as texts
from bench import run as bench

NODES = ("a", "b")
HEALTH = "health_checks:\n  interval: 1s\n  timeout: 800ms\n"
READY_TIMEOUT = 90.0  # two llama.cpp servers and three gateways on two busy cores


class Cluster:
    """The five processes of one S12 run (see the module docstring). Use as a context
    manager: ``with Cluster(gguf, "cache-aware", context) as c: c.balancer ...``."""

    def __init__(self, gguf: Path, strategy: str, context: int, parallel: int = 2,
                 threads: int = 1) -> None:
        self.gguf = gguf
        self.strategy = strategy
        self.context = context
        self.parallel = parallel
        self.threads = threads
        self.kids = bench.Children()
        self.tmp = Path(tempfile.mkdtemp(prefix="slmt-", dir="/tmp"))  # short socket paths
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> gateway (+ fingerprint, llama)
        self.balancer: dict[str, Any] = {}
        self.started_s: float | None = None

    def __repr__(self) -> str:
        return f"Cluster({self.strategy!r}, {self.tmp}, nodes={sorted(self.nodes)})"

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- start and stop ----------------------------------------------------------------

    def _llama(self, name: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
        sock, log = self.tmp / f"l{name}.sock", self.tmp / f"llama-{name}.log"
        proc = self.kids.start(f"llama-{name}", [
            sys.executable, "-m", "proxy.models.launcher", "--model", str(self.gguf),
            "--alias", texts.MODEL, "--listen", str(sock), "--context", str(self.context),
            "--parallel", str(self.parallel), "--threads", str(self.threads)],
            log, stdout=subprocess.PIPE, env=bench.tree_env())
        return proc, sock, log

    def start(self) -> None:
        began = time.monotonic()
        llamas = {name: self._llama(name) for name in NODES}
        for name, (_proc, sock, _log) in llamas.items():
            fingerprint = f"bench-node-{name}"
            gw = bench.spawn_gateway(
                self.kids, self.tmp, f"n{name}",
                f"backends:\n  - name: llama-{name}\n    url: unix:{sock}\n{HEALTH}",
                prepare=lambda data, fp=fingerprint: (data / "node.id").write_text(fp + "\n"))
            self.nodes[name] = {**gw, "fingerprint": fingerprint, "llama": str(sock)}
        entries = "".join(
            f"  - fingerprint: {n['fingerprint']}\n    name: node-{name}\n"
            f"    base_url: http://{n['tcp']}\n    priority: {len(NODES) - i}\n"
            f"    enabled: true\n" for i, (name, n) in enumerate(self.nodes.items()))
        self.balancer = bench.spawn_gateway(
            self.kids, self.tmp, "balancer",
            f"load_balancing:\n  enabled: true\n  strategy: {self.strategy}\n"
            f"  failover_enabled: true\nnodes:\n{entries}{HEALTH}")
        for name, (proc, _sock, log) in llamas.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().strip()  # the launcher's "listening ..."
            if not line.startswith("listening "):
                raise RuntimeError(f"llama.cpp {name} did not start:\n{bench.tail(log)}")
        self._wait_ready()
        self.started_s = round(time.monotonic() - began, 2)

    def _wait_ready(self) -> None:
        """Each node gateway lists the model with its server's slots; the balancer has both
        nodes online, their slots known, and lists the model as remote."""
        for name, node in self.nodes.items():
            def slots(node: dict[str, Any] = node) -> bool:
                entries = bench.get_model_entries({"unix": node["unix"]})
                return any(m.get("id") == texts.MODEL and
                           ((m.get("sluice") or {}).get("slots") or {}).get("total")
                           == self.parallel for m in entries)

            bench.wait_until(slots, node["proc"], f"node gateway {name}",
                             "its llama.cpp server's slots", node["log"], READY_TIMEOUT)
        b = self.balancer

        def online() -> bool:
            doc = bench.get_json({"unix": b["unix"]}, "/api/v1/pool/distributed-status")
            ends = (doc or {}).get("endpoints") or []
            return (len(ends) == len(NODES) and all(e.get("status") == "online" for e in ends)
                    and any(m.get("id") == texts.MODEL and len(m.get("availableOn") or ())
                            == len(NODES) for m in (doc or {}).get("models") or ()))

        bench.wait_until(online, b["proc"], "the balancing gateway", "both nodes online",
                         b["log"], READY_TIMEOUT)

    def stop(self) -> None:
        self.kids.stop_all()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- what the benchmark asks ---------------------------------------------------------

    def warm_up(self) -> None:
        """One tiny request straight to each llama.cpp server (not through a gateway, so no
        index learns it): the model's pages and first compute warm, no prompt cached that
        any conversation shares."""
        for name, node in self.nodes.items():
            body = texts.body([{"role": "user", "content": f"Hi {name}"}], 1)
            status, _h, answer = bench.http_call({"unix": node["llama"]}, "POST",
                                                 "/v1/chat/completions", body, timeout=60.0)
            if status != 200:
                raise RuntimeError(f"llama.cpp {name} warm-up: {status} {answer[:200]!r}")

    def node_target(self, index: int) -> dict[str, str]:
        """The oracle's pin: node gateway ``index % 2`` (its Unix socket)."""
        return {"unix": self.nodes[NODES[index % len(NODES)]]["unix"]}

    def node_label(self, index: int) -> str:
        return f"node:{self.nodes[NODES[index % len(NODES)]]['fingerprint']}"

    def target(self) -> dict[str, str]:
        return {"unix": self.balancer["unix"]}

    def labels(self) -> dict[str, str]:
        """``node:<fingerprint>`` -> the node's short name (a, b)."""
        return {f"node:{n['fingerprint']}": name for name, n in self.nodes.items()}

    def gateway_view(self) -> dict[str, Any]:
        """The balancer's routing stats and its request log's affinity and cached tokens
        (the gateway's side of what the client measured)."""
        b = {"unix": self.balancer["unix"]}
        stats = bench.settled_routing_stats(b)
        log = bench.get_json(b, "/api/v1/requests?limit=1000") or {}
        entries = [{k: e.get(k) for k in ("servedBy", "affinity", "cachedTokens", "ttfbMs",
                                          "status", "usage")}
                   for e in log.get("requests") or ()]
        return {"routing_stats": stats, "request_log": entries}
