"""Certificate pins (SPEC §16), pure: a gateway's identity is ``sha256:`` and the lowercase
hex of the SHA-256 of its certificate's DER; ``nodes[].pin`` holds a paired peer's. Hashing
is arithmetic, not I/O, so it lives here; reading the certificate is
:mod:`proxy.link.identity`'s.

A pin is written in lowercase; one typed in uppercase (``SHA256:9F86…``) is accepted and
normalized by :func:`normalize_pin`, while :func:`is_pin` holds to the written form.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Final, TypeGuard

__all__ = ["NODE_IDENTITY_CHANGED", "PIN_PREFIX", "fingerprint_of", "health_node_port", "is_pin",
           "normalize_pin", "pin_matches"]

PIN_PREFIX: Final = "sha256:"
NODE_IDENTITY_CHANGED: Final = "node_identity_changed"  # a pinned node's lastError, and its note
PIN_LENGTH: Final = len(PIN_PREFIX) + 64
PIN_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")


def fingerprint_of(der: bytes) -> str:
    """The pin of the certificate whose DER is ``der``."""
    return PIN_PREFIX + hashlib.sha256(der).hexdigest()


def is_pin(value: object) -> TypeGuard[str]:
    """Exactly ``sha256:`` and 64 lowercase hex digits (the written form)."""
    return isinstance(value, str) and PIN_RE.fullmatch(value) is not None


def normalize_pin(value: object) -> str | None:
    """A pin as a person may type it (any case, blanks around it) in its written form; None
    when it is not one."""
    if not isinstance(value, str) or len(value) > PIN_LENGTH + 64:
        return None
    pin = value.strip().lower()
    return pin if PIN_RE.fullmatch(pin) is not None else None


def pin_matches(der: bytes, pin: str) -> bool:
    """Whether the certificate ``der`` hashes to ``pin`` (compared in constant time; a pin
    in uppercase counts, one that is not a pin never matches)."""
    wanted = normalize_pin(pin)
    if wanted is None:
        return False
    return hmac.compare_digest(fingerprint_of(der).encode(), wanted.encode())


def health_node_port(body: bytes) -> int | None:
    """The ``nodePort`` of a gateway's ``GET /health`` answer (SPEC §16); None when it has
    none, or the answer is not that."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    port = doc.get("nodePort") if isinstance(doc, dict) else None
    return port if type(port) is int and 0 < port < 65536 else None
