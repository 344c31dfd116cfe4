"""Pairing (SPEC §14), pure: the one-time code a computer gives out so another computer on
the network can get an access key from it, the claims against that code, and the rate limit
on claims per peer address. No clock of its own: every call takes ``now`` (seconds, on any
monotonic clock the caller keeps to; the gateway's is trio's).

The code's life, one table of moves (:class:`CodeState`)::

    ACTIVE --right code--> CLAIMED          (one use)
    ACTIVE --wrong code--> ACTIVE            (tries_left - 1)
    ACTIVE --5th wrong---> VOID              (even the right code is refused from then on)
    ACTIVE --5 minutes---> EXPIRED           (seen at the next look: ``now`` passed in)
    ACTIVE --cancel------> CANCELLED
    any    --issue-------> ACTIVE            (a new code replaces the one before)

A claim refused for any reason answers the same 401 (:func:`code_not_accepted`), so a
stranger learns nothing about which reason it was. Codes are compared in constant time.
Codes and the keys a claim gives out are never part of a ``repr()``, a message or an error.
"""

from __future__ import annotations

import enum
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from protocol.config.fields import unknown_field
from protocol.errors import ConfigError, SluiceError, Source, payload_too_large, rate_limit_error
from protocol.headers import Header, header_value
from protocol.key_limits import TokenBucket, retry_after
from protocol.names import LABEL_RULE, is_fingerprint, is_label

__all__ = [
    "CLAIMS_PER_MINUTE",
    "CODE_DIGITS",
    "CODE_LIFETIME",
    "MAX_CLAIM_BODY",
    "MAX_PEERS",
    "MAX_TRIES",
    "Claim",
    "ClaimRateLimit",
    "CodeState",
    "Outcome",
    "PairingCode",
    "PairingState",
    "check_claim_body",
    "claim_rate_limited",
    "code_not_accepted",
    "new_code",
    "normalize_code",
    "parse_claim",
    "parse_claim_answer",
    "shown_code",
]

CODE_DIGITS = 6
CODE_LIFETIME = 300.0  # seconds a code is valid
MAX_TRIES = 5  # wrong codes before the code is void
CLAIMS_PER_MINUTE = 5  # per peer address; also the burst
MAX_PEERS = 1024  # addresses whose claim budget is kept; the least recently seen go first
CLAIM_FIELDS = ("code", "fingerprint", "name")
MAX_CLAIM_BODY = 4096  # bytes: a claim from a stranger is read only when this small


class CodeState(enum.Enum):
    NONE = "none"  # no code was ever made (or the gateway restarted)
    ACTIVE = "active"
    CLAIMED = "claimed"
    EXPIRED = "expired"
    VOID = "void"  # too many wrong tries
    CANCELLED = "cancelled"


class Outcome(enum.Enum):
    """What one claim came to."""

    ACCEPTED = "accepted"
    WRONG = "wrong"  # a wrong code; the code stays active with one try less
    VOIDED = "voided"  # a wrong code that was the last try: the code is void now
    NO_CODE = "no_code"  # no code is active (none made, used, expired, void or cancelled)


def new_code() -> str:
    """Six random digits (``secrets``), leading zeros kept."""
    return f"{secrets.randbelow(10 ** CODE_DIGITS):0{CODE_DIGITS}d}"


def normalize_code(value: object) -> str | None:
    """A code as a person may type it (``123 456``, ``123-456``) as its six digits; None
    when it is not six digits."""
    if not isinstance(value, str) or len(value) > 32:
        return None
    digits = value.replace(" ", "").replace("-", "")
    if len(digits) != CODE_DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    return digits


def shown_code(code: str) -> str:
    """How a code is shown to a person: ``123 456``."""
    half = len(code) // 2
    return f"{code[:half]} {code[half:]}"


@attrs.define(repr=False)
class PairingCode:
    """The current code: its digits, when it expires (``now``'s clock), tries left."""

    value: str
    expires: float
    tries_left: int = MAX_TRIES
    state: CodeState = CodeState.ACTIVE
    claimed_by: str | None = None  # the name of the computer that claimed it

    def __repr__(self) -> str:  # never the code
        return (f"PairingCode({self.state.value}, expires={self.expires:.1f}, "
                f"tries_left={self.tries_left})")


@attrs.frozen
class Issued:
    """A code just made: ``replaced`` when an unused one was active before."""

    code: str = attrs.field(repr=False)
    expires: float
    replaced: bool


class PairingState:
    """The code of one gateway (at most one at a time), see the module docstring."""

    __slots__ = ("_code",)

    def __init__(self) -> None:
        self._code: PairingCode | None = None

    def __repr__(self) -> str:
        return f"PairingState({self._code!r})"

    def _settle(self, now: float) -> PairingCode | None:
        """The current code with its expiry applied at ``now``."""
        code = self._code
        if code is not None and code.state is CodeState.ACTIVE and now >= code.expires:
            code.state = CodeState.EXPIRED
        return code

    def issue(self, code: str, now: float, lifetime: float = CODE_LIFETIME) -> Issued:
        """Make ``code`` the current code, valid for ``lifetime`` seconds from ``now``;
        any earlier code ends here."""
        before = self._settle(now)
        replaced = before is not None and before.state is CodeState.ACTIVE
        self._code = PairingCode(code, now + lifetime)
        return Issued(code, now + lifetime, replaced)

    def cancel(self, now: float) -> bool:
        """End the active code; False when none was active."""
        code = self._settle(now)
        if code is None or code.state is not CodeState.ACTIVE:
            return False
        code.state = CodeState.CANCELLED
        return True

    def view(self, now: float) -> PairingCode | None:
        """The current code (any state) as of ``now``; None when none was ever made. The
        caller must not show its ``value``."""
        return self._settle(now)

    def claim(self, presented: str, now: float, name: str) -> Outcome:
        """One claim of ``presented`` (six digits) at ``now`` by the computer ``name``."""
        code = self._settle(now)
        if code is None or code.state is not CodeState.ACTIVE:
            return Outcome.NO_CODE
        return _decide(code, hmac.compare_digest(presented.encode(), code.value.encode()),
                       name)


    def settle(self, code: PairingCode, proved: bool, now: float, name: str) -> Outcome:
        """The end of a pairing exchange (SPEC §16) begun against ``code``: ``proved`` when
        the joiner's key confirmation showed it knows the code. Counts as a claim of the
        right or a wrong code would; NO_CODE when ``code`` is no longer the active code
        (expired, cancelled or replaced while the exchange ran)."""
        current = self._settle(now)
        if current is not code or code.state is not CodeState.ACTIVE:
            return Outcome.NO_CODE
        return _decide(code, proved, name)


