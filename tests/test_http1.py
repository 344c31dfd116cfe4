"""protocol/http1.py: response heads and chunked bodies, fed whole, byte by byte, at random
splits, and with garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import http1
from protocol.http1 import (
    ChunkedScanner,
    ProtocolError,
    build_request_head,
    parse_response_head,
)


def test_request_head() -> None:
    head = build_request_head(b"POST", b"/v1/chat/completions",
                              [(b"host", b"127.0.0.1:8080"), (b"content-length", b"2")])
    assert head == (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n"
                    b"content-length: 2\r\n\r\n")


LLAMA_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
                  b"Content-Type: text/event-stream\r\nX-Accel-Buffering: no\r\n"
                  b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100")


def test_llama_cpp_stream_head() -> None:
    head = parse_response_head(LLAMA_SSE_HEAD)
    assert head.status_code == 200
    assert head.reason == b"OK"
    assert head.chunked
    assert head.content_length is None
    assert head.keep_alive
    assert (b"access-control-allow-origin", b"") in head.headers
    assert (b"content-type", b"text/event-stream") in head.headers
    assert head.idle_timeout == 5


@pytest.mark.parametrize(("value", "seconds"), [
    (b"timeout=5, max=100", 5), (b"max=100,timeout=60", 60), (b"Timeout = 7", 7),
    (b'timeout="3"', 3), (b"max=100", None), (b"timeout=", None), (b"timeout=-1", None),
    (b"timeout=2.5", None), (b"timeout=99999999999", None), (b"", None),
])
def test_keep_alive_timeout(value: bytes, seconds: float | None) -> None:
    assert http1.keep_alive_timeout(value) == seconds
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nKeep-Alive: " + value +
                               b"\r\nContent-Length: 0")
    assert head.idle_timeout == seconds
    assert parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0").idle_timeout is None


@pytest.mark.parametrize(("head", "length", "chunked", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12", 12, False, True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Length: 12", 12, False, True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3", 3, False, False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 3", 3, False, False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3", 3, False, True),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream", None, False, False),  # until close
    (b"HTTP/1.1 204 No Content", 0, False, True),
    (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 50", 0, False, True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", None, True, True),
    (b"HTTP/1.1 200 OK\nContent-Length: 1\n", 1, False, True),  # bare LF line endings
    (b"HTTP/1.1 500", 0 if False else None, False, False),  # no reason phrase, no length
])
def test_framing(head: bytes, length: int | None, chunked: bool, keep_alive: bool) -> None:
    parsed = parse_response_head(head)
    assert parsed.content_length == length
    assert parsed.chunked is chunked
    assert parsed.keep_alive is keep_alive


@pytest.mark.parametrize("head", [
    b"HTTP/2 200 OK", b"HTTP/1.1 20 OK", b"ICY 200 OK", b"",
    b"HTTP/1.1 200 OK\r\nbad header",
    b"HTTP/1.1 200 OK\r\nspace name: x",
    b"HTTP/1.1 200 OK\r\nX: a\r\n folded",
    b"HTTP/1.1 200 OK\r\nX: a\x00b",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9",  # RFC 9112 §6.3
    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: gzip, chunked",
])
def test_invalid_heads(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_response_head(head)


@given(st.binary(max_size=300))
@settings(max_examples=300, derandomize=True)
def test_garbage_heads_raise_protocol_error_only(data: bytes) -> None:
    try:
        parse_response_head(data)
    except ProtocolError:
        pass


CHUNKS = [b"data: {\"a\":1}\n\n", b"data: caf\xc3\xa9\r\n\r\n", b":\n\n", b"x" * 70000]


def chunked(parts: list[bytes], *, ext: bool = False, trailers: bytes = b"") -> tuple[bytes, bytes]:
    """The chunked body and the part of it a scanner forwards (all data chunks)."""
    framed = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";n=v" if ext else b"", p) for p in parts)
    return framed + b"0\r\n" + trailers + b"\r\n", framed


def scan(pieces: list[bytes]) -> tuple[bytes, ChunkedScanner]:
    scanner = ChunkedScanner(collect=True)
    out = b"".join(scanner.feed(piece) for piece in pieces)
    return out, scanner


@pytest.mark.parametrize("ext", [False, True])
@pytest.mark.parametrize("trailers", [b"", b"X-Checksum: 1\r\nX-Other: 2\r\n", b"X\n",
                                      b"A: b\n"])
def test_chunked_whole_and_byte_by_byte(ext: bool, trailers: bytes) -> None:
    body, framed = chunked(CHUNKS, ext=ext, trailers=trailers)
    for pieces in ([body], [body[i:i + 1] for i in range(len(body))]):
        out, scanner = scan(pieces)
        assert out == framed
        assert scanner.done
        assert b"".join(scanner.parts) == b"".join(CHUNKS)
        assert scanner.leftover == b""
        assert scanner.tail == CHUNKS[-1][-4:]


@given(cuts=st.lists(st.integers(min_value=0, max_value=71000), max_size=30))
@settings(max_examples=200, derandomize=True)
def test_chunked_any_split(cuts: list[int]) -> None:
    body, framed = chunked([*CHUNKS[:3], b"y" * 1000])
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    out, scanner = scan(pieces)
    assert out == framed
    assert scanner.done


def test_bytes_after_the_body_are_leftover() -> None:
    body, _ = chunked([b"ab"])
    _out, scanner = scan([body + b"HTTP/1.1 200 OK\r\n"])
    assert scanner.done
    assert scanner.leftover == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize("body", [
    b"zz\r\nab\r\n0\r\n\r\n",  # not hex
    b"2\r\nabc\r\n0\r\n\r\n",  # data longer than its size
    b"-1\r\n",
    b"1" * 5000,  # an endless size line
])
def test_broken_chunked_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        scan([body])


@given(st.binary(max_size=500))
@settings(max_examples=300, derandomize=True)
def test_chunked_garbage_raises_protocol_error_only(data: bytes) -> None:
    try:
        scan([data, data])
    except ProtocolError:
        pass


def _outcome(pieces: list[bytes]) -> tuple[object, ...]:
    try:
        out, scanner = scan(pieces)
    except ProtocolError:
        return ("error",)
    return (out, scanner.done, b"".join(scanner.parts), scanner.tail, scanner.leftover)


_chunk_piece = st.one_of(
    st.binary(max_size=12).map(lambda p: b"%x\r\n%b\r\n" % (len(p), p) if p else b""),
    st.sampled_from([b"3;x=y\r\nabc\r\n", b"2\nab\n", b"0\r\n\r\n", b"0\r\nT: v\r\n\r\n",
                     b"2\r\nabc", b" 2\r\nab\r\n", b"\r\n", b"z"]),
)


@pytest.mark.slow
@given(st.lists(_chunk_piece, max_size=12), st.lists(st.integers(0, 300), max_size=6))
@settings(max_examples=400, derandomize=True)
def test_whole_reads_and_byte_reads_agree(parts: list[bytes], cuts: list[int]) -> None:
    """The whole-chunk fast path and the step-by-step path give the same result."""
    body = b"".join(parts)
    whole = _outcome([body])
    assert _outcome([body[i:i + 1] for i in range(len(body))]) == whole
    points = sorted({c % (len(body) + 1) for c in cuts})
    assert _outcome([body[a:b] for a, b in zip([0, *points], [*points, len(body)],
                                               strict=True)]) == whole


def test_broken_chunk_keeps_the_good_bytes_before_it() -> None:
    scanner = ChunkedScanner()
    with pytest.raises(ProtocolError) as caught:
        scanner.feed(b"5\r\nhello\r\nzz\r\nworld\r\n")
    assert caught.value.forward == b"5\r\nhello\r\n"
    with pytest.raises(ProtocolError) as caught:
        ChunkedScanner().feed(b"3\r\nabc\r\n2\r\nabcd\r\n")  # longer than announced
    assert caught.value.forward == b"3\r\nabc\r\n"


_LINE_BYTES = st.sampled_from([b"a", b"Z", b"-", b"0", b":", b" ", b"\t", b"\r", b"\n", b"\r\n",
                               b"\x00", b"\x7f", b"\x80", b"\xff", b"(", b'"', b"Content-Length",
                               b"Connection", b"close", b"chunked", b","])


@pytest.mark.slow
@given(st.lists(st.lists(_LINE_BYTES, max_size=8).map(b"".join), max_size=6))
@settings(max_examples=400, derandomize=True)
def test_the_fast_header_path_agrees_with_the_line_checks(lines: list[bytes]) -> None:
    """Header blocks the block-at-a-time path takes give exactly the pairs the checks of
    each line give; the ones it leaves to them are those with a line that is not plain."""
    fields = b"\r\n".join(lines)
    plain = http1._plain_fields(fields)
    again = http1._plain_fields(fields)  # now from the cache of lines seen
    try:
        checked: list[tuple[bytes, bytes]] | None = http1._checked_fields(fields)
    except ProtocolError:
        checked = None
    if plain is not None:
        assert plain == again == checked
    else:
        assert again is None


@pytest.mark.parametrize(("head", "framing"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5", (5, False, True)),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 1",
     (1, False, False)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
     (None, True, True)),
])
def test_repeated_framing_headers(head: bytes, framing: tuple[int | None, bool, bool]) -> None:
    """A name given twice: Content-Length must agree, the others are one list."""
    parsed = parse_response_head(head)
    assert (parsed.content_length, parsed.chunked, parsed.keep_alive) == framing


def test_conflicting_content_lengths_are_refused() -> None:
    with pytest.raises(ProtocolError, match="conflicting"):
        parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6")
