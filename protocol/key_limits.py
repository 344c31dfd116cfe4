"""The limits of an access key (SPEC §13), pure: which models it may use (ids or ``*``
patterns), how many requests a minute (a token bucket), until when it is valid. Values in,
decisions out: the parsing and validation of each limit as the API and secrets.yaml give it,
the pattern match, the bucket arithmetic and the expiry comparison. No clock of its own:
callers pass ``now``.

Stored in secrets.yaml beside the key's hash, snake_case: ``models`` (a list; absent = every
model), ``rpm`` (an int; absent = unlimited), ``expires_at`` (ISO 8601 UTC, to the second,
``2025-06-30T23:59:59Z``; absent = never), ``priority`` (``batch``; absent = interactive,
SPEC §18). An expiry is accepted with ``Z`` or an offset;
a date alone means the end of that day in UTC (``23:59:59Z``); a date and time without a
zone is refused (whose midnight would it be?).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any, Final

import attrs

from protocol.aliases import WILDCARD, model_id_problem
from protocol.errors import ConfigError

__all__ = ["MAX_MODELS", "MAX_RPM", "UNLIMITED", "KeyLimits", "TokenBucket", "check_stored",
           "expiry_from_cli", "format_expiry", "limits_of", "parse_expiry", "parse_models",
           "parse_priority", "parse_rpm", "retry_after", "stored_limits"]

MAX_RPM: Final = 1_000_000  # requests a minute: more is no limit at all, and likely a typo
MAX_MODELS: Final = 256  # entries of one key's ``models``
_STAMP: Final = "%Y-%m-%dT%H:%M:%SZ"  # the one timestamp format of files and answers
_UNIT_SECONDS: Final = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN: Final = re.compile(r"(\d{1,6})([mhdw])")  # a CLI duration: 30d, 12h, 90m, 2w


# ----------------------------------------------------------------------- parsing


def parse_models(value: object, field: str = "models") -> tuple[str, ...] | None:
    """``models`` as given: None (every model) or a list of 1 to :data:`MAX_MODELS` model
    ids or patterns (``*`` the only wildcard); duplicates are dropped, the order kept.
    Raises :class:`ConfigError` naming ``field`` (``models[2]`` for an entry)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ConfigError(field, "must be a list of model ids or patterns (or null for "
                                 "every model)")
    if not value:
        raise ConfigError(field, "must name at least one model or pattern (null, or no "
                                 "field, lets the key use every model)")
    if len(value) > MAX_MODELS:
        raise ConfigError(field, f"has {len(value)} entries; at most {MAX_MODELS}")
    for i, item in enumerate(value):
        problem = model_id_problem(item, pattern=True)
        if problem is not None:
            raise ConfigError(f"{field}[{i}]", f"{problem} (a model id, or a pattern where "
                                               "'*' matches any run of characters)")
    return tuple(dict.fromkeys(value))


def parse_rpm(value: object, field: str = "rpm") -> int | None:
    """``rpm`` as given: None (unlimited) or a whole number of requests a minute,
    1 to :data:`MAX_RPM`. Raises :class:`ConfigError` naming ``field``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, "must be a whole number of requests a minute (or null for "
                                 "no limit)")
    if not 1 <= value <= MAX_RPM:
        raise ConfigError(field, f"must be between 1 and {MAX_RPM} requests a minute, "
                                 f"not {value}")
    return value


def parse_priority(value: object, field: str = "priority") -> str | None:
    """A key's class in the queue (SPEC §18): ``"batch"``, or None for ``"interactive"``
    (the default, and null). Raises :class:`ConfigError` naming ``field``."""
    if value is None or value == "interactive":
        return None
    if value != "batch":
        raise ConfigError(field, "must be interactive or batch")
    return "batch"


def parse_expiry(value: object, field: str = "expiresAt") -> str | None:
    """An expiry as given: None (never), or ISO 8601 with ``Z`` or an offset
    (``2025-06-30T18:00:00+02:00``), or a date alone (the end of that day, UTC). Returns it
    in the stored form, UTC to the second (a fraction is dropped). Raises
    :class:`ConfigError` naming ``field``."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise ConfigError(field, "must be an ISO 8601 date or time, e.g. "
                                 "2025-06-30T23:59:59Z (or null for never)")
    text = value.strip()
    try:
        if len(text) == 10:  # YYYY-MM-DD: the whole of that day
            day = date.fromisoformat(text)
            when = datetime(day.year, day.month, day.day, 23, 59, 59, tzinfo=UTC)
        else:
            when = datetime.fromisoformat(text)
            if when.tzinfo is None:
                raise ConfigError(field, "needs a time zone: end it with Z or an offset "
                                         "like +02:00 (or give a date alone)")
            when = when.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ConfigError(field, "is not an ISO 8601 date or time (e.g. 2025-06-30, "
                                 "2025-06-30T23:59:59Z or 2025-06-30T18:00:00+02:00)") from None
    return when.strftime(_STAMP)


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of a stored expiry (``...Z``)."""
    return datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC).timestamp()


def format_expiry(epoch: float) -> str:
    """A moment (seconds since the epoch) in the stored form."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime(_STAMP)


