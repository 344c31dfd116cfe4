"""What the relay needs to know about an SSE stream: whether it stands on an event boundary.

The relay forwards SSE bytes verbatim and never parses events; when a stream breaks after
the response was committed it appends one error event of its own, and that event must not be
glued onto a half-sent one. Whether the bytes sent so far end an event can be told from
their last few bytes (WHATWG HTML §9.2.6: lines end in CRLF, LF or CR; a blank line ends an
event), so the relay keeps only those. :func:`error_event` is that event.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from protocol.errors import Family, SluiceError

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


def error_event(err: SluiceError, at_boundary: bool, family: Family = Family.OPENAI) -> bytes:
    """One SSE event carrying ``err`` in ``family``'s shape (SPEC §7.4, §12), starting on a
    fresh event boundary (``at_boundary``: the stream so far already ends an event):
    ``data: {"error": {...}}`` for Chat Completions; ``event: error`` with Anthropic's
    ``{"type": "error", "error": {type, message}}``; ``event: error`` with the Responses
    API's ``{"type": "error", code, message, param}``."""
    prefix = b"" if at_boundary else b"\n\n"
    if family is Family.ANTHROPIC:
        value: object = {"type": "error", "error": err.anthropic_dict()}
    elif family is Family.RESPONSES:
        value = {"type": "error", "code": err.code, "message": err.message, "param": err.param}
    else:
        value = {"error": err.to_dict()}
    payload = json.dumps(value, separators=(",", ":")).encode()
    event = b"data: " if family not in _NAMED else b"event: error\ndata: "
    return prefix + event + payload + b"\n\n"


_NAMED = frozenset({Family.ANTHROPIC, Family.RESPONSES})  # their events are named


_DATA_LINE = b"\ndata:"
_EVENT_LINE = b"\nevent:"
_USAGE_KEY = b'"usage"'
_TIMINGS_KEY = b'"timings"'  # llama.cpp's own figures (its cache_n: prompt tokens reused)
_DONE_EVENT = b"data: [DONE]"
_DONE_TAIL = 18  # "data: [DONE]", its blank line and a chunk's CRLF fit in this
USAGE_LINE_CAP = 64 * 1024  # a usage event line longer than this is not kept
# The last event of the streams whose events are named (Anthropic's Messages, the Responses
# API): the upstream ends the body after it, and a client may leave.
LAST_EVENTS = frozenset({b"message_stop", b"response.completed", b"response.failed",
                         b"response.incomplete"})
_CARRY = 48  # a named stream's last bytes kept: an event line with its name fits in this


