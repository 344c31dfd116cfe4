"""``sluice service install|uninstall|status`` (SPEC §19) run as a child process, with a temporary
HOME and XDG_CONFIG_HOME and a fake ``systemctl`` first on PATH; the written unit checked by
systemd-analyze and its ExecStart run as a real gateway; launchd's agent (in process, with a
fake ``launchctl`` as a child). The unit's words and the other platforms: tests/test_service.py."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import yaml

from protocol.config import dump_config_yaml
from proxy.cli.service_host import Host
from tests.client import request
from tests.conftest import gateway_config
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.gateways import reap, sigterm_mid_stream
from tests.test_service import _service, unit_env, unit_exec

UNIT = "sluice.service"


FAKE_SYSTEMCTL = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_LOG"
if [ "${FAKE_RC:-0}" != 0 ]; then
    echo "Failed to connect to bus: No medium found" >&2
    exit "$FAKE_RC"
fi
case "$2" in
    is-active) echo active ;;
    is-enabled) echo enabled ;;
esac
exit 0
"""


FAKE_LAUNCHCTL = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_LOG"
if [ "$1" = print ]; then
    printf '%s = {\\n\\tactive count = 1\\n\\tstate = running\\n\\tpid = 4242\\n}\\n' "$2"
fi
exit "${FAKE_RC:-0}"
"""


class Box:
    """A temporary user: HOME, XDG_CONFIG_HOME, a bin folder first on PATH with the fake
    tools, and the log of their calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.config_home = root / "config home"
        self.bin = root / "bin"
        self.log = root / "calls"
        for folder in (self.home, self.config_home, self.bin):
            folder.mkdir(parents=True)
        self.env = {
            "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.config_home),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "FAKE_LOG": str(self.log), "USER": "tester",
            "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path.cwd())),
        }

    def tool(self, name: str, script: str) -> None:
        path = self.bin / name
        path.write_text(script)
        path.chmod(0o755)

    @property
    def unit(self) -> Path:
        return self.config_home / "systemd" / "user" / UNIT

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def sluice(self, *args: str, python: str = sys.executable,
               **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "proxy", "service", *args], capture_output=True,
                              text=True, timeout=60, env={**self.env, **env}, check=False,
                              cwd=self.root)


@pytest.fixture
def box(tmp_path: Path) -> Box:
    made = Box(tmp_path)
    made.tool("systemctl", FAKE_SYSTEMCTL)
    return made


def odd_python(folder: Path) -> Path:
    """This test run's Python (its packages too) as a virtualenv whose path holds a space,
    ``%h`` and ``%``: what the unit must quote for systemd to find the program."""
    venv = folder / "my env %h 100%"
    (venv / "bin").mkdir(parents=True)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    (venv / "bin" / "python").symlink_to(base)
    in_venv = sys.prefix != sys.base_prefix
    (venv / "pyvenv.cfg").write_text(
        f"home = {base.parent}\n"
        f"include-system-site-packages = {'false' if in_venv else 'true'}\n")
    if in_venv:
        (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    return venv / "bin" / "python"


def test_install_writes_enables_and_starts(box: Box) -> None:
    data = box.root / "my data"
    result = box.sluice("install", SLUICE_DATA_DIR=str(data))
    assert result.returncode == 0, result.stderr
    assert f"wrote {box.unit}" in result.stdout
    assert unit_exec(box.unit.read_text()) == [sys.executable, "-m", "proxy", "serve",
                                               "--data-dir", str(data)]
    assert unit_env(box.unit.read_text()) == {"PYTHONPATH": box.env["PYTHONPATH"]}
    assert box.calls() == ["--user daemon-reload", f"--user enable --now {UNIT}"]
    assert "started, and enabled" in result.stdout

    # Again, on another data dir: the unit is rewritten, and one running is restarted.
    other = box.root / "other"
    result = box.sluice("install", "--data-dir", str(other))
    assert result.returncode == 0, result.stderr
    assert f"rewrote {box.unit}" in result.stdout
    assert unit_exec(box.unit.read_text())[-1] == str(other)
    assert box.calls()[2:] == ["--user daemon-reload", f"--user try-restart {UNIT}",
                               f"--user enable --now {UNIT}"]


@pytest.mark.parametrize("how", ["argument", "relative", "SLUICE_DATA_DIR", "XDG_DATA_HOME",
                                 "home"])
def test_the_unit_runs_the_data_dir_sluice_serve_would(box: Box, how: str) -> None:
    args: list[str] = []
    env = {"SLUICE_DATA_DIR": "", "XDG_DATA_HOME": ""}
    if how == "argument":
        args, expected = ["--data-dir", str(box.root / "d")], box.root / "d"
    elif how == "relative":
        args, expected = ["--data-dir", "rel/d"], box.root / "rel" / "d"  # from the cwd
    elif how == "SLUICE_DATA_DIR":
        env["SLUICE_DATA_DIR"], expected = str(box.root / "s"), box.root / "s"
    elif how == "XDG_DATA_HOME":
        env["XDG_DATA_HOME"], expected = str(box.root / "x"), box.root / "x" / "sluice"
    else:
        expected = box.home / ".local" / "share" / "sluice"
    result = box.sluice("install", "--no-start", *args, **env)
    assert result.returncode == 0, result.stderr
    assert unit_exec(box.unit.read_text())[3:] == ["serve", "--data-dir", str(expected)]
    assert box.calls() == []  # --no-start: only written


def test_install_with_config_and_without_xdg_config_home(box: Box) -> None:
    config = box.root / "conf" / "my sluice.yaml"
    config.parent.mkdir()
    config.write_text("{}\n")
    env = {k: v for k, v in box.env.items() if k != "XDG_CONFIG_HOME"}
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "service", "install", "--config", "conf/my sluice.yaml",
         "--data-dir", str(box.root / "d")], capture_output=True, text=True, timeout=60,
        env=env, cwd=box.root, check=False)
    assert result.returncode == 0, result.stderr
    unit = box.home / ".config" / "systemd" / "user" / UNIT
    assert unit_exec(unit.read_text())[-4:] == ["--data-dir", str(box.root / "d"),
                                                "--config", str(config)]
    assert not box.unit.exists()
    missing = box.sluice("install", "--config", str(box.root / "nothing.yaml"))
    assert missing.returncode == 2
    assert "nothing.yaml: no such file" in missing.stderr


