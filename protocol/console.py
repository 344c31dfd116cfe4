"""The web console's static files (SPEC §10), pure: which URL path names which file, the
content type of each kind of file, and the headers every console file is sent with (a strict
Content-Security-Policy among them). Reading the files is :mod:`proxy.api.console`'s job.
"""

from __future__ import annotations

import re

__all__ = ["CONTENT_TYPES", "CSP", "FILE_HEADERS", "INDEX", "PREFIX", "asset_parts"]

PREFIX = "/ui/"
INDEX = "index.html"
MAX_DEPTH = 4  # folders below the static folder a file may sit in
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")  # no leading dot, no "..", no "%"

CONTENT_TYPES: dict[str, bytes] = {
    ".html": b"text/html; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".png": b"image/png",
    ".ico": b"image/x-icon",
}

# Scripts, styles and images from the gateway only; no inline script or style; the API and
# the events WebSocket (same origin: CSP 3 lets 'self' match ws: on the same host and port).
CSP = (b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

FILE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"cache-control", b"no-cache"),  # file names carry no content hash: revalidate each time
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def asset_parts(path: str) -> tuple[tuple[str, ...], bytes] | None:
    """``/ui/`` -> ``(("index.html",), text/html)``; ``/ui/js/app.js`` -> its folder parts
    and content type. None for anything that cannot name a console file: outside
    ``/ui/``, an empty, dotted or percent-encoded segment (so no way up and out), too deep,
    or a kind of file the console does not ship."""
    if not path.startswith(PREFIX):
        return None
    rest = path[len(PREFIX):]
    parts = tuple(rest.split("/")) if rest else (INDEX,)
    if len(parts) > MAX_DEPTH + 1 or not all(_SEGMENT.fullmatch(p) for p in parts):
        return None
    name = parts[-1]
    dot = name.rfind(".")
    content_type = CONTENT_TYPES.get(name[dot:]) if dot > 0 else None
    if content_type is None:
        return None
    return parts, content_type
