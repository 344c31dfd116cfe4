"""The rules for names, one each: a node's fingerprint (``node.id``, what a node says it is)
and a label the user gives (a node's or an access key's name)."""

from __future__ import annotations

import re
from typing import Final, TypeGuard

__all__ = ["FINGERPRINT_RE", "LABEL_RULE", "MAX_LABEL", "is_fingerprint", "is_label"]

FINGERPRINT_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_LABEL: Final = 100
LABEL_RULE: Final = f"must be printable text of at most {MAX_LABEL} characters"


def is_fingerprint(value: object) -> TypeGuard[str]:
    """Letters, digits, ``.``, ``_`` and ``-``, 1 to 64 of them, not starting with a sign."""
    return isinstance(value, str) and FINGERPRINT_RE.fullmatch(value) is not None


def is_label(value: object) -> TypeGuard[str]:
    """Printable text (no control characters, no newline) of at most MAX_LABEL characters."""
    return isinstance(value, str) and len(value) <= MAX_LABEL and value.isprintable()