def test_without_a_user_manager_the_unit_is_written_and_the_commands_said(box: Box) -> None:
    result = box.sluice("install", "--data-dir", str(box.root / "d"), FAKE_RC="1")
    assert result.returncode == 0, result.stderr
    assert box.unit.exists()
    assert "Failed to connect to bus: No medium found" in result.stderr
    assert ("    systemctl --user daemon-reload\n"
            f"    systemctl --user enable --now {UNIT}\n") in result.stderr
    assert box.calls() == ["--user daemon-reload"]  # nothing more is tried

    # No systemctl at all: written, and the same commands, with that reason.
    box.unit.unlink()
    result = box.sluice("install", "--data-dir", str(box.root / "d"),
                        PATH=str(box.root / "empty"))
    assert result.returncode == 0, result.stderr
    assert box.unit.exists()
    assert "systemctl is not on PATH" in result.stderr
    assert f"    systemctl --user enable --now {UNIT}\n" in result.stderr


def test_uninstall(box: Box) -> None:
    result = box.sluice("uninstall")
    assert result.returncode == 0
    assert f"not installed (no {box.unit})" in result.stdout
    assert box.calls() == []

    assert box.sluice("install").returncode == 0
    before = len(box.calls())
    result = box.sluice("uninstall")
    assert result.returncode == 0, result.stderr
    assert not box.unit.exists()
    assert box.calls()[before:] == [f"--user disable --now {UNIT}", "--user daemon-reload"]
    assert f"stopped and disabled {UNIT}" in result.stdout
    assert f"removed {box.unit}" in result.stdout


def test_uninstall_without_a_user_manager_removes_what_disable_would(box: Box) -> None:
    assert box.sluice("install", "--no-start").returncode == 0
    wants = box.unit.parent / "default.target.wants" / UNIT
    wants.parent.mkdir()
    wants.symlink_to(box.unit)  # as `systemctl --user enable` made it once
    result = box.sluice("uninstall", FAKE_RC="1")
    assert result.returncode == 0, result.stderr
    assert not box.unit.exists()
    assert not wants.is_symlink()
    assert "Failed to connect to bus" in result.stderr
    assert f"    systemctl --user stop {UNIT}\n" in result.stderr


@pytest.mark.slow  # four runs of the CLI
def test_status(box: Box) -> None:
    result = box.sluice("status")
    assert result.returncode == 0
    assert f"not installed (no {box.unit})" in result.stdout

    data = box.root / "d $x"
    assert box.sluice("install", "--data-dir", str(data)).returncode == 0
    result = box.sluice("status")
    assert result.returncode == 0, result.stderr
    assert f"installed: {box.unit}" in result.stdout
    assert f"data dir: {data}\n" in result.stdout
    assert "is-active: active\n" in result.stdout
    assert "is-enabled: enabled\n" in result.stdout
    assert "gateway: none runs for that data dir now" in result.stdout

    result = box.sluice("status", FAKE_RC="1")
    assert result.returncode == 0, result.stderr
    assert "is-active" not in result.stdout
    assert ("systemd cannot tell whether it runs: systemd's user manager cannot be reached "
            "(Failed to connect to bus: No medium found)") in result.stdout


def test_systemd_analyze_verify_accepts_the_unit(box: Box) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("SKIPPED LOUDLY: systemd-analyze is not installed, so the written unit "
                    "is not verified (scripts/test installs the systemd package)")
    python = odd_python(box.root)
    data = box.root / "data %h $HOME \"quoted\" back\\slash"
    result = box.sluice("install", "--no-start", "--data-dir", str(data), python=str(python))
    assert result.returncode == 0, result.stderr
    text = box.unit.read_text()
    assert unit_exec(text)[0] == str(python)
    assert unit_exec(text)[-1] == str(data)
    # verify checks the syntax and that the program exists (so its quoting held)
    verified = subprocess.run([tool, "verify", str(box.unit)], capture_output=True, text=True,
                              timeout=60, check=False)
    assert verified.returncode == 0, verified.stderr
    assert UNIT not in verified.stdout + verified.stderr  # no warning about it either


