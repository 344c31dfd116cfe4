"""scripts/fault-upstream as a real process: its list, serving a fault, refusing a foreign
address (the fault kit in process: tests/test_faults_kit.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.client import CHAT
from tests.conftest import free_port
from tests.faultkit import body
from tools.faults import wire
from tools.faults.behaviours import TABLE

ROOT = Path(__file__).resolve().parent.parent


SCRIPT = ROOT / "scripts" / "faulty-upstream"


def _env() -> dict[str, str]:
    # The venv running these tests, and this checkout's code.
    return {**os.environ, "SLUICE_VENV": sys.prefix, "PYTHONPATH": str(ROOT)}


def test_list_prints_one_line_per_behaviour() -> None:
    out = subprocess.run([str(SCRIPT), "--list"], env=_env(), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(TABLE)


def test_script_serves_a_real_process() -> None:
    port = free_port()
    proc = subprocess.Popen([str(SCRIPT), "--listen", f"127.0.0.1:{port}", "--model", "m1"],
                            env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"faulty upstream listening on " \
                                                 f"http://127.0.0.1:{port}"
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=5) as client:
            assert client.get("/health").json() == {"status": "ok"}
            ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
            assert ids[0] == "m1"
            assert {"fault:reset-after-3", "fault:status-502", "fault:ok"} <= set(ids)
            reply = client.post(CHAT, content=body(stream=True))
            assert reply.headers["content-type"] == "text/event-stream"
            assert reply.content == b"".join(wire.stream_chunks(True, "faulty", 4))
            reply = client.post(CHAT, content=body(), headers={"x-fault": "status;code=502"})
            assert reply.status_code == 502
            assert reply.json()["error"] == {"code": 502, "message": "Bad Gateway",
                                             "type": "server_error"}
            reply = client.post(CHAT, content=body(model="fault:rate-limit-5"))
            assert (reply.status_code, reply.headers["retry-after"]) == (429, "5")
        # A plain socket sees the reset: SO_LINGER 0 before any byte.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-fault: reset\r\n"
                         b"Content-Length: 2\r\n\r\n{}")
            with pytest.raises(ConnectionResetError):
                sock.recv(100)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_script_refuses_a_foreign_address() -> None:
    done = subprocess.run([str(SCRIPT), "--listen", "0.0.0.0:8199"], env=_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "only 127.0.0.1" in done.stderr

