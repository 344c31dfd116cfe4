"""``sluice service install|uninstall|status`` (SPEC §13): sluice as a service of the user's
session, running the gateway the user runs now (this interpreter, ``-m proxy serve``, the
same data dir and ``--config``), restarted on failure and stopped with SIGTERM (a drain).

On Linux a systemd user unit, ``$XDG_CONFIG_HOME/systemd/user/sluice.service`` (else
``~/.config/...``), enabled and started with ``systemctl --user``; where the user manager
cannot be reached (a container, root without a login session, no systemctl) the unit is
still written and the exact commands to run are printed with the reason. On macOS a launchd
agent (:mod:`proxy.cli.service_launchd`). The texts are :mod:`protocol.service_unit`'s.

Every outside command runs with a timeout; the environment, the platform and the user are a
:class:`Host`, so tests choose them. Nothing here knows a secret: the unit holds paths only.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from protocol.service_unit import (
    RESTART_SEC,
    UNIT_NAME,
    ServiceSpec,
    UnitError,
    option,
    systemd_unit,
    unit_command,
)
from proxy.cli import service_launchd as launchd
from proxy.cli.service_host import (
    QUICK,
    STOPPING,
    Host,
    Ran,
    gateway_line,
    installed,
    pid_alive,
    run_tool,
    say,
    service_spec,
    tell_commands,
)
from proxy.datadir import read_state
from proxy.files import atomic_write

__all__ = ["service_main", "unit_path"]


def unit_path(host: Host) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user/sluice.service`` (an absolute XDG_CONFIG_HOME only,
    as the XDG spec says), else ``~/.config/systemd/user/sluice.service``."""
    xdg = host.env.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else host.home / ".config"
    return base / "systemd" / "user" / UNIT_NAME


def _systemctl(*args: str) -> list[str]:
    return ["systemctl", "--user", *args]


def _why(ran: Ran) -> str:
    """Why systemctl failed, in the user's terms."""
    if ran.missing:
        return "systemctl is not on PATH (no systemd here)"
    text = ran.reason
    if "bus" in text.lower() or "XDG_RUNTIME_DIR" in text:
        return (f"systemd's user manager cannot be reached ({text}): a container, or a "
                f"user without a login session")
    return text


# -- systemd ---------------------------------------------------------------------------------


def systemd_install(host: Host, spec: ServiceSpec, *, start: bool) -> int:
    path = unit_path(host)
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, systemd_unit(spec).encode(), 0o644)
    say(f"{'rewrote' if existed else 'wrote'} {path}")
    say(f"it runs: {shlex.join(spec.command)}")
    steps = [_systemctl("daemon-reload")]
    if existed:  # one running on the old unit is restarted on the new one
        steps.append(_systemctl("try-restart", UNIT_NAME))
    steps.append(_systemctl("enable", "--now", UNIT_NAME))
    if not start:
        tell_commands("not enabled or started (--no-start); to start it now and with every "
                      "session, run:", steps)
        return 0
    for i, step in enumerate(steps):
        ran = run_tool(host, step, QUICK if step[2] == "daemon-reload" else STOPPING)
        if not ran.ok:
            say(f"sluice service: `{shlex.join(step)}` failed: {_why(ran)}", err=True)
            tell_commands("the unit is written; to enable and start it, run these as this "
                          "user in a login session:", steps[i:])
            return 0
        say(f"ran: {shlex.join(step)}")
    say(f"sluice is a systemd user service now: started, and enabled (it starts with your "
        f"session; to start it at boot without a login: loginctl enable-linger "
        f"{host.env.get('USER') or '$USER'}). See: sluice service status, "
        f"journalctl --user -u {UNIT_NAME}")
    _warn_if_running(spec, fresh=not existed)
    return 0


def _warn_if_running(spec: ServiceSpec, *, fresh: bool) -> None:
    """A gateway started by hand on the same data dir holds its listeners: say so."""
    state = read_state(Path(option(spec.command, "--data-dir") or "."))
    if fresh and state is not None and pid_alive(state.pid):
        say(f"note: a gateway already runs for this data dir (pid {state.pid}); the service "
            f"cannot listen while it does. Stop it (kill -TERM {state.pid}) and the service "
            f"takes over within {RESTART_SEC} s.", err=True)


def systemd_uninstall(host: Host) -> int:
    path = unit_path(host)
    if not path.exists():
        say(f"sluice service is not installed (no {path})")
        return 0
    stopped = run_tool(host, _systemctl("disable", "--now", UNIT_NAME), STOPPING)
    if stopped.ok:
        say(f"stopped and disabled {UNIT_NAME}")
    else:
        say(f"sluice service: could not stop or disable it: {_why(stopped)}", err=True)
    path.unlink()
    say(f"removed {path}")
    wants = path.parent / "default.target.wants" / UNIT_NAME
    if wants.is_symlink():  # what `disable` removes, when systemctl could not
        wants.unlink()
        say(f"removed {wants}")
    if not stopped.ok:
        tell_commands("if it still runs under a user manager this command cannot reach, "
                      "run there:", [_systemctl("stop", UNIT_NAME), _systemctl("daemon-reload")])
        return 0
    reload = run_tool(host, _systemctl("daemon-reload"), QUICK)
    say("ran: systemctl --user daemon-reload" if reload.ok else
        f"sluice service: systemctl --user daemon-reload failed: {_why(reload)}",
        err=not reload.ok)
    return 0


def systemd_status(host: Host) -> int:
    found, data_dir = installed(unit_path(host),
                                lambda path: unit_command(path.read_text(encoding="utf-8")))
    if not found:
        return 0
    reasons = []
    for query in ("is-active", "is-enabled"):
        ran = run_tool(host, _systemctl(query, UNIT_NAME), QUICK)
        if ran.out:  # inactive, disabled...: answers, even with a non-zero exit code
            say(f"{query}: {ran.out}")
        else:
            reasons.append(_why(ran))
    if reasons:
        say(f"systemd cannot tell whether it runs: {reasons[0]}")
    say(gateway_line(data_dir))
    return 0


# -- the command -----------------------------------------------------------------------------


def service_main(args: argparse.Namespace, data_dir: Path, host: Host | None = None) -> int:
    """``sluice service install [--config FILE] [--no-start] | uninstall | status``."""
    host = host or Host.current()
    action = args.action
    if host.platform.startswith("linux"):
        kind = "systemd"
    elif host.platform == "darwin":
        kind = "launchd"
    else:
        say(f"sluice service: not available on {host.platform}: it makes a systemd user unit "
            f"on Linux or a launchd agent on macOS; run `sluice serve` some other way",
            err=True)
        return 2
    try:
        if action == "install":
            config = Path(args.config) if getattr(args, "config", None) else None
            if config is not None and not config.is_file():
                say(f"sluice service: {config}: no such file", err=True)
                return 2
            spec = service_spec(host, data_dir, config)
            if kind == "launchd":
                return launchd.install(host, spec, start=not args.no_start)
            return systemd_install(host, spec, start=not args.no_start)
        if action == "uninstall":
            return launchd.uninstall(host) if kind == "launchd" else systemd_uninstall(host)
        return launchd.status(host) if kind == "launchd" else systemd_status(host)
    except UnitError as exc:
        say(f"sluice service: {exc}", err=True)
        return 2
    except OSError as exc:
        say(f"sluice service: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        return 1
