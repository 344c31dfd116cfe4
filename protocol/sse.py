"""A Server-Sent Events *observer* (WHATWG HTML §9.2.6 line rules).

It watches the bytes the relay forwards and reports what it saw: how many events were
dispatched, whether ``data: [DONE]`` came, and whether the stream currently stands on an
event boundary (so the gateway can append its own error event cleanly). It never produces
the bytes that are forwarded, and it keeps at most a short prefix of the current line, so a
1 MiB event costs no memory.
"""

from __future__ import annotations

_PREFIX_CAP = 32  # bytes of a line kept: enough to recognise "data: [DONE]"
_DONE = b"[DONE]"


class SSEObserver:
    __slots__ = ("_data_in_event", "_fields_in_event", "_has_data", "_line", "_line_len",
                 "_pending_cr", "done", "events")

    def __init__(self) -> None:
        self.events = 0  # events dispatched (a blank line after at least one data line)
        self.done = False  # a `data: [DONE]` event was dispatched
        self._line = b""  # prefix of the current unfinished line
        self._line_len = 0  # full length of the current unfinished line
        self._pending_cr = False  # the last byte fed was CR: a following LF belongs to it
        self._fields_in_event = False  # a field line (not a comment) since the last blank line
        self._has_data = False  # a data line since the last blank line
        self._data_in_event = b""  # first data value of the current event (prefix)

    def __repr__(self) -> str:
        return (f"SSEObserver(events={self.events}, done={self.done}, "
                f"at_boundary={self.at_boundary})")

    @property
    def at_boundary(self) -> bool:
        """True when the next byte would start a new event (nothing is half-sent)."""
        return self._line_len == 0 and not self._fields_in_event

    def feed(self, data: bytes) -> int:
        """Observe the next bytes of the stream; returns how many events they completed."""
        if not data:
            return 0
        if self._pending_cr:
            self._pending_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            if data.endswith(b"\r"):
                self._pending_cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        before = self.events
        last = lines.pop()  # the unfinished rest (b"" when data ended with a line break)
        for line in lines:
            if self._line_len:
                line = (self._line + line)[:_PREFIX_CAP]
                self._line = b""
                self._line_len = 0
            self._end_line(line)
        if last:
            if self._line_len < _PREFIX_CAP:
                self._line = (self._line + last)[:_PREFIX_CAP]
            self._line_len += len(last)
        return self.events - before

    def _end_line(self, line: bytes) -> None:
        if not line:
            if self._fields_in_event:
                if self._has_data:
                    self.events += 1
                    if self._data_in_event == _DONE:
                        self.done = True
                self._fields_in_event = False
                self._has_data = False
                self._data_in_event = b""
            return
        if line[:1] == b":":
            return  # a comment
        self._fields_in_event = True
        if line.startswith(b"data"):
            value = line[4:]
            if value[:1] == b":":
                value = value[1:]
                if value[:1] == b" ":
                    value = value[1:]
                if not self._has_data:
                    self._data_in_event = value[:_PREFIX_CAP]
                else:
                    self._data_in_event = b"\n"  # multi-line data is never [DONE]
                self._has_data = True
            elif not value:  # "data" with no colon: an empty data line
                self._data_in_event = b"" if not self._has_data else b"\n"
                self._has_data = True
