"""``sluice service`` on macOS: a launchd agent, ``~/Library/LaunchAgents/dev.sluice.gateway
.plist`` (the text: :func:`protocol.service_unit.launchd_plist`), loaded into the user's GUI
domain with ``launchctl bootstrap gui/<uid> <plist>`` and removed with ``launchctl bootout``.
Its output goes to ``<data dir>/sluice.log``; the data dir is made first, since launchd
opens that file before the gateway runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from protocol.service_unit import (
    LAUNCHD_LABEL,
    ServiceSpec,
    launchd_plist,
    plist_command,
)
from proxy.cli.service_host import (
    QUICK,
    STOPPING,
    Host,
    gateway_line,
    installed,
    run_tool,
    say,
    tell_commands,
)
from proxy.datadir import make_data_dir
from proxy.files import atomic_write

__all__ = ["agent_path", "install", "status", "uninstall"]

_STATE = re.compile(r"^\s*(state|pid) = (\S+)\s*$", re.MULTILINE)  # in `launchctl print`


def agent_path(host: Host) -> Path:
    return host.home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def _domain(host: Host) -> str:
    return f"gui/{host.uid}"


def install(host: Host, spec: ServiceSpec, *, start: bool) -> int:
    path = agent_path(host)
    existed = path.exists()
    if spec.log_file is not None:
        make_data_dir(Path(spec.log_file).parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, launchd_plist(spec), 0o644)
    say(f"{'rewrote' if existed else 'wrote'} {path}")
    say(f"it runs: {shlex.join(spec.command)}")
    load = ["launchctl", "bootstrap", _domain(host), str(path)]
    unload = ["launchctl", "bootout", f"{_domain(host)}/{LAUNCHD_LABEL}"]
    if not start:
        tell_commands("not loaded (--no-start); to start it now and at every login, run:",
                      [load])
        return 0
    if existed:  # the old definition may be loaded: unload it (nothing to do if it is not)
        out = run_tool(host, unload, STOPPING)
        if out.ok:
            say(f"ran: {shlex.join(unload)}")
    ran = run_tool(host, load, QUICK)
    if not ran.ok:
        say(f"sluice service: `{shlex.join(load)}` failed: {ran.reason}", err=True)
        tell_commands("the agent is written; to start it, run as this user, logged in:",
                      [load])
        return 0
    say(f"ran: {shlex.join(load)}")
    say(f"sluice is a launchd agent now: started, and started at every login. Its log: "
        f"{spec.log_file}. See: sluice service status")
    return 0


def uninstall(host: Host) -> int:
    path = agent_path(host)
    if not path.exists():
        say(f"sluice service is not installed (no {path})")
        return 0
    unload = ["launchctl", "bootout", _domain(host), str(path)]
    ran = run_tool(host, unload, STOPPING)
    if ran.ok:
        say(f"stopped and unloaded {LAUNCHD_LABEL}")
    else:
        say(f"launchctl bootout: {ran.reason} (it was not loaded, or cannot be reached)")
    path.unlink()
    say(f"removed {path}")
    return 0


def status(host: Host) -> int:
    found, data_dir = installed(agent_path(host), lambda path: plist_command(path.read_bytes()))
    if not found:
        return 0
    ran = run_tool(host, ["launchctl", "print", f"{_domain(host)}/{LAUNCHD_LABEL}"], QUICK)
    if ran.ok:
        facts = ", ".join(f"{k} {v}" for k, v in _STATE.findall(ran.text))
        say(f"launchd: loaded ({facts})" if facts else "launchd: loaded")
    elif ran.missing:
        say(f"launchd cannot tell whether it runs: {ran.reason}")
    else:
        say(f"launchd: not loaded ({ran.reason})")
    say(gateway_line(data_dir))
    return 0
