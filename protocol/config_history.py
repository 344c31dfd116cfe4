"""config.yaml's history (SPEC §13), pure: how a kept version is named, what its first
lines say, and which versions go when there are too many.

Every applied change keeps the file it replaced as ``config-history/<stamp>-<source>.yaml``.
The stamp is the UTC moment of the change to the millisecond (``20261202T183012.345Z``),
so names sort by time and the name is the entry's ``id``; ``source`` says what made the
change (``api``: the settings API, the console or the CLI; ``file``: a hand edit of
config.yaml; ``restore``: a restored version). Two header comment lines, added above the
kept text, say which sections the change touched; YAML ignores them, and a restore removes
them again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import attrs

__all__ = ["KEEP", "SOURCES", "HistoryEntry", "entry_of", "kept_text", "new_id",
           "split_kept", "to_drop", "valid_id"]

KEEP = 100  # versions kept; the oldest go first
SOURCES = ("api", "file", "restore")
SUFFIX = ".yaml"
_ID = re.compile(r"(\d{8}T\d{6}\.\d{3}Z)-(" + "|".join(SOURCES) + r")")
_FIRST = "# sluice config-history: the config.yaml that a change from {source} replaced\n"
_SECTIONS = "# sections: {sections}\n"


@attrs.frozen
class HistoryEntry:
    """One kept version, as ``GET /api/v1/settings/history`` lists it."""

    id: str
    at: str  # ISO 8601 UTC, to the millisecond
    source: str
    sections: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "at": self.at, "source": self.source,
                "sections": list(self.sections)}


def _stamp(epoch_ms: int) -> str:
    seconds, millis = divmod(epoch_ms, 1000)
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y%m%dT%H%M%S") + f".{millis:03d}Z"


def new_id(now: float, source: str, taken: Iterable[str]) -> str:
    """The id of a version kept at ``now`` (seconds since the epoch): unique among ``taken``
    (a later millisecond when that one is used already, so the order of changes holds)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    used = {t.partition("-")[0] for t in taken}
    ms = int(now * 1000)
    while _stamp(ms) in used:
        ms += 1
    return f"{_stamp(ms)}-{source}"


def entry_of(name: str, head: str = "") -> HistoryEntry | None:
    """The entry of a file named ``name`` in the history folder (None for any other file);
    ``head`` is the file's first lines, for its sections."""
    if not name.endswith(SUFFIX):
        return None
    match = _ID.fullmatch(name[:-len(SUFFIX)])
    if match is None:
        return None
    stamp, source = match.groups()
    moment = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S")
    at = moment.strftime("%Y-%m-%dT%H:%M:%S") + stamp[15:]
    return HistoryEntry(match.group(0), at, source, _sections(head))


def valid_id(text: str) -> bool:
    """A name the history could have made (anything else is never a file path)."""
    return _ID.fullmatch(text) is not None


def kept_text(previous: str, source: str, sections: Sequence[str]) -> str:
    """The kept file: the two header lines, then the replaced file's text as it was."""
    return (_FIRST.format(source=source) + _SECTIONS.format(sections=", ".join(sections))
            + previous)


def split_kept(text: str) -> str:
    """The config text of a kept file (its header lines removed)."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("# sluice config-history:"):
        lines = lines[1:]
        if lines and lines[0].startswith("# sections:"):
            lines = lines[1:]
    return "".join(lines)


def _sections(head: str) -> tuple[str, ...]:
    for line in head.splitlines()[:2]:
        if line.startswith("# sections:"):
            return tuple(s.strip() for s in line[len("# sections:"):].split(",") if s.strip())
    return ()


def to_drop(ids: Iterable[str], keep: int = KEEP) -> list[str]:
    """The oldest ids beyond the newest ``keep``."""
    ordered = sorted(ids)
    return ordered[:max(0, len(ordered) - keep)]
