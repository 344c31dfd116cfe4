"""Ollama's ``keep_alive``: how long a model stays loaded after the request (SPEC §11, §12).

Ollama reads it as a number of seconds or as a Go duration string (``time.ParseDuration``:
``"5m"``, ``"1h30m"``, ``"1.5h"``, ``"300ms"``, ``"10s"``, ``"0"``, ``"-1m"``; units ns, us,
µs, ms, s, m, h), and a negative value of either kind means "keep it loaded forever". Here:
seconds as a float, :data:`math.inf` for forever, None when the request has none (or null).
One leniency over Ollama: a string holding only a number (``"300"``) counts as seconds, as
the ``OLLAMA_KEEP_ALIVE`` environment variable does.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from protocol.errors import SluiceError
from protocol.ollama.errors import invalid

__all__ = ["parse_keep_alive"]

_UNITS = {
    "ns": Decimal("1e-9"), "us": Decimal("1e-6"), "\u00b5s": Decimal("1e-6"),
    "\u03bcs": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1), "m": Decimal(60),
    "h": Decimal(3600),
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_BARE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
_HELP = 'keep_alive must be a duration such as "5m", "1h30m" or "-1m", or a number of seconds'


def parse_keep_alive(value: object) -> float | None:
    """Seconds from a request's ``keep_alive`` (see the module); raises the 400 error."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _refused()
    if isinstance(value, int | float):
        seconds = float(value)
        if math.isnan(seconds):
            raise _refused()
        return math.inf if seconds < 0 else seconds
    if not isinstance(value, str):
        raise _refused()
    return _parse_text(value.strip())


def _parse_text(text: str) -> float:
    if _BARE.fullmatch(text):
        seconds = float(text)
        return math.inf if seconds < 0 else seconds
    sign, body = 1, text
    if body[:1] in ("+", "-"):
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    if not body:
        raise _refused()
    total = Decimal(0)
    at = 0
    while at < len(body):
        part = _PART.match(body, at)
        if part is None:
            raise _refused()
        try:
            total += Decimal(part[1]) * _UNITS[part[2]]
        except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
            raise _refused() from None
        at = part.end()
    if sign < 0 and total > 0:
        return math.inf
    return float(total)


def _refused() -> SluiceError:
    return invalid(_HELP)
