"""A real LAN of two hosts for end-to-end tests: two Linux network namespaces joined by a
veth pair, each with ``lo`` up and one address of a private /30 (10.213.N.0/30, N from the
pid; being inside the namespaces, it cannot meet another run's), plus the plumbing the
tests need: link down/up, a ``tbf`` slow link, running a command (a gateway, the ``sluice``
CLI, a small HTTP client, any helper process) inside a namespace, and ``tcpdump`` on a
host's veth (:class:`Tcpdump`).

Every name starts with ``sl-<pid>-<n>`` (devices ``sl<pid>n<n>a`` / ``...b``: at most 15
bytes; ``n`` counts this process's Lans) so nothing collides with another run, another
pytest-xdist worker or another Lan of the same process; ``Lan.remove()`` deletes both
namespaces (which deletes the veth pair too) and is safe to call twice or after a half-made setup.
``unavailable()`` says why namespaces cannot be made here (None when they can).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fakenode import ThreadedUpstream
from tests.fakeupstream import FakeUpstream
from tests.gateways import START_TIMEOUT, GatewayProcess

IP = shutil.which("ip") or "ip"
TC = shutil.which("tc") or "tc"
TCPDUMP = shutil.which("tcpdump") or "tcpdump"
COMMAND_TIMEOUT = 15.0


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (not root here)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if shutil.which("tc") is None:
        return "the tc command (iproute2) is not installed"
    return None


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = COMMAND_TIMEOUT,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class Lan:
    """Host A and host B (see the module docstring)."""

    made = 0  # Lans made by this process

    def __init__(self) -> None:
        pid = os.getpid()
        Lan.made += 1
        n = Lan.made % 1000
        self.ns = {"a": f"sl-{pid}-{n}-a", "b": f"sl-{pid}-{n}-b"}
        self.dev = {"a": f"sl{pid}n{n}a", "b": f"sl{pid}n{n}b"}
        assert all(len(dev) <= 15 for dev in self.dev.values()), self.dev
        subnet = f"10.213.{pid % 250 + 1}"
        self.addr = {"a": f"{subnet}.1", "b": f"{subnet}.2"}

    def __repr__(self) -> str:
        return f"Lan({self.ns['a']} {self.addr['a']} <-> {self.ns['b']} {self.addr['b']})"

    def make(self) -> Lan:
        try:
            for host in ("a", "b"):
                _run([IP, "netns", "add", self.ns[host]])
            _run([IP, "link", "add", self.dev["a"], "type", "veth", "peer", "name",
                  self.dev["b"]])
            for host in ("a", "b"):
                ns, dev = self.ns[host], self.dev[host]
                _run([IP, "link", "set", dev, "netns", ns])
                _run([IP, "-n", ns, "addr", "add", f"{self.addr[host]}/30", "dev", dev])
                _run([IP, "-n", ns, "link", "set", "lo", "up"])
                _run([IP, "-n", ns, "link", "set", dev, "up"])
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        for ns in self.ns.values():
            _run([IP, "netns", "del", ns], check=False)
        # A veth pair left in the root namespace by a setup cut short.
        _run([IP, "link", "del", self.dev["a"]], check=False)

    # -- inside a namespace ---------------------------------------------------------------

    def prefix(self, host: str) -> list[str]:
        return [IP, "netns", "exec", self.ns[host]]

    def run(self, host: str, argv: Sequence[str], *, stdin: str | None = None,
            check: bool = True, timeout: float = COMMAND_TIMEOUT
            ) -> subprocess.CompletedProcess[str]:
        return _run([*self.prefix(host), *argv], stdin=stdin, check=check, timeout=timeout)

    def link(self, host: str, up: bool) -> None:
        """``ip link set <host's veth> up|down`` inside its namespace."""
        _run([IP, "-n", self.ns[host], "link", "set", self.dev[host], "up" if up else "down"])

    def shape(self, host: str, rate: str, burst: str, latency: str) -> None:
        """A ``tbf`` slow link on the egress of ``host``'s veth."""
        self.run(host, [TC, "qdisc", "replace", "dev", self.dev[host], "root", "tbf", "rate",
                        rate, "burst", burst, "latency", latency])

    def unshape(self, host: str) -> None:
        self.run(host, [TC, "qdisc", "del", "dev", self.dev[host], "root"], check=False)

    def overlimits(self, host: str) -> int:
        """How often the tbf on ``host``'s veth held a packet back (0 without one)."""
        out = self.run(host, [TC, "-s", "-j", "qdisc", "show", "dev", self.dev[host]]).stdout
        for qdisc in json.loads(out or "[]"):
            if qdisc.get("kind") == "tbf":
                return int(qdisc.get("overlimits", 0))
        return 0

    def http(self, host: str, url: str, headers: dict[str, str]) -> int:
        """The status of ``GET url`` made by a client on ``host`` (a Python process run
        inside its namespace)."""
        code = ("import http.client, json, sys, urllib.parse\n"
                "u = urllib.parse.urlsplit(sys.argv[1])\n"
                "c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)\n"
                "c.request('GET', u.path, headers=json.loads(sys.argv[2]))\n"
                "print(c.getresponse().status)\n")
        out = self.run(host, [sys.executable, "-c", code, url, json.dumps(headers)])
        return int(out.stdout.strip())

    def sluice(self, host: str, *args: str, stdin: str | None = None) -> str:
        """A ``sluice`` command run inside ``host``'s namespace; its standard output."""
        return self.run(host, [sys.executable, "-m", "proxy", *args], stdin=stdin).stdout


