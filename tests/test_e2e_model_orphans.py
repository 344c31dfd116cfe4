"""A user's model server (SPEC §11.1) never outlives its gateway: ``sluice serve`` killed
with SIGKILL (the OOM killer, a crash) takes its command servers with it, although the
program does not watch its parent; and a gateway that starts stops the servers a previous
gateway of the same data dir left behind (recorded in state.json with their start times),
never a process that merely has a recorded pid now. Real ``sluice serve`` processes
(tests/gateways.py); the servers are checked by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from protocol.config import ModelConfig
from tests.conftest import alive
from tests.gateways import GatewayProcess

GIB = 1 << 30
# A server that knows nothing of sluice and never looks at its parent.
HTTP_SERVER = (sys.executable, "-m", "http.server", "${PORT}", "--bind", "127.0.0.1")


def start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b") ", 1)[1].split()[19].decode()


@pytest.fixture
def sleepers() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two processes that lead sessions of their own, as model servers do."""
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    procs = (subprocess.Popen(argv, start_new_session=True),
             subprocess.Popen(argv, start_new_session=True))
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test may leave behind when it fails: killed at its end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def with_models(gw: GatewayProcess, *models: ModelConfig) -> GatewayProcess:
    gw.config = attrs.evolve(gw.config, models=models)
    return gw


async def until_gone(pid: int, seconds: float) -> None:
    with trio.fail_after(seconds):
        while alive(pid):
            await trio.sleep(0.02)


async def load_web(gw: GatewayProcess) -> int:
    """Once the gateway is ready, load its model ``web``: the server's pid."""
    await gw.ready()
    reply = await gw.call("POST", "/api/v1/models/local/web/load", admin=True)
    assert reply.status == 200, reply.body
    pid: int = reply.json()["pid"]
    return pid


async def test_a_command_server_dies_with_a_killed_gateway(
        short_tmp: Path, strays: list[int]) -> None:
    gw = with_models(GatewayProcess(short_tmp / "g", "orphans"),
                     ModelConfig(name="web", command=HTTP_SERVER, health="/", memory=GIB))
    gw.launch()
    try:
        pid = await load_web(gw)
        strays.append(pid)
        assert alive(pid)
        started = start_time(pid)
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        await until_gone(pid, 3.0)
        # It was in the state file, with its start time, for a next gateway to stop had
        # it survived.
        state = json.loads((gw.data_dir / "state.json").read_text())
        assert {"name": "web", "pid": pid, "startTime": started,
                "stopSignal": "SIGTERM"} in state["modelServers"]
    finally:
        gw.stop()


async def test_the_workers_of_a_command_go_with_it(short_tmp: Path, strays: list[int]
                                                   ) -> None:
    """A server that started workers of its own: they are gone too (its process group)."""
    script = (f"sleep 300 & exec {sys.executable} -m http.server ${{PORT}} "
              "--bind 127.0.0.1")
    gw = with_models(GatewayProcess(short_tmp / "g", "workers"),
                     ModelConfig(name="web", command=("/bin/sh", "-c", script), health="/",
                                 memory=GIB))
    gw.launch()
    try:
        pid = await load_web(gw)
        kids = children(pid)
        workers = [kid for kid in kids if command_line(kid)[:2] == ["sleep", "300"]]
        assert len(workers) == 1, kids
        strays += [pid, *kids]
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        await until_gone(pid, 3.0)
        await until_gone(workers[0], 3.0)
    finally:
        gw.stop()


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as kids:
        return [int(kid) for kid in kids.read().split()]


def command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [part.decode() for part in cmdline.read().split(b"\0") if part]


async def test_a_new_gateway_stops_what_a_killed_one_left(
        short_tmp: Path,
        sleepers: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
    left, other = sleepers  # a server left behind; a pid now another process's
    gw = with_models(GatewayProcess(short_tmp / "g", "restart"))
    gw.data_dir.mkdir(parents=True)
    (gw.data_dir / "state.json").write_text(json.dumps({
        "pid": 0x3FFFFFF0,  # the dead gateway (no such pid)
        "modelServers": [
            {"name": "other", "pid": other.pid, "startTime": "1",  # not when it started
             "stopSignal": "SIGTERM"},
            {"name": "left", "pid": left.pid, "startTime": start_time(left.pid),
             "stopSignal": "SIGTERM"}]}))
    gw.launch()
    try:
        await gw.ready()
        await until_gone(left.pid, 10.0)
        assert left.wait() == -signal.SIGTERM
        assert other.poll() is None, "a process whose start time differs was signalled"
    finally:
        gw.stop()