class SseObserver:
    """Watches the bytes of an SSE stream as they are relayed, never changing them: counts
    the ``data:`` lines (one per event in every upstream we know), keeps the last line
    that mentions ``"usage"`` (the final usage chunk; parsed once, when the request ends, by
    :func:`protocol.request_record.usage_from_event`), and tells whether the stream so far
    ends with its last event (:attr:`ended`).

    It may be given the stream's chunk framing too (the relay forwards chunked bodies
    verbatim): a chunk-size line ends in LF, so a ``data:`` line at the start of a chunk is
    still seen after one, and the framing holds neither ``data:`` nor ``"usage"``; only a
    usage event split across two chunks is then lost (its line holds the framing). Per read
    it costs a few searches in C; the unfinished last line of a read is kept (up to
    :data:`USAGE_LINE_CAP`) so a line split across reads is still seen whole.

    The last event depends on the stream's grammar, known at its first data line: a stream
    without ``event:`` lines (Chat Completions, completions) ends with ``data: [DONE]``,
    found in the stream's last bytes; a stream of named events (Anthropic's Messages, the
    Responses API) with an ``event:`` line naming one of :data:`LAST_EVENTS`, its ``data:``
    line and a blank line. The reads of such a stream (and those before any data line) are
    searched once more, for their last ``event:`` line, with the stream's last
    :data:`_CARRY` bytes before them (a line split between reads is still seen).
    ``on_end`` is called for each read after which the stream ends with its last event (the
    relay's hook: the routing index learns the answer before that read is relayed)."""

    __slots__ = ("_before", "_carry", "_clean", "_event_lines", "_last", "_last_data",
                 "_last_named", "_named", "_named_end", "_on_end", "_partial", "_tail", "events",
                 "first_usage_line", "timings_line", "usage_line")

    def __init__(self, on_end: Callable[[], object] | None = None) -> None:
        self._on_end = on_end
        self.events = 0
        self.usage_line: bytes | None = None
        # The first such line: Anthropic's message_start, whose usage has the input tokens
        # (message_delta's, the last, has the output tokens).
        self.first_usage_line: bytes | None = None
        # The last line that mentions "timings": llama.cpp's last chunk, whose cache_n says
        # how many prompt tokens it reused (a stream without include_usage has no usage).
        self.timings_line: bytes | None = None
        self._last = self._before = b""  # the stream's end: the last reads' last bytes
        self._clean = True  # the bytes so far end a line (or there are none)
        self._tail = b""  # the last 5 bytes so far, while they do not end a line
        self._partial: bytearray | None = bytearray()  # an unfinished line (None: too long)
        self._named: bool | None = None  # events have event: lines (None: no data line yet)
        self._event_lines = False  # an event: line was seen (before the first data line)
        self._carry = b"\n"  # named (or not known yet): the stream's last _CARRY bytes
        self._last_named = False  # the last event: line names one of LAST_EVENTS
        self._last_data = False  # ... and that event's data: line has come
        self._named_end = False  # a named stream ends with its last event

    def __repr__(self) -> str:
        return f"SseObserver(events={self.events}, ended={self.ended})"

    @property
    def ended(self) -> bool:
        """The stream so far ends with its last event: a client may leave now without
        waiting for the body's last chunk (the OpenAI SDKs do at ``[DONE]``, the Codex CLI
        at ``response.completed``); it got the whole answer."""
        named = self._named
        if named is None:
            return False
        if named:
            return self._named_end
        return _DONE_EVENT in self._before[-_DONE_TAIL:] + self._last[-_DONE_TAIL:]

    def see(self, data: bytes) -> None:
        if not data:
            return
        if len(data) >= _DONE_TAIL:  # only the ends are kept: a held stream holds no read
            self._before, self._last = self._last, data[-_DONE_TAIL:]
        else:  # short reads are joined, so the two hold the stream's true end
            self._last = (self._last + data)[-2 * _DONE_TAIL:]
        events = data.count(_DATA_LINE)
        if self._clean:  # only the line end just before can begin a "\ndata:" with data
            tail = b"\n"
            if data.startswith(b"data:"):
                events += 1
        else:
            tail = self._tail
            if _DATA_LINE in tail + data[:5]:  # a "\ndata:" across reads
                events += 1
        self.events += events
        clean = data.endswith(b"\n")
        if self._named is not False:
            self._see_named(data, events, clean)
        elif self._on_end is not None and b"]" in self._last and self.ended:
            self._on_end()
        if clean and self._clean and _USAGE_KEY not in data and _TIMINGS_KEY not in data:
            return  # the usual read: whole lines, none of them about usage
        if not clean:
            self._tail = (tail + data)[-5:]
        self._clean = clean
        self._lines(data)

    def _see_named(self, data: bytes, events: int, clean: bool) -> None:
        """A stream of named events, or one whose grammar is not known yet: follow its last
        ``event:`` line (whether it names its last event, whether that event's data line
        has come) and, at its first data line, tell the grammar."""
        self._follow_named(data, events)
        named = self._named
        if named is None:
            if not self.events:
                return
            self._named = named = self._event_lines  # its first data line: the grammar
        if named:
            self._named_end = end = (clean and self._last_named and self._last_data
                                     and ends_event(self._carry[-TAIL:]))
        else:
            end = self.ended
        if end and self._on_end is not None:
            self._on_end()

    def _follow_named(self, data: bytes, events: int) -> None:
        window = data
        at = data.rfind(_EVENT_LINE)
        if at < 0:  # none in this read: one split between reads, or still the carry's
            window = self._carry + data[:_CARRY]
            at = window.rfind(_EVENT_LINE)
        self._carry = data[-_CARRY:] if len(data) >= _CARRY else (self._carry + data)[-_CARRY:]
        if at < 0:
            if self._last_named and events:
                self._last_data = True
            return
        self._event_lines = True
        end = window.find(b"\n", at + 1)
        if end < 0:  # the line goes on in the next read (which finds it in the carry)
            self._last_named = False
            return
        self._last_named = window[at + 7:end].strip() in LAST_EVENTS
        self._last_data = self._last_named and window.find(_DATA_LINE, end) >= 0

    def _lines(self, data: bytes) -> None:
        """The usage line, when it is in ``data`` or finished by it; the unfinished rest."""
        start = 0
        partial = self._partial
        if partial is None or partial:  # the rest of a line begun in an earlier read
            newline = data.find(b"\n")
            if newline < 0:
                if partial is not None:
                    self._grow(partial, data)
                return
            if partial is not None:
                line = partial + data[:newline]
                if _USAGE_KEY in line:
                    self.usage_line = bytes(line)
                    if self.first_usage_line is None:
                        self.first_usage_line = self.usage_line
                if _TIMINGS_KEY in line:
                    self.timings_line = bytes(line)
            self._partial = bytearray()
            start = newline + 1
        last = data.rfind(b"\n")
        if last >= start:  # whole lines in data[start:last]
            key = data.rfind(_USAGE_KEY, start, last)
            if key >= 0:
                self.usage_line = _line_at(data, key, start)
                if self.first_usage_line is None:
                    self.first_usage_line = _line_at(data, data.find(_USAGE_KEY, start), start)
            key = data.rfind(_TIMINGS_KEY, start, last)
            if key >= 0:
                self.timings_line = _line_at(data, key, start)
            start = last + 1
        if start < len(data):
            self._grow(self._partial, data[start:])  # type: ignore[arg-type]

    def _grow(self, partial: bytearray, more: bytes) -> None:
        if len(partial) + len(more) > USAGE_LINE_CAP:
            self._partial = None  # skip the rest of this line
        else:
            partial += more


def _line_at(data: bytes, at: int, start: int) -> bytes:
    """The whole line of ``data`` around index ``at`` (not before ``start``)."""
    begin = max(data.rfind(b"\n", start, at) + 1, start)
    return data[begin:data.find(b"\n", at)]
