"""``GET|HEAD /ui/`` and ``/ui/<file>`` (SPEC §10): the console's static files, read from
the package (:data:`proxy.console.STATIC_DIR`) in a worker thread, each sent with its content
type and the console's security headers (:mod:`protocol.console`).

The console is served on the TCP listeners only (the API listener and the loopback fallback
listener): a browser cannot reach a Unix socket, so there ``/ui/`` answers 404 naming where
the console is. The access rule is that of every GET (SPEC §5), checked before this runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from protocol.console import FILE_HEADERS, PREFIX, asset_parts
from protocol.errors import not_found
from proxy.api.call import Body, Call
from proxy.console import STATIC_DIR
from proxy.link.listener import UNIX

__all__ = ["redirect", "serve_file"]

MAX_FILE_SIZE = 1024 * 1024  # no console file is larger; a larger one is not served


def _read(parts: tuple[str, ...]) -> bytes | None:
    """The file's bytes; None when it is missing, not a plain file inside the static
    folder (a symlink out of it included), or too large."""
    path = STATIC_DIR.joinpath(*parts)
    try:
        real = path.resolve(strict=True)
        if not real.is_relative_to(STATIC_DIR) or not real.is_file() or \
                real.stat().st_size > MAX_FILE_SIZE:
            return None
        return Path(real).read_bytes()
    except OSError:
        return None


async def serve_file(call: Call) -> tuple[int, Any]:
    if call.listener is UNIX:
        raise not_found("the console is served on the TCP listeners "
                        f"(http://localhost:{call.ctx.tcp_port or '<api.port>'}{PREFIX}), "
                        "not on the Unix socket")
    found = asset_parts(call.path)
    data = None if found is None else await trio.to_thread.run_sync(_read, found[0])
    if found is None or data is None:
        raise not_found(f"no such console file: {call.path}")
    return 200, Body(found[1], data, FILE_HEADERS)


def redirect(call: Call) -> tuple[int, Any]:
    """``/ui`` -> ``/ui/`` (so the page's relative links resolve inside the console)."""
    return 308, Body(b"text/plain; charset=utf-8", b"the console is at /ui/\n",
                     ((b"location", PREFIX.encode()),))
