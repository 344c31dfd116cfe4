"""What the relay needs to know about an SSE stream: whether it stands on an event boundary.

The relay forwards SSE bytes verbatim and never parses events; when a stream breaks after
the response was committed it appends one error event of its own, and that event must not be
glued onto a half-sent one. Whether the bytes sent so far end an event can be told from
their last few bytes (WHATWG HTML §9.2.6: lines end in CRLF, LF or CR; a blank line ends an
event), so the relay keeps only those. :func:`error_event` is that event.
"""

from __future__ import annotations

import json

from protocol.errors import SluiceError

TAIL = 4  # bytes of the stream kept to answer :func:`ends_event`


def ends_event(tail: bytes) -> bool:
    """Whether a stream whose last bytes are ``tail`` (at least :data:`TAIL` of them, or the
    whole stream) stands on an event boundary: its last line ended and was blank. An empty
    stream does too."""
    if not tail:
        return True
    for ending in (b"\r\n", b"\n", b"\r"):
        if tail.endswith(ending):
            rest = tail[: -len(ending)]
            return not rest or rest.endswith((b"\n", b"\r"))
    return False


def error_event(err: SluiceError, at_boundary: bool) -> bytes:
    """One SSE event carrying ``err`` OpenAI-shaped, starting on a fresh event boundary
    (``at_boundary``: the stream so far already ends an event)."""
    prefix = b"" if at_boundary else b"\n\n"
    payload = json.dumps({"error": err.to_dict()}, separators=(",", ":")).encode()
    return prefix + b"data: " + payload + b"\n\n"


_DATA_LINE = b"\ndata:"
_USAGE_KEY = b'"usage"'
USAGE_LINE_CAP = 64 * 1024  # a usage event line longer than this is not kept


class SseObserver:
    """Watches the bytes of an SSE stream as they are relayed, never changing them: counts
    the ``data:`` lines (one per event in every upstream we know) and keeps the last line
    that mentions ``"usage"`` (the final usage chunk; parsed once, when the request ends, by
    :func:`protocol.request_record.usage_from_event`).

    It may be given the stream's chunk framing too (the relay forwards chunked bodies
    verbatim): a chunk-size line ends in LF, so a ``data:`` line at the start of a chunk is
    still seen after one, and the framing holds neither ``data:`` nor ``"usage"``. Per read
    it costs a count and a search in C."""

    __slots__ = ("_open", "_prev", "events", "usage_line")

    def __init__(self) -> None:
        self.events = 0
        self.usage_line: bytes | None = None
        self._prev = b"\n"  # the last bytes seen (a stream starts on a line of its own)
        self._open: bytearray | None = None  # a usage line whose end has not come yet

    def __repr__(self) -> str:
        return f"SseObserver(events={self.events})"

    def see(self, data: bytes) -> None:
        if not data:
            return
        self.events += data.count(_DATA_LINE)
        edge = self._prev + data[:5]  # a "\ndata:" across two reads
        if _DATA_LINE in edge:
            self.events += 1
        self._prev = data[-5:] if len(data) >= 5 else (self._prev + data)[-5:]
        opened = self._open
        after = 0
        if opened is not None:
            end = data.find(b"\n")
            if end < 0:
                if len(opened) + len(data) > USAGE_LINE_CAP:
                    self._open = None
                else:
                    opened += data
                return
            opened += data[:end]
            self.usage_line = bytes(opened)
            self._open = None
            after = end
        key = data.rfind(_USAGE_KEY, after)
        if key < 0:
            return
        start = data.rfind(b"\n", 0, key) + 1
        end = data.find(b"\n", key)
        if end < 0:
            self._open = bytearray(data[start:])
        else:
            self.usage_line = data[start:end]
