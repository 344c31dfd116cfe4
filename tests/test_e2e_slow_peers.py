"""A gateway process with a low open-files limit: its accept loop survives EMFILE (the rest of
the slow and misbehaving peers, in process: tests/test_slow_peers.py)."""

from __future__ import annotations

import resource
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client import HEALTH
from tests.figures import Figures
from tests.gateways import GatewayProcess
from tests.rawhttp import T

FD_LIMIT = 64


FLOOD = 80


@pytest.fixture
def low_fd_gateway() -> Iterator[GatewayProcess]:
    folder = Path(tempfile.mkdtemp(prefix="slm-", dir="/tmp"))
    gw = GatewayProcess(folder, "emfile", lb=False)
    gw.launch()
    assert gw.proc is not None
    # As `ulimit -n 64` would (applied from outside, so the gateway's own start is the same).
    resource.prlimit(gw.proc.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    try:
        gw.ready_sync()
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_accept_loop_survives_emfile(low_fd_gateway: GatewayProcess, figures: Figures) -> None:
    """More connections than the gateway has file descriptors: accept fails with EMFILE for
    a while; once the flood closes, a normal request is served and nothing crashed."""
    gw = low_fd_gateway
    assert gw.port is not None
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", gw.port), timeout=T))
        # Requests on the flood: the accepted ones are answered; the rest wait in the backlog.
        for sock in flood:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answered = 0
        for sock in flood[:10]:
            if sock.recv(64).startswith(b"HTTP/1.1 200 "):
                answered += 1
        assert answered == 10
        for _ in range(500):  # bounded (5 s): hold the flood until accept has hit the limit
            if "too many open files" in gw.log().lower():
                break
            time.sleep(0.01)
        time.sleep(0.5)  # five accept retries while starved: they must not flood the log
    finally:
        for sock in flood:
            sock.close()
    status, doc = 0, None
    for _ in range(200):  # bounded: the backlog of closed connections drains first
        try:
            status, doc = gw.call_sync("GET", "/health")
            break
        except OSError:
            pass
    log = gw.log()
    figures.count("bad_inputs_tried", FLOOD)
    crashed = "Traceback" in log or status != 200
    figures.count("crashes", 1 if crashed else 0)
    assert status == 200, log[-2000:]
    assert doc == {**HEALTH, "identity": doc["identity"]}  # a real serve has one (SPEC §16)
    assert doc["identity"].startswith("sha256:")
    assert "Traceback" not in log, log[-4000:]
    assert "too many open files" in log.lower(), "the flood never hit the descriptor limit"
    assert log.count("accept failed") <= 3, log[-4000:]  # once per starved episode

