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
_BLANK = [b""]


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

    @property
    def at_event_start(self) -> bool:
        """Nothing is held: the next byte begins a line of a new event."""
        return self._started and not (self._line or self._data or self._skip_lf)

    @property
    def between_events(self) -> bool:
        """Nothing is held, the first bytes perhaps not seen yet: a piece that begins with
        a ``data:`` line (so with no byte order mark) begins a new event."""
        return not (self._line or self._data or self._skip_lf)

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
        last_cr = data.rfind(b"\r")
        end = max(data.rfind(b"\n"), last_cr)
        if end < 0:
            self._line = data
            self._check()
            return []
        self._line = data[end + 1:]
        if data[end] == 13:  # b"\r": a LF may come first in the next piece
            self._skip_lf = True
        body = data[:end + 1]
        events: list[bytes] = []
        if last_cr >= 0:
            self._take(body.splitlines(), events)
        else:
            # LF only (llama.cpp's and OpenAI's streams): a blank line is "\n\n", so the
            # events are the blocks between them, and most blocks are one "data: " line,
            # taken whole; any other block goes line by line. (find, not "in": bytes'
            # "in" tries its operand as an int first, and raises and clears a TypeError.)
            *blocks, rest = body.split(b"\n\n")
            if (not rest and not self._data and body.count(b"\n") == 2 * len(blocks)
                    and body.count(b"\n\ndata: ") == len(blocks) - 1
                    and body.startswith(b"data: ")):
                # Every block is one "data: " line (the only LFs are the blank lines, and
                # each block starts so): the common piece, taken in one step.
                self._check()
                return [block[6:] for block in blocks]
            for block in blocks:
                if block[:6] == b"data: " and not self._data and block.find(b"\n") < 0:
                    events.append(block[6:])
                else:
                    self._take(block.split(b"\n"), events)
                    self._take(_BLANK, events)
            if rest:  # finished lines of an unfinished event
                self._take(rest[:-1].split(b"\n"), events)
        self._check()
        return events

    def _take(self, lines: list[bytes], events: list[bytes]) -> None:
        """Finished lines, one by one: a blank one ends the event, ``data`` lines are its
        data, comments and other fields are skipped."""
        pending, held = self._data, self._held
        for line in lines:
            if not line:
                if pending:
                    events.append(pending[0] if len(pending) == 1 else b"\n".join(pending))
                    pending = []
                    held = 0
            elif line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                pending.append(value)
                held += len(value) + 1
            elif line == b"data":  # "data" alone: an empty data line
                pending.append(b"")
                held += 1
            # comments and every other field ("dataX..." too): nothing to do
        self._data, self._held = pending, held

    def _check(self) -> None:
        if self._held + len(self._line) > EVENT_CAP:
            raise EventTooLarge(f"an event longer than {EVENT_CAP} bytes")
