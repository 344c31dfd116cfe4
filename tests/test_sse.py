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


@pytest.mark.slow
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


def _named(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


NAMED_EVENTS = [
    _named("message_start", '{"type":"message_start","message":{"usage":{"input_tokens":3}}}'),
    # Text that names a last event, inside an event that is not one.
    _named("content_block_delta",
           '{"type":"content_block_delta","delta":{"text":"event: message_stop\\n\\n"}}'),
    _named("response.output_text.delta", '{"delta":"response.completed"}'),
    _named("message_stop", '{"type":"message_stop"}'),
    _named("response.completed", '{"type":"response.completed","response":{"output":"'
           + "x" * 300 + '"}}'),
    _named("response.failed", '{"response":{"status":"failed"},"type":"response.failed"}'),
    _named("response.incomplete", '{"type":"response.incomplete"}'),
    b": keep-alive\n\n",
]


def reference_named_end(stream: bytes) -> bool:
    """The stream stands on an event boundary and its last event with data is named one of
    the last events."""
    if not stream or not reference_boundary(stream):
        return False
    blocks = [b for b in stream.split(b"\n\n") if b and not b.startswith(b":")]
    if not blocks:
        return False
    lines = blocks[-1].split(b"\n")
    names = [line[6:].strip() for line in lines if line.startswith(b"event:")]
    return bool(names) and names[-1] in {b"message_stop", b"response.completed",
                                         b"response.failed", b"response.incomplete"} and any(
        line.startswith(b"data:") for line in lines)


@given(st.lists(st.integers(0, len(NAMED_EVENTS) - 1), min_size=1, max_size=6),
       st.integers(0, 2000), st.lists(st.integers(0, 2000), max_size=8))
@settings(max_examples=400)
def test_a_named_stream_ends_at_its_last_event_however_the_reads_fall(
        picks: list[int], length: int, cuts: list[int]) -> None:
    """Anthropic's and the Responses API's streams: ``ended`` after an event named
    message_stop or response.completed/failed/incomplete (and its data line and blank
    line) only, whatever names the text of other events holds, for every prefix of the
    stream and any split of it into reads."""
    stream = b"".join(NAMED_EVENTS[i] for i in picks)[:length]
    observer = SseObserver()
    start = 0
    for cut in sorted({min(c, len(stream)) for c in cuts} | {len(stream)}):
        observer.see(stream[start:cut])
        start = cut
    assert observer.ended is reference_named_end(stream), stream


def test_a_named_stream_ends_through_chunk_framing() -> None:
    """Forwarded with its chunk framing (one chunk per event, the terminating chunk still to
    come): ended after the last event's chunk, not after any earlier one."""
    events = [NAMED_EVENTS[0], NAMED_EVENTS[2], NAMED_EVENTS[4]]
    observer = SseObserver()
    seen = []
    for event in events:
        observer.see(b"%x\r\n" % len(event) + event + b"\r\n")
        seen.append(observer.ended)
    assert seen == [False, False, True]
    # Split mid-event by the framing: its event line in one chunk, its data in the next.
    observer = SseObserver()
    first, rest = NAMED_EVENTS[3].split(b"\n", 1)
    for part in (NAMED_EVENTS[0], first + b"\n"):
        observer.see(b"%x\r\n" % len(part) + part + b"\r\n")
        assert not observer.ended
    observer.see(b"%x\r\n" % len(rest) + rest + b"\r\n")
    assert observer.ended


def test_a_chat_stream_is_not_ended_by_named_text() -> None:
    """A Chat Completions stream ends only at ``[DONE]``; its text may say anything."""
    ends: list[int] = []
    observer = SseObserver(lambda: ends.append(observer.events))
    observer.see(b'data: {"choices":[{"delta":{"content":"event: message_stop"}}]}\n\n')
    observer.see(b'data: {"choices":[{"delta":{"content":"data: [DONE]"}}]}\n\n')
    assert not observer.ended
    observer.see(b"data: [DONE]\n\n")
    assert observer.ended
    assert ends == [3]  # on_end: at the read that ended it