class LanRun:
    """A :class:`Lan` made for a test module, a temporary folder, and the fake model servers
    and gateways started on it: :func:`lan_run` stops them all and removes the rest."""

    def __init__(self, lan: Lan, folder: Path) -> None:
        self.lan = lan
        self.folder = folder
        self.gateways: list[GatewayProcess] = []
        self.fakes: list[ThreadedUpstream] = []
        self.captures: list[Tcpdump] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    def serve(self, up: FakeUpstream) -> FakeUpstream:
        """Serve ``up`` from its own thread until the run ends."""
        self.fakes.append(ThreadedUpstream(up))
        self.fakes[-1].start()
        return up

    def launch(self, host: str, gw: GatewayProcess) -> GatewayProcess:
        """Start ``gw`` inside ``host``'s namespace (:func:`launch_in`); stopped at the end."""
        self.gateways.append(gw)
        return launch_in(self.lan, host, gw)

    def capture(self, host: str, path: Path) -> Tcpdump:
        """A :class:`Tcpdump` on ``host``'s veth, started (stopped at the end if not before)."""
        self.captures.append(Tcpdump(self.lan, host, path))
        return self.captures[-1].start()

    def spawn(self, host: str, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """``argv`` started inside ``host``'s namespace, its output to ``log``; ended with
        SIGTERM (then SIGKILL) at the end."""
        with log.open("wb") as out:
            proc = subprocess.Popen([*self.lan.prefix(host), *argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc


@contextmanager
def lan_run(label: str, prefix: str, reason: str | None = None) -> Iterator[LanRun]:
    """A :class:`LanRun`, or a loud skip (``NO <label>: why``) when namespaces cannot be
    made here (or for ``reason``). At the end: gateways stopped, fakes stopped, namespaces
    removed, no gateway log with a traceback, the folder deleted."""
    reason = unavailable() or reason
    if reason is not None:
        pytest.skip(f"NO {label}: {reason}")
    run = LanRun(Lan(), Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    try:
        try:
            run.lan.make()
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"NO {label}: network namespaces cannot be made here: {exc}")
        yield run
    finally:
        for capture in run.captures:
            capture.stop()
        for proc in run.processes:
            end(proc, signal.SIGTERM)
        for gw in run.gateways:
            gw.stop()
        for fake in run.fakes:
            fake.stop()
        run.lan.remove()
        for gw in run.gateways:
            assert "Traceback" not in gw.log(), gw.log()
        shutil.rmtree(run.folder, ignore_errors=True)


def launch_in(lan: Lan, host: str, gw: GatewayProcess) -> GatewayProcess:
    """Start ``gw`` inside ``host``'s namespace; wait (bounded) until ``GET /health``
    answers 200 on its Unix socket (the test's own namespace cannot reach its TCP port).
    Status and admin calls then go over the Unix socket."""
    gw.prefix = lan.prefix(host)
    gw.default_via = "unix"
    gw.launch()
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert gw.proc is not None
        if gw.proc.poll() is not None:
            raise AssertionError(f"gateway {gw.name} exited:\n{gw.log()}")
        gw.port = gw.port or _state_port(gw.data_dir)
        if gw.port is not None and unix_health(gw.socket_path):
            return gw
        time.sleep(0.05)
    raise AssertionError(f"gateway {gw.name} not ready in {START_TIMEOUT}s:\n{gw.log()}")


def _state_port(data_dir: Path) -> int | None:
    try:
        port = json.loads((data_dir / "state.json").read_text()).get("tcpPort")
    except (OSError, ValueError):
        return None
    return port if isinstance(port, int) else None


def unix_health(path: Path) -> bool:
    """``GET /health`` over the Unix socket at ``path`` answers 200."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(path))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200 ")
    except OSError:
        return False


def end(proc: subprocess.Popen[bytes], sig: int) -> int:
    """Send ``sig`` to a process still running, wait (bounded), SIGKILL if it is still
    there; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Tcpdump:
    """``tcpdump -i <host's veth> -w path`` inside ``host``'s namespace: every packet that
    crosses the veth, whole (``-s 0``), handed over at once (``--immediate-mode``) and
    written as it comes (``-U``). ``start()`` returns once tcpdump says it is listening.
    ``stop()`` sends one UDP datagram with a marker to the other host, waits (bounded) until
    the file holds it (so every packet before it is in the file too), then ends tcpdump
    with SIGINT; it returns tcpdump's counts, ``captured`` and ``dropped`` (by the kernel).
    """

    def __init__(self, lan: Lan, host: str, path: Path) -> None:
        self.lan = lan
        self.host = host
        self.path = path
        self.log = path.with_name(path.name + ".log")
        self.marker = f"sluice-capture-end-{os.urandom(8).hex()}".encode()
        self.proc: subprocess.Popen[bytes] | None = None
        self.counts: dict[str, int] | None = None

    def start(self) -> Tcpdump:
        # -Z root: Debian's tcpdump would become user tcpdump before opening the file.
        argv = [*self.lan.prefix(self.host), TCPDUMP, "-i", self.lan.dev[self.host], "-n",
                "-s", "0", "--immediate-mode", "-U", "-w", str(self.path), "-Z", "root"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=out)
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while "listening on" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tcpdump did not start: {self.log.read_text()}")
            time.sleep(0.02)
        return self

    def _mark(self) -> None:
        other = self.lan.addr["b" if self.host == "a" else "a"]
        code = ("import socket, sys\n"
                "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(\n"
                "    sys.argv[1].encode(), (sys.argv[2], 9))\n")
        self.lan.run(self.host, [sys.executable, "-c", code, self.marker.decode(), other])
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while not (self.path.exists() and self.marker in self.path.read_bytes()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"tcpdump did not write its marker to {self.path}")
            time.sleep(0.02)

    def stop(self) -> dict[str, int]:
        if self.counts is None and self.proc is not None:
            try:
                if self.proc.poll() is None:
                    self._mark()
            finally:
                end(self.proc, signal.SIGINT)
                said = self.log.read_text(errors="replace")
                self.counts = {what: int(n) for n, what in
                               re.findall(r"(\d+) packets? (captured|dropped)", said)}
        return self.counts or {}
