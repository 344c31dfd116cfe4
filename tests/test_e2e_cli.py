"""The ``sluice`` command as a user runs it: real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio
import yaml

from protocol.config import default_config, dump_config_yaml
from proxy.cli.commands import check_config
from tests.conftest import free_port, gateway_config
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.gateways import reap, sigterm_mid_stream

SLUICE = [sys.executable, "-m", "proxy"]


def sluice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=30,
                          env=env, check=False)


def test_check_config(short_tmp: Path) -> None:
    good = short_tmp / "good.yaml"
    good.write_text(dump_config_yaml(default_config()))
    result = sluice("check-config", "--config", str(good))
    assert result.returncode == 0, result.stderr
    bad = short_tmp / "bad.yaml"
    bad.write_text("timeouts:\n  request:\n    streaming:\n      chunk_interval: 61s\n")
    result = sluice("check-config", "--config", str(bad))
    assert result.returncode == 2
    assert "timeouts.request.streaming.chunk_interval" in result.stderr
    typo = short_tmp / "typo.yaml"
    typo.write_text("api:\n  prot: 8080\n")
    result = sluice("check-config", "--config", str(typo))
    assert result.returncode == 2
    assert "api.prot" in result.stderr
    broken = short_tmp / "broken.yaml"
    broken.write_text("api:\n  port: [1,\n")
    result = sluice("check-config", "--config", str(broken))
    assert result.returncode == 2
    assert "line" in result.stderr


def test_serve_refuses_invalid_config_before_binding(short_tmp: Path) -> None:
    port = free_port()
    sockets = short_tmp / "s"
    data = short_tmp / "data"
    data.mkdir(mode=0o700)
    cfg = gateway_config([], socket_dir=sockets)
    text = dump_config_yaml(attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=port)))
    (data / "config.yaml").write_text(text.replace("connection: 10s", "connection: 16s"))
    result = sluice("serve", "--data-dir", str(data))
    assert result.returncode == 2
    assert "timeouts.connection" in result.stderr
    assert not sockets.exists() or not any(sockets.iterdir())
    import socket

    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


async def test_serve_writes_config_and_drains_on_sigterm(nursery: trio.Nursery,
                                                         short_tmp: Path) -> None:
    events = sse_events(10)
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", sse_stream(events, gap=0.1))
    await nursery.start(up.serve)
    data = short_tmp / "data"
    runtime = short_tmp / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "SLUICE_DATA_DIR": str(data), "XDG_RUNTIME_DIR": str(runtime)}
    # First start on an empty data dir: a complete config.yaml appears.
    port = free_port()
    proc = await trio.lowlevel.open_process([*SLUICE, "serve"], env=env,
                                            stderr=subprocess.PIPE)
    try:
        with trio.fail_after(15):  # listening (or exited: port 39080 may be taken here)
            while not (runtime / "sluice" / "sluice.sock").exists() and proc.poll() is None:
                await trio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await proc.wait()
    written = yaml.safe_load((data / "config.yaml").read_text())
    assert set(written) == {"api", "local", "backends", "models", "load_balancing", "nodes",
                            "aliases", "ollama_api", "discovery", "model_loading", "observability",
                            "health_checks", "scheduling",
                            "circuit_breaker", "timeouts"}
    assert set(written["timeouts"]) == {"connection", "request", "model_load", "health_check"}
    assert oct((data / "secrets.yaml").stat().st_mode & 0o777) == "0o600"
    assert oct(data.stat().st_mode & 0o777) == "0o700"
    admin = yaml.safe_load((data / "secrets.yaml").read_text())["admin_token"]
    assert admin not in (data / "config.yaml").read_text()

    # Second start with a backend: SIGTERM lets the running stream finish, then exits 0.
    cfg = gateway_config([("fake", up.url)], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=port))
    (data / "config.yaml").write_text(dump_config_yaml(cfg))
    proc = await trio.lowlevel.open_process([*SLUICE, "serve"], env=env,
                                            stderr=subprocess.PIPE)
    sock = short_tmp / "s" / "sluice.sock"
    try:
        with trio.fail_after(15):  # state.json is written once every listener listens
            while not sock.exists() or not (data / "state.json").exists():
                await trio.sleep(0.05)
        code, reply = await sigterm_mid_stream(proc, f"unix:{sock}", up)
    finally:
        await reap(proc)
    assert code == 0
    assert reply.complete
    assert reply.body == b"".join(events)
    assert not sock.exists()
    assert proc.stderr is not None
    log = (await proc.stderr.receive_some(1 << 20)).decode()
    assert "draining" in log
    assert admin not in log


def test_cli_commands_do_not_load_the_gateway(short_tmp: Path) -> None:
    """``sluice status`` and friends import nothing of the server (nor trio, nor h11)."""
    probe = ("import sys\n"
             "from proxy.main import main\n"
             f"code = main(['status', '--data-dir', {str(short_tmp)!r}])\n"
             "print(code, sorted(m for m in sys.modules\n"
             "                   if m.split('.')[0] in ('trio', 'h11') or m == 'proxy.server'))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.stdout.strip() == "1 []", result.stderr
    assert "no gateway is running" in result.stderr


# ---------------------------------------------------------------------------- check-config


def test_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(dump_config_yaml(default_config()))
    assert check_config(path) == 0
    assert capsys.readouterr().out == f"ok: {path}\n"


def test_check_config_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("nodes:\n  - {fingerprint: a, name: a, base_url: 'http://h', priority: 0}\n")
    assert check_config(path) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "nodes[0].priority" in out.err
    assert "255" in out.err


def test_check_config_malformed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("api: [\n")
    assert check_config(path) == 2
    assert "line 2, column 1" in capsys.readouterr().err


def test_check_config_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config(tmp_path / "nope.yaml") == 2
    assert "not found" in capsys.readouterr().err
