"""protocol/sse.py: the event-boundary check the relay uses before appending its own error
event, checked against a reference SSE line parser on whole streams, every prefix of them,
and random bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.sse import TAIL, SseObserver, ends_event


def reference_boundary(stream: bytes) -> bool:
    """WHATWG line rules, on the whole stream: True when nothing of an event is pending."""
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not text:
        return True
    if not text.endswith(b"\n"):
        return False  # a line is half-sent
    lines = text[:-1].split(b"\n")
    return lines[-1] == b""


STREAMS = [
    b"",
    b'data: {"choices":[]}\n\n',
    b'data: {"a":1}\n\ndata: [DONE]\n\n',
    b"data: x\r\n\r\n",
    b"data: x\r\r",
    b"data: x\n\r\n",
    b": keep-alive\n\n",
    b"event: response.completed\ndata: {}\n\n",
    b'data: {"choices":[{"delta":{"content":"caf\xc3\xa9"}}]}\n\n',
]


@pytest.mark.parametrize("stream", STREAMS)
def test_every_prefix_of_real_streams(stream: bytes) -> None:
    for end in range(len(stream) + 1):
        prefix = stream[:end]
        assert ends_event(prefix[-TAIL:]) is reference_boundary(prefix), prefix


@pytest.mark.parametrize(("tail", "boundary"), [
    (b"", True), (b"x\n\n", True), (b"\r\n\r\n", True), (b"\n\r\n", True), (b"a\r\r", True),
    (b"data: x\n", False), (b"data", False), (b"\n", True), (b"x\r\n", False),
])
def test_tails(tail: bytes, boundary: bool) -> None:
    assert ends_event(tail) is boundary


@given(st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"data: ", b"x", b":", b"\xc3\xa9",
                                 b"\x00"]), max_size=12))
@settings(max_examples=500, derandomize=True)
def test_matches_the_reference_on_random_streams(pieces: list[bytes]) -> None:
    stream = b"".join(pieces)
    # A lone CR at the very end might still become CRLF; both readings agree it ends a line.
    assert ends_event(stream[-TAIL:]) is reference_boundary(stream)


@given(st.lists(st.sampled_from([b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
                                 b'data: {"x":1}\r\n\r\n', b": keep-alive\n\n"]), max_size=6),
       st.booleans(), st.lists(st.integers(0, 200), max_size=8))
@settings(max_examples=300)
def test_the_observer_sees_the_done_event_at_the_end_however_the_reads_fall(
        events: list[bytes], done: bool, cuts: list[int]) -> None:
    """``ended`` is whether the stream so far ends with ``data: [DONE]`` and its blank line,
    for any split of the stream into reads (the observer keeps only the reads' ends)."""
    stream = b"".join(events) + (b"data: [DONE]\n\n" if done else b"")
    observer = SseObserver()
    start = 0
    for cut in sorted({min(c, len(stream)) for c in cuts} | {len(stream)}):
        observer.see(stream[start:cut])
        start = cut
    assert observer.ended is done
