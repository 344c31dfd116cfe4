"""SSEObserver: every stream fed whole, one byte at a time and split at random points.

The observations (events counted, ``done``, ``at_boundary``) must not depend on how the
bytes were cut into feeds (ARCHITECTURE.md, Habits 9).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.sse import SSEObserver

Observation = tuple[int, int, bool, bool]  # (sum of feed() results, events, done, at_boundary)

_SETTINGS = settings(max_examples=200, derandomize=True, deadline=None)


def observe(pieces: Iterable[bytes]) -> Observation:
    obs = SSEObserver()
    total = 0
    for piece in pieces:
        count = obs.feed(piece)
        assert count >= 0
        total += count
    return total, obs.events, obs.done, obs.at_boundary


def whole(data: bytes) -> list[bytes]:
    return [data]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


def split_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """Cut ``data`` at the given indices (modulo its length; repeats give empty feeds)."""
    points = sorted(c % (len(data) + 1) for c in cuts)
    pieces: list[bytes] = []
    start = 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


def reference(stream: bytes) -> tuple[int, bool, bool]:
    """A straightforward WHATWG line parser over the whole stream: (events, done, boundary)."""
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    *lines, rest = text.split(b"\n")
    events = 0
    done = False
    fields = False
    data: list[bytes] = []
    for line in lines:
        if not line:
            if data:
                events += 1
                done = done or data == [b"[DONE]"]
            fields = False
            data = []
        elif line.startswith(b":"):
            continue
        else:
            fields = True
            name, _, value = line.partition(b":")
            if name == b"data":
                if value.startswith(b" "):
                    value = value[1:]
                data.append(value)
    return events, done, not rest and not fields


def assert_same_every_way(stream: bytes, cuts: Sequence[int] = (), *,
                          all_pairs: bool = True) -> Observation:
    """Whole, bytewise, every 2-way split (short streams) and ``cuts`` agree; returns it."""
    expected = observe(whole(stream))
    assert expected[0] == expected[1]  # feed() results add up to `events`
    assert observe(bytewise(stream)) == expected
    if all_pairs and len(stream) <= 512:
        for i in range(len(stream) + 1):
            assert observe([stream[:i], stream[i:]]) == expected, f"split at {i}"
    if cuts:
        assert observe(split_at(stream, cuts)) == expected
    return expected


# --- fixed streams: (bytes, events, done, at_boundary at the end) -------------------------

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"total_tokens":7}}\n\n'
DONE = b"data: [DONE]\n\n"

LLAMA_CPP = ROLE + TOKEN + TOKEN + FINISH + USAGE + DONE
RESPONSES_API = (
    b'event: response.created\ndata: {"type":"response.created"}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"delta":"Hi"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed"}\n\n'
)

STREAMS: dict[str, tuple[bytes, int, bool, bool]] = {
    "llama.cpp bare LF": (LLAMA_CPP, 6, True, True),
    "llama.cpp no DONE": (ROLE + TOKEN + FINISH, 3, False, True),
    "CRLF": (LLAMA_CPP.replace(b"\n", b"\r\n"), 6, True, True),
    "lone CR": (LLAMA_CPP.replace(b"\n", b"\r"), 6, True, True),
    "mixed line endings": (b"data: a\r\n\rdata: b\r\r\ndata: [DONE]\n\r", 3, True, True),
    "utf-8 multibyte": (
        'data: {"content":"é€😀"}\n\n'.encode() + DONE, 2, True, True),
    "keep-alive before first data": (b":\n\n:\n\n" + LLAMA_CPP, 6, True, True),
    "keep-alive between events": (
        ROLE + b": ping - 2025-01-01 00:00:00.000000\n\n" + TOKEN + b":\n\n" + DONE,
        3, True, True),
    "comment inside an event": (b"data: a\n: ping\ndata: b\n\n", 1, False, True),
    "comment inside DONE event": (b"data: [DONE]\n: ping\n\n", 1, True, True),
    "only comments": (b":\n\n: ping\n\n:x\n", 0, False, True),
    "responses api": (RESPONSES_API, 3, False, True),
    "DONE with space": (b"data: [DONE]\n\n", 1, True, True),
    "DONE without space": (b"data:[DONE]\n\n", 1, True, True),
    "DONE CRLF": (b"data: [DONE]\r\n\r\n", 1, True, True),
    "DONE with suffix": (b"data: [DONE]x\n\n", 1, False, True),
    "DONE with two spaces": (b"data:  [DONE]\n\n", 1, False, True),
    "DONE lowercase": (b"data: [done]\n\n", 1, False, True),
    "DONE in event field": (b"event: [DONE]\ndata: x\n\n", 1, False, True),
    "multi-line DONE": (b"data: [DONE]\ndata: [DONE]\n\n", 1, False, True),
    "multi-line data then DONE line": (b"data: x\ndata: [DONE]\n\n", 1, False, True),
    "DONE then empty data": (b"data: [DONE]\ndata\n\n", 1, False, True),
    "DONE not yet dispatched": (b"data: [DONE]\n", 0, False, False),
    "DONE without trailing newline": (b"data: [DONE]", 0, False, False),
    "empty data field": (b"data\n\n", 1, False, True),
    "empty data value": (b"data:\n\n", 1, False, True),
    "event without data": (b"event: ping\n\n", 0, False, True),
    "id and retry only": (b"id: 1\nretry: 10\n\n", 0, False, True),
    "unknown field like data": (b"datax: [DONE]\n\n", 0, False, True),
    "field without colon": (b"data x\n\n", 0, False, True),
    "blank lines only": (b"\n\n\r\n\r\r", 0, False, True),
    "mid line": (b"data: x", 0, False, False),
    "mid event": (b"data: x\n", 0, False, False),
    "mid event after event": (b"event: a\n", 0, False, False),
    "mid comment line": (DONE + b": pi", 1, True, False),
    "two events in one chunk": (ROLE + TOKEN, 2, False, True),
    "empty stream": (b"", 0, False, True),
}


@pytest.mark.parametrize(("stream", "events", "done", "boundary"), list(STREAMS.values()),
                         ids=list(STREAMS))
def test_fixed_streams_every_way(stream: bytes, events: int, done: bool, boundary: bool) -> None:
    assert assert_same_every_way(stream) == (events, events, done, boundary)
    assert reference(stream) == (events, done, boundary)


@_SETTINGS
@given(name=st.sampled_from(list(STREAMS)),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_fixed_streams_random_splits(name: str, cuts: list[int]) -> None:
    stream, events, done, boundary = STREAMS[name]
    assert observe(split_at(stream, cuts)) == (events, events, done, boundary)


# --- per-feed counts and boundaries --------------------------------------------------------


def test_feed_returns_events_completed_by_this_feed() -> None:
    obs = SSEObserver()
    assert obs.feed(b":\n\n") == 0  # a keep-alive may be the very first chunk
    assert obs.at_boundary
    assert obs.feed(ROLE + TOKEN) == 2  # llama.cpp packs two events into one chunk
    assert obs.feed(TOKEN[:10]) == 0
    assert obs.feed(TOKEN[10:] + FINISH + USAGE[:-1]) == 2
    assert not obs.at_boundary
    assert obs.feed(USAGE[-1:]) == 1
    assert not obs.done
    assert obs.feed(DONE) == 1
    assert obs.done
    assert obs.events == 6
    assert obs.at_boundary


def test_empty_feed_returns_zero_and_changes_nothing() -> None:
    obs = SSEObserver()
    assert obs.feed(b"") == 0
    assert (obs.events, obs.done, obs.at_boundary) == (0, False, True)
    obs.feed(b"data: x\n")
    assert obs.feed(b"") == 0
    assert not obs.at_boundary
    assert obs.feed(b"\n") == 1
    assert obs.feed(b"") == 0
    assert obs.events == 1


def test_at_boundary_through_an_event() -> None:
    obs = SSEObserver()
    assert obs.at_boundary
    obs.feed(b"data")
    assert not obs.at_boundary  # middle of a line
    obs.feed(b": x")
    assert not obs.at_boundary
    obs.feed(b"\n")
    assert not obs.at_boundary  # middle of an event: the blank line has not come
    obs.feed(b"\n")
    assert obs.at_boundary
    assert obs.events == 1


def test_at_boundary_with_comments() -> None:
    obs = SSEObserver()
    obs.feed(b":")
    assert not obs.at_boundary  # a comment line half-sent is not a boundary
    obs.feed(b" ping\n")
    assert obs.at_boundary  # a complete comment between events keeps the boundary
    obs.feed(b"\n")
    assert obs.at_boundary
    assert obs.events == 0
    obs.feed(b"data: x\n: ping\n")
    assert not obs.at_boundary  # a comment inside an event does not end it
    obs.feed(b"\n")
    assert obs.at_boundary
    assert obs.events == 1


def test_pending_cr_then_lf_in_next_feed_is_one_line_break() -> None:
    obs = SSEObserver()
    assert obs.feed(b"data: [DONE]\r") == 0
    assert not obs.at_boundary  # the data line ended; the event has not
    assert obs.feed(b"\n") == 0  # LF of the CRLF: not a blank line
    assert obs.events == 0
    assert obs.feed(b"\r") == 1  # blank line (CR alone)
    assert obs.done
    assert obs.at_boundary
    assert obs.feed(b"\n") == 0  # LF of that CRLF
    assert obs.events == 1


def test_two_lone_crs_in_separate_feeds_are_two_line_breaks() -> None:
    obs = SSEObserver()
    obs.feed(b"data: x\r")
    assert obs.feed(b"\r") == 1
    assert obs.at_boundary


def test_cr_lf_split_after_every_byte_of_a_crlf_stream() -> None:
    stream = b"data: a\r\n\r\ndata: [DONE]\r\n\r\n"
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1):
            pieces = [stream[:i], stream[i:j], stream[j:]]
            assert observe(pieces) == (2, 2, True, True), (i, j)


@pytest.mark.parametrize("char", ["é", "€", "😀", "\u2028"])
def test_utf8_character_split_across_feeds(char: str) -> None:
    encoded = char.encode()
    line = b'data: {"content":"' + encoded + b'"}\n\n'
    start = line.index(encoded)
    for k in range(1, len(encoded)):
        cut = start + k
        assert observe([line[:cut], line[cut:]]) == (1, 1, False, True)
    assert_same_every_way(line + DONE)


def test_repr_shows_state() -> None:
    obs = SSEObserver()
    obs.feed(DONE + b"data: x")
    assert repr(obs) == "SSEObserver(events=1, done=True, at_boundary=False)"


def test_done_stays_set_after_later_events() -> None:
    # [DONE] should be last, but an upstream may send more; `done` does not flip back.
    assert observe([DONE, TOKEN]) == (2, 2, True, True)


# --- large events: memory stays bounded ----------------------------------------------------

_MIB = 1 << 20
_PIECE = 64 * 1024


def test_one_mib_event_in_64k_pieces_keeps_buffers_small() -> None:
    stream = b'data: {"content":"' + b"x" * _MIB + b'"}\n\n'
    obs = SSEObserver()
    total = 0
    for start in range(0, len(stream), _PIECE):
        total += obs.feed(stream[start:start + _PIECE])
        assert len(obs._line) <= 32
        assert len(obs._data_in_event) <= 32
    assert total == 1
    assert obs.events == 1
    assert not obs.done
    assert obs.at_boundary


def test_one_mib_event_whole_and_in_odd_pieces() -> None:
    stream = b"data: " + b"y" * _MIB + b"\n\n" + DONE
    assert observe([stream]) == (2, 2, True, True)
    pieces = [stream[i:i + 4093] for i in range(0, len(stream), 4093)]
    assert observe(pieces) == (2, 2, True, True)


def test_one_mib_line_fed_whole_keeps_only_a_prefix() -> None:
    # The module promises "at most a short prefix of the current line": a long data line that
    # arrives in one feed must not be kept whole until the event's blank line comes.
    obs = SSEObserver()
    obs.feed(b"data: " + b"z" * _MIB + b"\n")
    assert len(obs._line) <= 32
    assert len(obs._data_in_event) <= 32
    assert obs.feed(b"\n") == 1


def test_long_line_that_starts_like_done_is_not_done() -> None:
    stream = b"data: [DONE]" + b" " * 100 + b"\n\n"
    assert assert_same_every_way(stream) == (1, 1, False, True)
    stream = b"data: [DONE]" + b"x" * 40 + b"\n\n"
    assert observe([stream[:20], stream[20:30], stream[30:]]) == (1, 1, False, True)


def test_long_comment_is_not_an_event() -> None:
    stream = b":" + b"p" * 200_000 + b"\n\n" + DONE
    assert observe([stream]) == (1, 1, True, True)
    assert observe([stream[i:i + 1000] for i in range(0, len(stream), 1000)]) == (
        1, 1, True, True)


# --- garbage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 64, bytes(range(256)), b"\xff\xfe\xfd", b"\x00\r\x00\n\x00", b"\x80" * 40,
     b"data: \x00\xff\n\n", b"\r" * 10, b"\n" * 10, b":\x00\n"],
)
def test_trailing_garbage_never_raises(garbage: bytes) -> None:
    stream = LLAMA_CPP + garbage
    result = assert_same_every_way(stream)
    assert result[1] >= 6
    assert result[2]  # [DONE] already came
    assert result[1:] == reference(stream)


# --- properties -----------------------------------------------------------------------------

_TOKENS = [b"data: ", b"data:", b"data", b"[DONE]", b"x", b"{}", b"event: ", b"id: 1",
           b":", b": ping", b" ", b"\n", b"\n\n", b"\r", b"\r\n", b"\xc3\xa9", b"\xf0\x9f",
           b"\x98\x80", b"\x00", b"\xff", b"retry: 5"]
sse_streams = st.lists(st.sampled_from(_TOKENS), max_size=40).map(b"".join)
cut_lists = st.lists(st.integers(min_value=0, max_value=2_000), max_size=20)


@_SETTINGS
@given(stream=sse_streams, cuts=cut_lists)
def test_sse_like_streams_match_reference_every_way(stream: bytes, cuts: list[int]) -> None:
    result = assert_same_every_way(stream, cuts, all_pairs=False)
    assert result[1:] == reference(stream)


@_SETTINGS
@given(stream=st.binary(max_size=300), cuts=cut_lists)
def test_arbitrary_bytes_never_raise_and_match_reference(stream: bytes,
                                                          cuts: list[int]) -> None:
    result = assert_same_every_way(stream, cuts, all_pairs=False)
    assert result[1:] == reference(stream)


@_SETTINGS
@given(prefix=sse_streams, garbage=st.binary(max_size=200), cuts=cut_lists)
def test_garbage_after_any_stream_never_raises(prefix: bytes, garbage: bytes,
                                               cuts: list[int]) -> None:
    stream = prefix + garbage
    result = assert_same_every_way(stream, cuts, all_pairs=False)
    assert result[1:] == reference(stream)
