"""The local fallback listener seen through ``sluice keys`` and ``sluice status`` run as child
processes (the listeners in process: tests/test_listeners.py)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import trio

from proxy.datadir import STATE_FILE
from proxy.server import Gateway
from tests import test_listeners as quick
from tests.client import Client
from tests.conftest import free_port
from tests.test_listeners import (
    Places,
    break_every_candidate,
    listening,
    settings_for,
)

places = quick.places  # its fixture


async def test_fallback_binds_loopback_with_a_notification(
        places: Places, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    break_every_candidate(places)
    port = free_port()
    gateway = Gateway(settings_for(places, socket_dir=places.xdg, fallback_port=port,
                                   allow_external_access=True))
    await nursery.start(gateway.run)
    ctx = gateway.ctx
    assert ctx.socket_path is None
    assert ctx.local_tcp_port == port
    assert listening(port) == {"127.0.0.1"}  # never a wildcard, external access or not
    [note] = [n for n in ctx.notifications.all() if n["code"] == "local_socket_unavailable"]
    for folder in (places.xdg, places.tmp_dir, places.data_sockets):
        assert str(folder) in note["message"]
    assert f"127.0.0.1:{port}" in note["message"]
    assert any(r.levelno == logging.WARNING and "127.0.0.1:" in r.getMessage()
               for r in caplog.records)
    state = json.loads((places.data / STATE_FILE).read_text())
    assert state["localTcpPort"] == port
    assert state["socketPath"] is None
    client = await Client.open(f"127.0.0.1:{port}")
    reply = await client.request("GET", "/api/v1/inference/status")
    await client.aclose()
    assert reply.status == 200
    body = reply.json()
    assert body["localTcp"] == f"127.0.0.1:{port}"
    assert "socketPath" not in body
    # The CLI finds the fallback port in state.json and gets through with the admin token.
    made = await trio.run_process(
        [sys.executable, "-m", "proxy", "keys", "create", "--name", "cli", "--data-dir",
         str(places.data)], capture_stdout=True, capture_stderr=True, check=False)
    assert made.returncode == 0, made.stderr
    assert made.stdout.decode().strip().startswith("sk-sluice-")
    shown = await trio.run_process(
        [sys.executable, "-m", "proxy", "status", "--data-dir", str(places.data)],
        capture_stdout=True, capture_stderr=True, check=False)
    assert shown.returncode == 0, shown.stderr
    assert f"warning: {note['message']}" in shown.stdout.decode()

