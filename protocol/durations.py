"""Durations and sizes as written in config.yaml (pure: values in, values out).

Durations: ``"500ms"``, ``"30s"``, ``"5m"``, ``"1h"``, a bare number of seconds, or a numeric
string; in memory they are ``float`` seconds. Sizes: bytes, ``"512KiB"``, ``"32MiB"``,
``"1GiB"`` (a ``B`` suffix is fine); in memory they are ``int`` bytes.

Decimal arithmetic keeps ``"0.1m"`` at exactly 6 seconds, and :func:`format_duration` /
:func:`format_size` always give text that parses back to the very same value.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from protocol.errors import ConfigError

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_DURATION_RE = re.compile(rf"(?P<num>{_NUMBER})\s*(?P<unit>ms|s|m|h)?")
_SIZE_RE = re.compile(rf"(?P<num>{_NUMBER})\s*(?P<unit>kib|mib|gib|b)?")

# Seconds per unit.
_DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
# Bytes per unit.
_SIZE_UNITS: dict[str, int] = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}

_DURATION_HELP = 'a duration such as "500ms", "30s", "5m", "1h" or a number of seconds'
_SIZE_HELP = 'a size such as 1048576, "512KiB", "32MiB" or "1GiB"'


def _describe(value: object) -> str:
    """A short description of a refused value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return repr(text)
    return type(value).__name__


def parse_duration(value: object, path: str) -> float:
    """Seconds from a config value; :class:`ConfigError` naming ``path`` if it is not one."""
    if isinstance(value, bool):
        raise ConfigError(path, f"expected {_DURATION_HELP}, got a boolean")
    if isinstance(value, int):
        if abs(value) > 10**15:
            raise ConfigError(path, f"duration {value} is too large")
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(path, f"expected {_DURATION_HELP}, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(path, f"expected {_DURATION_HELP}, got {_describe(value)}")
    match = _DURATION_RE.fullmatch(value.strip().lower())
    if match is None:
        raise ConfigError(path, f"expected {_DURATION_HELP}, got {_describe(value)}")
    factor = _DURATION_UNITS[match["unit"] or "s"]
    try:
        seconds = float(Decimal(match["num"]) * factor)
    except ArithmeticError:  # a huge exponent
        raise ConfigError(path, f"duration {_describe(value)} is too large") from None
    if not math.isfinite(seconds):
        raise ConfigError(path, f"duration {_describe(value)} is too large")
    return seconds


def format_duration(seconds: float) -> str:
    """Canonical text for a duration, using the largest unit that is exact.

    ``3600 -> "1h"``, ``300 -> "5m"``, ``90 -> "90s"``, ``0.5 -> "500ms"``, ``1.5 -> "1.5s"``.
    ``parse_duration(format_duration(x), "") == x`` for every finite float.
    """
    if isinstance(seconds, bool) or not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {seconds!r}")
    if seconds == 0:
        return "0s"
    exact = Decimal(repr(float(seconds)))  # the shortest decimal that reads back as `seconds`
    if exact == exact.to_integral_value():
        whole = int(exact)
        if whole % 3600 == 0:
            return f"{whole // 3600}h"
        if whole % 60 == 0:
            return f"{whole // 60}m"
        return f"{whole}s"
    millis = exact * 1000
    if abs(exact) < 1 and millis == millis.to_integral_value():
        return f"{int(millis)}ms"
    return f"{float(seconds)!r}s"


def parse_size(value: object, path: str) -> int:
    """Bytes from a config value; :class:`ConfigError` naming ``path`` if it is not one."""
    if isinstance(value, bool):
        raise ConfigError(path, f"expected {_SIZE_HELP}, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ConfigError(path, f"expected a whole number of bytes, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(path, f"expected {_SIZE_HELP}, got {_describe(value)}")
    match = _SIZE_RE.fullmatch(value.strip().lower())
    if match is None:
        raise ConfigError(path, f"expected {_SIZE_HELP}, got {_describe(value)}")
    try:
        amount = Decimal(match["num"]) * _SIZE_UNITS[match["unit"] or "b"]
    except ArithmeticError:  # a huge exponent
        raise ConfigError(path, f"size {_describe(value)} is too large") from None
    if amount.adjusted() > 30:  # no config size is near 10**30 bytes; keep int() cheap
        raise ConfigError(path, f"size {_describe(value)} is too large")
    if amount != amount.to_integral_value():
        raise ConfigError(path, f"{_describe(value)} is not a whole number of bytes")
    return int(amount)


def format_size(n: int) -> str:
    """Canonical text for a size: ``"32MiB"`` when exact, else ``"<n>B"``."""
    if n != 0:
        for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n % unit == 0:
                return f"{n // unit}{suffix}"
    return f"{n}B"