def _decide(code: PairingCode, right: bool, name: str) -> Outcome:
    """One try against the active ``code``: claimed by ``name`` when ``right``, else one
    try less (void at the last)."""
    if right:
        code.state = CodeState.CLAIMED
        code.claimed_by = name
        return Outcome.ACCEPTED
    code.tries_left -= 1
    if code.tries_left <= 0:
        code.state = CodeState.VOID
        return Outcome.VOIDED
    return Outcome.WRONG


class ClaimRateLimit:
    """A token bucket per peer address: ``rate`` claims a minute, ``rate`` at once. At most
    ``max_peers`` addresses are kept; the one seen least recently is dropped first (its
    budget starts full when it comes back)."""

    __slots__ = ("_buckets", "max_peers", "rate")

    def __init__(self, rate: int = CLAIMS_PER_MINUTE, max_peers: int = MAX_PEERS) -> None:
        self.rate = rate
        self.max_peers = max_peers
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __repr__(self) -> str:
        return f"ClaimRateLimit({self.rate}/min, peers={len(self._buckets)})"

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, peer: object) -> bool:
        return peer in self._buckets

    def take(self, peer: str, now: float) -> int | None:
        """One claim from ``peer`` at ``now``: None when it may go, else ``Retry-After``
        (whole seconds)."""
        buckets = self._buckets
        bucket = buckets.get(peer)
        if bucket is None:
            bucket = buckets[peer] = TokenBucket(self.rate, now)
            while len(buckets) > self.max_peers:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(peer)
        wait = bucket.take(self.rate, now)
        return retry_after(wait) if wait else None


# ----------------------------------------------------------------------- the claim's body


@attrs.frozen
class Claim:
    """A claim's body, checked: the code (six digits), the claiming computer's fingerprint
    and its name ("" when it gave none)."""

    code: str = attrs.field(repr=False)
    fingerprint: str
    name: str

    @property
    def key_name(self) -> str:
        """What the access key made for it is called: its name, else its fingerprint."""
        return self.name or self.fingerprint


def check_claim_body(headers: Iterable[Header]) -> None:
    """Before a stranger's claim body is read: a Content-Length of at most MAX_CLAIM_BODY
    (413 otherwise, before a byte of it is read)."""
    length = header_value(headers, b"content-length")
    if header_value(headers, b"transfer-encoding") is not None or \
            (length is not None and (not length.isdigit() or int(length) > MAX_CLAIM_BODY)):
        raise payload_too_large(MAX_CLAIM_BODY, f"a pairing claim's body is at most "
                                f"{MAX_CLAIM_BODY} bytes (with a Content-Length)", param=None)


def parse_claim(doc: Mapping[str, Any]) -> Claim:
    """``{code, fingerprint, name?}``; 422 naming the field (never echoing the code)."""
    unknown = sorted(set(doc) - set(CLAIM_FIELDS))
    if unknown:
        raise unknown_field(unknown[0][:64], CLAIM_FIELDS)
    code = normalize_code(doc.get("code"))
    if code is None:
        raise ConfigError("code", f"expected the {CODE_DIGITS}-digit pairing code as a string")
    fingerprint = doc.get("fingerprint")
    if not is_fingerprint(fingerprint):
        raise ConfigError("fingerprint", "expected the claiming node's fingerprint (letters, "
                                         "digits, '.', '_' and '-', at most 64)")
    name = doc.get("name")
    if name is None:
        name = ""
    if not is_label(name):
        raise ConfigError("name", LABEL_RULE)
    return Claim(code, fingerprint, name.strip())


def parse_claim_answer(doc: object) -> tuple[str, str] | None:
    """The claiming side: ``(fingerprint, accessKey)`` from the answer's JSON value; None
    when it is not that."""
    if not isinstance(doc, dict):
        return None
    fingerprint, key = doc.get("fingerprint"), doc.get("accessKey")
    if not is_fingerprint(fingerprint) or not isinstance(key, str) or not key:
        return None
    return fingerprint, key


# ----------------------------------------------------------------------- answers


def code_not_accepted() -> SluiceError:
    """401 for any refused claim: wrong, used, expired, void or no code at all (one
    answer, so a guess learns nothing more)."""
    return SluiceError(401, "the pairing code was not accepted: it is wrong, used or "
                            "expired (make a new one with 'sluice pair')",
                       type="invalid_request_error", code="invalid_pairing_code",
                       param="code", source=Source.CLIENT)


def claim_rate_limited(retry: int) -> SluiceError:
    """429 for a peer over its claims a minute, with ``Retry-After`` in whole seconds."""
    return rate_limit_error(f"too many pairing attempts from this address; retry in {retry} s",
                            retry)
