"""The model servers' parts that need no model: socket hygiene, log rotation, a missing model
file, a missing llama.cpp install (the launcher without llama.cpp and its parent watch, with
real processes: tests/test_e2e_model_processes.py)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from protocol.config import ModelConfig
from proxy.models.llama_backends import LlamaBackends
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


async def test_a_missing_model_file_fails_at_once_and_says_why(
        nursery: trio.Nursery, short_tmp: Path, llama_answer: list[str] | None) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("the gateway refuses managed models without llama.cpp installed")
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(name="ghost", path="models/none.gguf"),))
    gateway = Gateway(open_settings(short_tmp / "data", cfg),
                      llama=LlamaBackends.answered(llama_answer))  # no child asked
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


