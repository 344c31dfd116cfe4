"""The history folder of config.yaml (SPEC §13): ``<data dir>/config-history/``, 0700, one
file (0600) per kept version, the newest :data:`~protocol.config_history.KEEP` kept.

Blocking file work: :class:`Settings` calls it in its worker thread, under its one writer,
so the folder only changes one version at a time. The names and header lines are
:mod:`protocol.config_history`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from protocol.config_history import (
    KEEP,
    SUFFIX,
    HistoryEntry,
    entry_of,
    kept_text,
    new_id,
    split_kept,
    to_drop,
    valid_id,
)
from proxy.files import atomic_write

__all__ = ["HISTORY_DIR", "ConfigHistory"]

HISTORY_DIR = "config-history"
_HEAD_BYTES = 512  # enough for the two header lines


class ConfigHistory:
    """The kept versions of one data dir's config.yaml."""

    def __init__(self, folder: Path, keep: int = KEEP) -> None:
        self.folder = folder
        self.limit = keep

    def __repr__(self) -> str:
        return f"ConfigHistory({str(self.folder)!r}, keep={self.limit})"

    def _ids(self) -> list[str]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return [n[:-len(SUFFIX)] for n in names
                if n.endswith(SUFFIX) and valid_id(n[:-len(SUFFIX)])]

    def keep(self, previous: str, source: str, sections: Sequence[str], now: float) -> str:
        """Keep ``previous`` (the text a change replaced) as a new version; drop the oldest
        beyond the limit. Returns its id. Raises OSError when it cannot be written."""
        self.folder.mkdir(mode=0o700, exist_ok=True)
        ids = self._ids()
        version = new_id(now, source, ids)
        atomic_write(self.folder / f"{version}{SUFFIX}",
                     kept_text(previous, source, sections).encode(), 0o600)
        for old in to_drop([*ids, version], self.limit):
            try:
                (self.folder / f"{old}{SUFFIX}").unlink()
            except FileNotFoundError:
                pass
        return version

    def entries(self) -> list[HistoryEntry]:
        """Every kept version, newest first."""
        found = []
        for version in sorted(self._ids(), reverse=True):
            try:
                with open(self.folder / f"{version}{SUFFIX}", encoding="utf-8",
                          errors="replace") as f:
                    head = f.read(_HEAD_BYTES)
            except OSError:
                continue
            entry = entry_of(version + SUFFIX, head)
            if entry is not None:
                found.append(entry)
        return found

    def read(self, version: str) -> str | None:
        """The config text of a kept version; None when there is no such version."""
        if not valid_id(version):
            return None
        try:
            text = (self.folder / f"{version}{SUFFIX}").read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            return None
        return split_kept(text)
