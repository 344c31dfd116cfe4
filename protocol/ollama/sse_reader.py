"""The ``data`` of each server-sent event, from bytes that arrive in pieces of any size.

WHATWG HTML §9.2.6 in the small: lines end in CRLF, LF or CR (a CR at the end of a piece
may be the first half of a CRLF, so a LF right after it is skipped); a blank line ends an
event; ``data:`` lines (one space after the colon dropped) are joined with ``\\n``;
comments (``:`` lines, llama.cpp's keep-alive pings), ``event:``, ``id:`` and ``retry:``
lines are skipped; an event with no data is none; a UTF-8 byte order mark at the very start
is dropped. Only the unfinished line and the unfinished event are held, up to
:data:`EVENT_CAP` bytes together: a model server's event is far smaller. An unfinished
event when the stream ends is dropped, as the standard says.
"""

from __future__ import annotations

__all__ = ["EVENT_CAP", "EventTooLarge", "SseReader"]

EVENT_CAP = 4 << 20  # bytes of one event (its lines and the unfinished line) held at most
_BOM = b"\xef\xbb\xbf"


class EventTooLarge(ValueError):
    """An event (or a line) longer than :data:`EVENT_CAP`."""


class SseReader:
    """Feed it the stream's bytes as they come; it gives the data of each finished event."""

    __slots__ = ("_data", "_held", "_line", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._line = b""  # the unfinished last line
        self._data: list[bytes] = []  # the data lines of the unfinished event
        self._held = 0  # bytes in _data
        self._skip_lf = False  # the last piece ended with CR: a LF first is its pair
        self._started = False  # the first bytes were seen (for the byte order mark)

    def __repr__(self) -> str:
        return f"SseReader(held={self._held + len(self._line)})"

    def feed(self, piece: bytes) -> list[bytes]:
        """The data (bytes, lines joined) of every event that ``piece`` finishes."""
        if not piece:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if piece[:1] == b"\n":
                piece = piece[1:]
                if not piece:
                    return []
        data = self._line + piece if self._line else piece
        if not self._started:
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._line = data
                self._check()
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[len(_BOM):]
        end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if end < 0:
            self._line = data
            self._check()
            return []
        self._line = data[end + 1:]
        if data[end] == 13:  # b"\r": a LF may come first in the next piece
            self._skip_lf = True
        events: list[bytes] = []
        for line in data[:end + 1].splitlines():
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                    self._held = 0
            elif line.startswith(b"data"):
                self._field(line)
            # comments and every other field: nothing to do
        self._check()
        return events

    def _field(self, line: bytes) -> None:
        if len(line) == 4:  # "data" alone: an empty data line
            value = b""
        elif line[4:5] == b":":
            value = line[6:] if line[5:6] == b" " else line[5:]
        else:  # "dataX...": another field's name
            return
        self._data.append(value)
        self._held += len(value) + 1

    def _check(self) -> None:
        if self._held + len(self._line) > EVENT_CAP:
            raise EventTooLarge(f"an event longer than {EVENT_CAP} bytes")
