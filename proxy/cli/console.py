"""``sluice console`` (SPEC §10): print the console's URL with the one-time admin-token
fragment, ``http://localhost:<port>/ui/#token=<token>``, and open it where a browser is at
hand.

The browser is not given the URL itself: a command line is readable by every user of the
machine (``ps``, ``/proc/<pid>/cmdline``), for as long as the browser runs. It is given
``<data dir>/console-open.html`` instead (mode 0600, in the 0700 data folder, like
secrets.yaml), a page that sends it on to the URL. The opener is ``xdg-open`` when it is on
PATH and a display is set (``DISPLAY`` or ``WAYLAND_DISPLAY``), ``open`` on macOS; without
one the URL is only printed, and a failing opener is only mentioned: never an error.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
import sys
from pathlib import Path

from proxy.cli.admin import CliError, admin_token, call
from proxy.datadir import SECRETS_FILE, read_state
from proxy.files import atomic_write

__all__ = ["LAUNCHER_FILE", "console_main", "console_url", "opener"]

LAUNCHER_FILE = "console-open.html"


def console_url(data_dir: Path) -> str:
    """The URL with the token; raises CliError when there is no gateway, no TCP listener
    or no token."""
    state = read_state(data_dir)
    if state is None:
        raise CliError(f"no gateway is running for {data_dir} (start it: sluice serve)")
    port = state.tcp_port or state.local_tcp_port
    if port is None:
        raise CliError("the gateway has no TCP listener (api.enabled is false): the console "
                       "is served on the API port")
    call(data_dir, "GET", "/health")  # it answers (raises CliError otherwise)
    token = admin_token(data_dir)
    if token is None:
        raise CliError(f"no admin token in {data_dir / SECRETS_FILE}")
    return f"http://localhost:{port}/ui/#token={token}"


def opener() -> list[str] | None:
    """The desktop's opener command, or None when there is no browser at hand."""
    if sys.platform == "darwin":
        found = shutil.which("open")
        return [found] if found else None
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None
    found = shutil.which("xdg-open")
    return [found] if found else None


def _launcher(data_dir: Path, url: str) -> Path:
    """The page handed to the browser: it moves on to ``url`` at once."""
    target = html.escape(url, quote=True)
    page = (f'<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
            f'<meta http-equiv="refresh" content="0;url={target}"><title>sluice console</title>'
            f'<p><a href="{target}">Open the sluice console</a></p>\n')
    path = data_dir / LAUNCHER_FILE
    atomic_write(path, page.encode(), 0o600)
    return path


def console_main(data_dir: Path, *, open_browser: bool = True) -> int:
    try:
        url = console_url(data_dir)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(url)
    command = opener() if open_browser else None
    if command is None:
        print("open this URL in a browser on this computer (it holds the admin token: "
              "do not share it)", file=sys.stderr)
        return 0
    try:
        page = _launcher(data_dir, url)
        subprocess.Popen([*command, page.as_uri()], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    except OSError as exc:
        print(f"could not open a browser ({exc.strerror or exc}); open the URL above",
              file=sys.stderr)
    return 0
