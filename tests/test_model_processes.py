"""The model servers' parts that need no model: socket hygiene, log rotation, the launcher's
parent watch, a missing model file, a missing llama.cpp install."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from protocol.config import ModelConfig
from proxy.models.logs import RotatingLog
from proxy.models.process import remove_leftover_socket, socket_file_name
from proxy.server import Gateway, StartupError
from tests.client import chat_body, request
from tests.conftest import RunningGateway, gateway_config, open_settings


def test_socket_names_are_safe() -> None:
    assert socket_file_name("smollm2-135m") == "m-smollm2-135m.sock"
    assert socket_file_name("org/model:q4") == "m-org_model_q4.sock"


def test_only_sockets_are_removed(short_tmp: Path) -> None:
    sock_path = short_tmp / "m-x.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()  # llama.cpp leaves exactly this behind
    remove_leftover_socket(sock_path)
    assert not sock_path.exists()
    plain = short_tmp / "m-y.sock"
    plain.write_text("not a socket")
    remove_leftover_socket(plain)
    assert plain.read_text() == "not a socket"
    remove_leftover_socket(short_tmp / "missing.sock")  # nothing there: no error


def test_log_rotation(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "logs" / "m.log", max_bytes=100, keep=2)
    for i in range(10):
        log.write(f"line {i:02d} ".encode() * 4)  # 32 bytes a write
    log.close()
    names = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert names == ["m.log", "m.log.1", "m.log.2"]
    assert all((tmp_path / "logs" / n).stat().st_size <= 100 for n in names)
    assert b"line 09" in (tmp_path / "logs" / "m.log").read_bytes()
    assert oct((tmp_path / "logs" / "m.log").stat().st_mode & 0o777) == "0o600"


def test_missing_llama_cpp_is_one_clear_error(short_tmp: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xllamacpp" else real(name, *a))
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(name="m", path="models/m.gguf"),))
    with pytest.raises(StartupError, match=r"pip install 'sluice\[llama\]'"):
        Gateway(open_settings(short_tmp / "data", cfg))


def test_launcher_without_llama_cpp_says_how_to_install(short_tmp: Path) -> None:
    # Run the launcher with xllamacpp hidden from it.
    code = ("import sys; sys.modules['xllamacpp'] = None; "
            "from proxy.models.launcher import main; "
            "raise SystemExit(main(['--model', 'x.gguf', '--alias', 'm', '--listen', "
            "'127.0.0.1:0']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 3
    assert "pip install 'sluice[llama]'" in result.stderr


async def test_a_missing_model_file_fails_at_once_and_says_why(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("the gateway refuses managed models without llama.cpp installed")
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(name="ghost", path="models/none.gguf"),))
    gateway = Gateway(open_settings(short_tmp / "data", cfg))
    await nursery.start(gateway.run)
    gw = RunningGateway(gateway)
    listed = (await request(gw.unix, "GET", "/v1/models")).json()["data"]
    assert [(m["id"], m["sluice"]) for m in listed] == [
        ("ghost", {"state": "unloaded", "apis": {"messages": "native", "responses": "native"}})]
    for _ in range(2):  # the second within the back-off: at once, the same reason
        reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("ghost"))
        assert reply.status == 503
        error = reply.json()["error"]
        assert error["code"] == "model_load_failed"
        assert "cannot read" in error["message"]
        assert "none.gguf" in error["message"]
    info = (await request(gw.unix, "GET", "/api/v1/inference/status")).json()
    assert info["available"] is False
    entry = info["managedModels"][0]
    assert (entry["name"], entry["state"], entry["pid"]) == ("ghost", "failed", None)
    assert "cannot read" in entry["lastError"]


# A stand-in for the launcher's wait: the real parent watch, then the stop signal.
_WATCHED_CHILD = """
import signal, sys
from pathlib import Path
from proxy.models.launcher import watch_parent
out = Path(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
watch_parent(interval=0.05)
out.write_text("ready")
signal.sigwait({signal.SIGTERM})
out.write_text("stopped")
"""
# Starts the child from a thread that ends once the child is ready, as trio's
# open_process does from a worker thread (which exits after 10 s idle), and stays up until
# killed.
_PARENT = """
import subprocess, sys, threading, time
from pathlib import Path
def spawn():
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    while not (Path(sys.argv[2]).exists() and Path(sys.argv[2]).read_text() == "ready"):
        time.sleep(0.01)
    print(child.pid, flush=True)
starter = threading.Thread(target=spawn)
starter.start()
starter.join()
time.sleep(120)
"""


def _wait_for(path: Path, text: str, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text() == text:
            return True
        time.sleep(0.02)
    return False


def test_a_model_server_outlives_the_thread_that_started_it_not_the_gateway(
        tmp_path: Path) -> None:
    """The launcher's parent watch: the thread that spawned it ending leaves it running
    (PR_SET_PDEATHSIG would have stopped it: the demo model died every 10 s), and the
    parent process dying stops it."""
    out = tmp_path / "child-state"
    root = str(Path(__file__).resolve().parent.parent)
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _WATCHED_CHILD, str(out)],
                              stdout=subprocess.PIPE, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())  # the starting thread ends after this
        time.sleep(0.5)  # ten checks of the watch later
        assert out.read_text() == "ready"
        os.kill(child_pid, 0)  # still running
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
    assert _wait_for(out, "stopped")


def test_a_model_server_whose_gateway_is_already_gone_stops_at_once() -> None:
    """``--parent`` names the gateway: a launcher started after it died (its parent is
    someone else by then) exits 0 before loading anything."""
    root = str(Path(__file__).resolve().parent.parent)
    code = ("from proxy.models.launcher import watch_parent\n"
            "watch_parent(parent=1)\n"  # we were started by pytest, not by pid 1
            "print('still here')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0
    assert done.stdout == ""
