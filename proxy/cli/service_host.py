"""What ``sluice service`` needs on every platform (:mod:`proxy.cli.service`): the
:class:`Host` it runs on (platform, environment, user: tests choose them), outside commands
run with a timeout (:func:`run_tool`), the service's command (:func:`service_spec`), and the
lines that tell what a service runs and whether a gateway runs for its data dir."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from protocol.service_unit import STOP_TIMEOUT, ServiceSpec, UnitError, option, serve_command
from proxy.datadir import read_state

__all__ = [
    "QUICK", "STOPPING", "Host", "Ran", "describe_command", "gateway_line", "pid_alive",
    "run_tool", "say", "service_spec", "tell_commands",
]

OUTPUT_CAP = 64 * 1024  # characters of a tool's output kept (launchctl print is long)
QUICK = 15.0  # seconds for a systemctl call that starts or stops nothing
# enable --now, try-restart, disable --now wait for a start or a stop (the drain, at most
# STOP_TIMEOUT s before systemd kills what is left)
STOPPING = STOP_TIMEOUT + 30.0


@attrs.frozen
class Host:
    """Where the command runs: the platform (``sys.platform``), the environment (HOME, the
    XDG folders, PATH for the tools) and the user id (launchd's ``gui/<uid>`` domain)."""

    platform: str
    env: Mapping[str, str]
    uid: int

    @classmethod
    def current(cls) -> Host:
        return cls(sys.platform, dict(os.environ), os.getuid())

    @property
    def home(self) -> Path:
        home = self.env.get("HOME")
        return Path(home) if home else Path.home()

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get("PATH", os.defpath))


@attrs.frozen
class Ran:
    """One outside command's outcome: ``ok`` (exit 0), the first line it printed, and when
    it failed, why (its first line of stderr, or its exit code, or that it is missing)."""

    ok: bool
    out: str = ""
    reason: str = ""
    missing: bool = False
    text: str = attrs.field(default="", repr=False)  # all it printed (capped)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def run_tool(host: Host, argv: Sequence[str], timeout: float) -> Ran:
    """Run ``argv`` (its program found on the host's PATH), bounded by ``timeout`` seconds."""
    program = host.which(argv[0])
    if program is None:
        return Ran(False, reason=f"{argv[0]} is not on PATH", missing=True)
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True,
                              timeout=timeout, env=dict(host.env), stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        return Ran(False, reason=f"`{shlex.join(argv)}` did not finish within {timeout:g} s")
    except OSError as exc:
        return Ran(False, reason=f"cannot run {argv[0]}: {exc.strerror or exc}")
    out, text = _first_line(done.stdout), done.stdout[:OUTPUT_CAP]
    if done.returncode == 0:
        return Ran(True, out, text=text)
    return Ran(False, out, _first_line(done.stderr) or f"exit code {done.returncode}",
               text=text)


def service_spec(host: Host, data_dir: Path, config: Path | None) -> ServiceSpec:
    """The command of the service: this interpreter, the data dir and config made absolute,
    and ``PYTHONPATH`` (absolute) when the user runs sluice with one."""
    python = sys.executable
    if not python or not os.path.isabs(python):
        raise UnitError("cannot tell which Python runs sluice (sys.executable is not set)")
    command = serve_command(python, str(data_dir.absolute()),
                            str(config.absolute()) if config is not None else None)
    env: tuple[tuple[str, str], ...] = ()
    if host.env.get("PYTHONPATH"):
        parts = [str(Path(p).absolute()) for p in host.env["PYTHONPATH"].split(os.pathsep) if p]
        env = (("PYTHONPATH", os.pathsep.join(parts)),)
    return ServiceSpec(command, env, str(data_dir.absolute() / "sluice.log"))


def say(text: str, *, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def tell_commands(head: str, steps: Sequence[Sequence[str]]) -> None:
    say(head, err=True)
    for step in steps:
        say(f"    {shlex.join(step)}", err=True)


def gateway_line(data_dir: str | None) -> str:
    """Whether a gateway runs for ``data_dir`` now, by its state.json (any gateway: the
    service's or one started by hand)."""
    if data_dir is None:
        return "gateway: cannot tell (the service names no data dir)"
    state = read_state(Path(data_dir))
    if state is None or not pid_alive(state.pid):
        return "gateway: none runs for that data dir now"
    return f"gateway: running for that data dir (pid {state.pid})"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_command(command: Sequence[str]) -> str | None:
    """Print what a service runs; the data dir it names."""
    say(f"runs: {shlex.join(command)}")
    data_dir = option(command, "--data-dir")
    say(f"data dir: {data_dir or '(not named: the default of the environment it runs in)'}")
    config = option(command, "--config")
    if config is not None:
        say(f"config: {config}")
    return data_dir


def installed(path: Path, command: Callable[[Path], Sequence[str]]) -> tuple[bool, str | None]:
    """The first lines of ``status``: whether the unit or agent at ``path`` is there and,
    read back with ``command``, the data dir it runs (None when it cannot be read)."""
    if not path.exists():
        say(f"sluice service: not installed (no {path})")
        return False, None
    say(f"sluice service: installed: {path}")
    try:
        return True, describe_command(command(path))
    except (UnitError, OSError, UnicodeDecodeError) as exc:
        say(f"cannot read the command it runs: {exc}")
        return True, None
