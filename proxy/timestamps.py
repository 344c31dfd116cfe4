"""The one timestamp format of every file and answer (secrets.yaml, notifications, access
keys): UTC, to the second, ``2025-01-31T12:00:00Z``."""

from __future__ import annotations

import time

__all__ = ["now_iso"]


def now_iso() -> str:
    """Now, in the timestamp format of every file and answer: UTC, to the second (``...Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