def expiry_from_cli(text: str, now: float) -> str:
    """``sluice keys ... --expires X``: a duration from ``now`` (``30d``, ``12h``, ``90m``,
    ``2w``) or what :func:`parse_expiry` takes. Raises :class:`ConfigError` (``expires``)."""
    span = _SPAN.fullmatch(text.strip().lower())
    if span is not None:
        seconds = int(span.group(1)) * _UNIT_SECONDS[span.group(2)]
        return format_expiry(now + seconds)
    try:
        stamp = parse_expiry(text, "expires")
    except ConfigError:
        raise ConfigError("expires", "must be a duration like 30d, 12h, 90m or 2w, or an ISO "
                                     "8601 date or time (2025-06-30, 2025-06-30T18:00:00Z)"
                          ) from None
    assert stamp is not None
    return stamp


def check_stored(entry: Mapping[str, Any], where: str) -> None:
    """The limits of one ``access_keys`` entry of secrets.yaml, as a hand edit may have left
    them; raises :class:`ConfigError` naming ``<where>.models`` and so on."""
    parse_models(entry.get("models"), f"{where}.models")
    parse_rpm(entry.get("rpm"), f"{where}.rpm")
    if entry.get("priority") is not None and parse_priority(entry.get("priority"),
                                                            f"{where}.priority") is None:
        raise ConfigError(f"{where}.priority", "is stored only as batch (absent: interactive)")
    expiry = entry.get("expires_at")
    if expiry is not None and parse_expiry(expiry, f"{where}.expires_at") != expiry:
        raise ConfigError(f"{where}.expires_at", "must be UTC to the second, e.g. "
                                                 "2025-06-30T23:59:59Z")


# ----------------------------------------------------------------------- the decisions


def _matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """One test for a model id against every entry: exact ids by a set, patterns by one
    regular expression (``*`` any run of characters, the rest itself)."""
    exact = frozenset(p for p in patterns if WILDCARD not in p)
    wild = [p for p in patterns if WILDCARD in p]
    if not wild:
        return exact.__contains__
    if WILDCARD in wild:  # "*" alone: every model
        return lambda model: True
    regex = re.compile("|".join(".*".join(map(re.escape, p.split(WILDCARD))) for p in wild),
                       re.DOTALL)
    fullmatch = regex.fullmatch
    return lambda model: model in exact or fullmatch(model) is not None


@attrs.frozen(repr=False)
class KeyLimits:
    """One key's limits, parsed. ``expires`` is ``expires_at`` in seconds since the epoch."""

    models: tuple[str, ...] | None = None
    rpm: int | None = None
    expires_at: str | None = None
    expires: float | None = None
    _allows: Callable[[str], bool] | None = None
    priority: str | None = None  # "batch", or None: interactive (SPEC §18)

    def __repr__(self) -> str:
        return (f"KeyLimits(models={self.models!r}, rpm={self.rpm}, "
                f"expires={self.expires_at}, priority={self.priority})")

    @property
    def limited(self) -> bool:
        """Whether a request for a model has anything to check."""
        return self.models is not None or self.rpm is not None

    def allows(self, model: str) -> bool:
        """Whether the key may use ``model`` (every model when ``models`` is unset)."""
        test = self._allows
        return test is None or test(model)

    def expired(self, now: float) -> bool:
        """Whether the key is past its expiry at ``now`` (seconds since the epoch): SPEC
        §13's "after it"."""
        return self.expires is not None and now > self.expires


UNLIMITED: Final = KeyLimits()


@functools.lru_cache(maxsize=1024)
def limits_of(models: tuple[str, ...] | None, rpm: int | None,
              expires_at: str | None, priority: str | None = None) -> KeyLimits:
    """The parsed limits for these stored values (made once per distinct set: a request
    pays a cache look-up, the patterns are compiled once)."""
    if models is None and rpm is None and expires_at is None and priority is None:
        return UNLIMITED
    return KeyLimits(models, rpm, expires_at,
                     None if expires_at is None else _epoch(expires_at),
                     None if models is None else _matcher(models), priority)


def stored_limits(entry: Mapping[str, Any]) -> KeyLimits:
    """The limits of an ``access_keys`` entry (already checked: :func:`check_stored`)."""
    models = entry.get("models")
    return limits_of(None if models is None else tuple(models), entry.get("rpm"),
                     entry.get("expires_at"), entry.get("priority"))


class TokenBucket:
    """A key's request budget: ``rpm`` requests at once at most, refilled at ``rpm`` per
    minute. Counted in sixtieths of a request, so a whole refill is exact (``rpm`` of them a
    second). ``rpm`` is passed on every call: a changed limit applies to the next request,
    with what is left capped to the new size."""

    __slots__ = ("at", "units")

    def __init__(self, rpm: int, now: float) -> None:
        self.units = 60.0 * rpm  # full
        self.at = now

    def __repr__(self) -> str:
        return f"TokenBucket(requests={self.units / 60:.3f}, at={self.at:.3f})"

    def take(self, rpm: int, now: float) -> float:
        """Take one request: 0.0 when it may go now, else the seconds until one may."""
        units = min(60.0 * rpm, self.units + max(0.0, now - self.at) * rpm)
        self.at = now
        if units >= 60.0 - 1e-9:
            self.units = max(0.0, units - 60.0)
            return 0.0
        self.units = units
        return (60.0 - units) / rpm


def retry_after(wait: float) -> int:
    """``Retry-After`` for a wait: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait - 1e-9))