@pytest.mark.slow  # a gateway's start and a stream's drain
async def test_the_units_exec_start_is_a_gateway_that_drains(box: Box, short_tmp: Path,
                                                             nursery: trio.Nursery) -> None:
    events = sse_events(10)
    up = FakeUpstream()
    up.on("POST", "/v1/chat/completions", sse_stream(events, gap=0.1))
    await nursery.start(up.serve)
    python = odd_python(box.root)
    data = box.root / "data dir %h $HOME"
    data.mkdir(mode=0o700)
    cfg = gateway_config([("fake", up.url)], socket_dir=short_tmp / "s")
    (data / "config.yaml").write_text(dump_config_yaml(cfg))
    installed = await trio.to_thread.run_sync(
        lambda: box.sluice("install", "--no-start", "--data-dir", str(data),
                           python=str(python)))
    assert installed.returncode == 0, installed.stderr
    text = box.unit.read_text()
    command = unit_exec(text)
    assert command[0] == str(python)
    # What the user manager gives it: a plain environment and the unit's variables.
    env = {"PATH": os.defpath, "HOME": str(box.home), "XDG_RUNTIME_DIR": str(short_tmp),
           **unit_env(text)}
    proc = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.PIPE,
                                            cwd="/")
    try:
        with trio.fail_after(20):
            while not (data / "state.json").exists():
                assert proc.poll() is None, "the gateway exited"
                await trio.sleep(0.05)
            sock = f"unix:{short_tmp / 's' / 'sluice.sock'}"
            while True:
                try:
                    if (await request(sock, "GET", "/health")).status == 200:
                        break
                except OSError:
                    pass
                await trio.sleep(0.05)
        status = await trio.to_thread.run_sync(lambda: box.sluice("status"))
        assert f"gateway: running for that data dir (pid {proc.pid})" in status.stdout
        # A fresh install while a gateway runs by hand on its data dir: said.
        assert box.unit.exists()
        box.unit.unlink()
        again = await trio.to_thread.run_sync(
            lambda: box.sluice("install", "--data-dir", str(data), python=str(python)))
        assert again.returncode == 0, again.stderr
        assert f"a gateway already runs for this data dir (pid {proc.pid})" in again.stderr
        token = yaml.safe_load((data / "secrets.yaml").read_text())["admin_token"]
        said = status.stdout + status.stderr + again.stdout + again.stderr
        assert token not in said + box.unit.read_text()
        code, reply = await sigterm_mid_stream(proc, sock, up)
    finally:
        await reap(proc)
    assert proc.stderr is not None
    log = (await proc.stderr.receive_some(1 << 20)).decode()
    assert code == 0, log
    assert reply.complete  # the stream in flight finished: a drain
    assert reply.body == b"".join(events)
    assert "draining" in log


def test_launchd_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    box = Box(tmp_path)
    box.tool("launchctl", FAKE_LAUNCHCTL)
    host = Host("darwin", box.env, 501)
    agent = box.home / "Library" / "LaunchAgents" / "dev.sluice.gateway.plist"
    data = tmp_path / "Application Support" / "sluice"
    assert _service(host, "install", "--data-dir", str(data)) == 0
    doc = plistlib.loads(agent.read_bytes())
    assert doc["ProgramArguments"] == [sys.executable, "-m", "proxy", "serve",
                                       "--data-dir", str(data)]
    assert doc["StandardErrorPath"] == str(data / "sluice.log")
    assert data.is_dir()  # launchd opens the log before the gateway makes the folder
    assert box.calls() == [f"bootstrap gui/501 {agent}"]
    out = capsys.readouterr().out
    assert f"wrote {agent}" in out

    assert _service(host, "install", "--data-dir", str(data)) == 0  # again: reloaded
    assert box.calls()[1:] == ["bootout gui/501/dev.sluice.gateway",
                               f"bootstrap gui/501 {agent}"]
    assert f"rewrote {agent}" in capsys.readouterr().out

    assert _service(host, "status") == 0
    out = capsys.readouterr().out
    assert f"installed: {agent}" in out
    assert f"data dir: {data}\n" in out
    assert "launchd: loaded (state running, pid 4242)" in out

    assert _service(host, "uninstall") == 0
    assert box.calls()[-1] == f"bootout gui/501 {agent}"
    assert not agent.exists()
    assert _service(host, "uninstall") == 0
    assert "not installed" in capsys.readouterr().out

    # launchctl refuses: the agent is written and the command to run is said.
    failing = Host("darwin", {**box.env, "FAKE_RC": "5"}, 501)
    assert _service(failing, "install", "--data-dir", str(data)) == 0
    assert agent.exists()
    assert f"    launchctl bootstrap gui/501 {agent}\n" in capsys.readouterr().err
