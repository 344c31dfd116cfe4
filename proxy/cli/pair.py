"""``sluice pair [--wait]`` (SPEC §14): ask the running gateway for a pairing code and say
how the other computer uses it; with ``--wait``, wait until it is claimed (or expires).

The code is printed on standard output (it is what the user came for) and nowhere else;
the hints go to standard error. Nothing here loads trio or the server.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from protocol.access import PAIRING_PATH
from protocol.lan.pairing import shown_code
from proxy.cli.admin import CliError, call
from proxy.datadir import read_state

__all__ = ["lan_address", "pair_main", "valid_until"]

PATH = PAIRING_PATH
POLL_INTERVAL = 1.0  # seconds between two looks with --wait
# An address of TEST-NET-1 (RFC 5737): "connecting" a UDP socket there sends nothing, it
# only makes the kernel pick the source address it would use for the LAN.
_PROBE = ("192.0.2.1", 9)


def lan_address() -> str | None:
    """This computer's address on its network (the source address of its default route);
    None when it has none. No packet is sent."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(_PROBE)
            address = str(sock.getsockname()[0])
    except OSError:
        return None
    return None if address.startswith(("0.", "127.")) else address


def valid_until(expires_at: str, now: float) -> str:
    """``14:05, 5 minutes``: the local time of ``expires_at`` (ISO 8601 UTC) and the whole
    minutes left from ``now`` (rounded to the nearest)."""
    try:
        when = datetime.strptime(expires_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return expires_at
    minutes = max(0, round((when.timestamp() - now) / 60))
    unit = "minute" if minutes == 1 else "minutes"
    return f"{when.astimezone().strftime('%H:%M')}, {minutes} {unit}"


def _where(data_dir: Path, port: int | None) -> tuple[str, list[str]]:
    """The URL the other computer should use, and what the user should know about it."""
    notes: list[str] = []
    api = call(data_dir, "GET", "/api/v1/settings/api")
    if port is None or not api.get("enabled", True):
        notes.append("the gateway's TCP API is off, so no other computer can reach it: "
                     "turn it on (api.enabled) and restart")
        return "http://<this computer's address>:<port>", notes
    if api.get("allowExternalAccess") and not api.get("restartRequired"):
        host = lan_address() or socket.gethostname().partition(".")[0] + ".local"
    else:
        host = "127.0.0.1"
        notes.append("external access is off: only this computer can reach the gateway. "
                     "Turn on api.allow_external_access (console: Settings, or PUT "
                     "/api/v1/settings/api) and restart, then pair again")
    return f"http://{host}:{port}", notes


def _wait(data_dir: Path) -> int:
    """Look every POLL_INTERVAL until the code is no longer active: 0 when it was claimed,
    1 otherwise."""
    print("waiting for the other computer (Ctrl-C to stop waiting; the code stays valid)",
          file=sys.stderr)
    try:
        while True:
            state = call(data_dir, "GET", PATH, admin=True)
            if not state.get("active"):
                break
            time.sleep(POLL_INTERVAL)
    except KeyboardInterrupt:
        print("stopped waiting", file=sys.stderr)
        return 130
    if state.get("state") == "claimed":
        print(f"paired: {state.get('name')} connected with the code")
        return 0
    print(f"the code is {state.get('state')}: nobody used it", file=sys.stderr)
    return 1


def pair_main(data_dir: Path, *, wait: bool = False, as_json: bool = False) -> int:
    """``sluice pair``: 0, 1 when the gateway cannot be used (or, with --wait, the code
    ended unused)."""
    try:
        state = read_state(data_dir)
        port = state.tcp_port if state is not None else None
        made: dict[str, Any] = call(data_dir, "POST", PATH, admin=True)
        if as_json:
            print(json.dumps(made, indent=2))
        else:
            url, notes = _where(data_dir, port)
            code = made["code"]
            if made.get("replaced"):
                print("(the earlier code no longer works)", file=sys.stderr)
            print(f"Pairing code: {shown_code(code)} (valid until "
                  f"{valid_until(made['expiresAt'], time.time())}, one use)")
            print(f"On the other computer: sluice nodes add {url} --code {code}")
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
        sys.stdout.flush()
        return _wait(data_dir) if wait else 0
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
