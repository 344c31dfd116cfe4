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
