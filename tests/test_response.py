"""protocol.response: the client side of one answer, its state table tested directly."""

from __future__ import annotations

import pytest

from protocol.errors import upstream_timeout
from protocol.response import CLOSE, MOVES, Response, State

JSON = [(b"content-type", b"application/json")]


def test_the_table_of_moves() -> None:
    assert set(MOVES) == set(State)
    assert MOVES[State.BROKEN] == frozenset()  # final
    for state, targets in MOVES.items():
        assert state not in targets  # no move stays in place
    assert State.IDLE not in set().union(*MOVES.values())  # nothing goes back


def test_whole_answer_keeps_the_connection() -> None:
    r = Response()
    data = r.whole(200, list(JSON), b"{}")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 2\r\n" in data
    assert data.endswith(b"\r\n\r\n{}")
    assert CLOSE[0] + b": " + CLOSE[1] not in data
    assert r.state is State.DONE
    assert r.reusable


def test_streamed_http11_is_chunked_and_ends_with_the_last_chunk() -> None:
    r = Response()
    head = r.head(200, [(b"content-type", b"text/event-stream")])
    assert b"transfer-encoding: chunked\r\n" in head
    assert r.state is State.STREAMING
    assert r.started
    assert not r.reusable
    assert r.frame(b"data: x\n\n") == b"9\r\ndata: x\n\n\r\n"
    assert r.frame(b"") == b""  # an empty chunk would end the body
    assert r.end() == b"0\r\n\r\n"
    assert r.reusable


def test_streamed_http10_ends_with_the_connection() -> None:
    r = Response(http11=False, keep_alive=True)
    head = r.head(200, [])
    assert b"transfer-encoding" not in head
    assert b"connection: close\r\n" in head
    assert r.frame(b"abc") == b"abc"
    assert r.end() == b""
    assert not r.reusable


@pytest.mark.parametrize(("make", "closing"), [
    pytest.param(lambda: Response(keep_alive=False), False, id="client_asked_close"),
    pytest.param(Response, True, id="gateway_draining"),
])
def test_close_is_said_in_the_head(make: type[Response], closing: bool) -> None:
    r = make()
    data = r.whole(200, [], b"x", closing=closing)
    assert b"connection: close\r\n" in data
    assert not r.reusable


def test_close_after_a_read_error() -> None:
    r = Response()
    r.close_after()
    assert b"connection: close\r\n" in r.whole(408, list(JSON), b"{}")
    assert r.state is State.DONE
    assert not r.reusable


def test_error_event_after_the_head_breaks_the_answer() -> None:
    r = Response()
    r.head(200, [])
    event = r.error_event(upstream_timeout("stalled"), at_boundary=False)
    size, payload = event.split(b"\r\n", 1)
    assert int(size, 16) == len(payload) - 2  # one chunk
    assert payload.startswith(b'\n\ndata: {"error":{')  # on a fresh event boundary
    assert r.state is State.BROKEN
    assert not r.reusable
    with pytest.raises(AssertionError, match="illegal response move"):
        r.end()  # no last chunk: the client can tell the answer is incomplete


def test_no_body_status() -> None:
    r = Response()
    data = r.head(204, [])
    assert b"content-length" not in data
    assert b"transfer-encoding" not in data
    assert r.state is State.DONE
    assert r.end() == b""  # nothing to end


def test_cors_is_the_gateways_alone() -> None:
    upstream = [(b"access-control-allow-origin", b""), (b"x-kept", b"1")]
    plain = Response().whole(200, list(upstream), b"")
    assert b"access-control-" not in plain
    assert b"x-kept: 1" in plain
    allowed = Response(cors_origin=b"http://localhost:3000").whole(200, list(upstream), b"")
    assert b"access-control-allow-origin: http://localhost:3000\r\n" in allowed
    assert b"vary: Origin\r\n" in allowed


def test_continue_once_and_only_before_the_answer() -> None:
    r = Response()
    assert r.interim_continue() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert r.interim_continue() == b""
    assert not r.started  # interim: the final answer can still be an error
    r2 = Response()
    r2.whole(200, [], b"")
    assert r2.interim_continue() == b""


def test_broken_from_any_state() -> None:
    for prepare in (lambda r: None, lambda r: r.head(200, []), lambda r: r.whole(200, [], b"")):
        r = Response()
        prepare(r)
        r.broken()
        assert r.state is State.BROKEN
        r.broken()  # idempotent
        assert not r.reusable


def test_answer_to_head_has_its_length_but_no_body() -> None:
    r = Response()
    r.request_allows(http11=True, keep_alive=True, head=True)
    data = r.whole(405, [(b"allow", b"GET")], b'{"error":1}')
    assert data.endswith(b"content-length: 11\r\n\r\n")
    assert r.reusable  # the next request is read right after the head
