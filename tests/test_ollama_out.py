"""The writer of an Ollama answer (proxy/ollama_out.py) driven directly, as the relay drives
it, over a Downstream that records the bytes instead of sending them: its table of moves
(every legal one, every illegal one raises), a whole answer, an error answer whole and
chunked, a stream to its last line (written at the model server's [DONE]), an error line
mid-stream (the rest dropped), a stream cut short, a cut the relay reports, the next node's
answer after a failover while an error answer was gathered, and the calls no state takes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from protocol.errors import SluiceError, upstream_timeout
from protocol.ollama import JSON_TYPE, NDJSON_TYPE, Answer, Kind, Timing
from protocol.response import Response
from protocol.response import State as ClientState
from proxy.downstream import Downstream
from proxy.ollama_out import MOVES, OllamaOut, State
from proxy.timestamps import use_wall_clock

CHAT = Answer(Kind.CHAT, "smol:latest")
TIMING = Timing(total_ns=6_000_000_000, load_ns=1_000_000, prompt_ns=2_000_000_000)
NOW = 1796228183.5
AT = "2026-12-02T16:16:23.5Z"
SSE = [(b"x-sluice-served-by", b"local:llama"), (b"content-type", b"text/event-stream")]
JSON = [(b"x-sluice-served-by", b"local:llama"), (b"content-type", b"application/json")]
LAST_CHUNK = b"0\r\n\r\n"


def event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def text(content: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": content}}]})


FINISH = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
ERROR = event({"error": {"code": 500, "message": "the model crashed"}})
WHOLE = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hello"}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()
TOO_LONG = json.dumps({"error": {"code": 400, "message": "the prompt is too long",
                                 "type": "exceed_context_size_error"}}).encode()


class Recorded(Downstream):
    """A client's Downstream whose bytes are kept instead of sent (HTTP/1.1, keep-alive)."""

    def __init__(self) -> None:
        super().__init__(-1, lambda: False)
        self.begin(Response())
        self.sent = bytearray()

    async def _send(self, data: bytes, on_block: Any = None, stall: Any = None) -> None:
        self.sent += data

    def head(self) -> bytes:
        return bytes(self.sent).partition(b"\r\n\r\n")[0]

    def body(self) -> bytes:
        return bytes(self.sent).partition(b"\r\n\r\n")[2]

    def lines(self) -> list[dict[str, Any]]:
        """The NDJSON lines of a chunked body (its chunk framing taken off)."""
        data, payload = self.body(), b""
        while data:
            size, _, data = data.partition(b"\r\n")
            n = int(size, 16)
            payload += data[:n]
            data = data[n + 2:]
        return [json.loads(line) for line in payload.split(b"\n") if line]


@pytest.fixture(autouse=True)
def clock() -> Iterator[None]:
    previous = use_wall_clock(lambda: NOW)
    yield
    use_wall_clock(previous)


def writer(stream: bool = True) -> tuple[OllamaOut, Recorded]:
    real = Recorded()
    return OllamaOut(real, CHAT, stream, lambda: TIMING), real


# The table of moves


def test_the_table_names_every_state_and_ends_in_done_or_broken() -> None:
    assert set(MOVES) == set(State)
    assert MOVES[State.DONE] == MOVES[State.BROKEN] == frozenset()
    reached, todo = {State.IDLE}, [State.IDLE]
    while todo:
        for new in MOVES[todo.pop()] - reached:
            reached.add(new)
            todo.append(new)
    assert reached == set(State)


@pytest.mark.parametrize("old", list(State))
@pytest.mark.parametrize("new", list(State))
def test_every_legal_move_is_made_and_every_illegal_one_raises(old: State, new: State) -> None:
    out, _ = writer()
    out.state = old
    if new in MOVES[old]:
        out._move(new)
        assert out.state is new
    else:
        with pytest.raises(AssertionError, match=f"{old.value} -> {new.value}"):
            out._move(new)
        assert out.state is old


# Whole answers


async def test_a_whole_answer() -> None:
    out, real = writer(stream=False)
    await out.send_whole(200, list(JSON), WHOLE)
    assert out.state is State.DONE
    assert real.response.state is ClientState.DONE
    assert real.head().startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-type: " + JSON_TYPE + b"\r\n" in real.head()
    assert b"x-sluice-served-by: local:llama\r\n" in real.head()
    doc = json.loads(real.body())
    assert doc["message"] == {"role": "assistant", "content": "hello"}
    assert (doc["created_at"], doc["done"], doc["prompt_eval_count"]) == (AT, True, 5)


async def test_an_error_answer_in_ollamas_shape() -> None:
    out, real = writer()
    await out.send_whole(400, list(JSON), TOO_LONG)
    assert out.state is State.DONE
    assert real.head().startswith(b"HTTP/1.1 400 ")
    assert json.loads(real.body()) == {"error": "the prompt is too long"}
    assert real.error_code is not None


async def test_an_error_answer_that_came_chunked_is_gathered_then_sent_whole() -> None:
    out, real = writer()
    await out.send_head(400, list(JSON), b"Bad Request", TOO_LONG[:10], end=False)
    assert out.state is State.GATHERING_ERROR
    await out.send_body(TOO_LONG[10:30])
    assert out.state is State.GATHERING_ERROR
    assert real.sent == b""  # nothing until its end
    await out.end(TOO_LONG[30:])
    assert out.state is State.DONE
    assert real.response.state is ClientState.DONE
    assert real.head().startswith(b"HTTP/1.1 400 ")
    assert b"content-type: " + JSON_TYPE + b"\r\n" in real.head()
    assert json.loads(real.body()) == {"error": "the prompt is too long"}


async def test_a_chunked_error_answer_in_one_read() -> None:
    out, real = writer()
    await out.send_head(400, list(JSON), b"Bad Request", TOO_LONG, end=True)
    assert out.state is State.DONE
    assert json.loads(real.body()) == {"error": "the prompt is too long"}


async def test_after_a_failover_from_a_cut_error_answer_the_next_nodes_answer_goes_out() -> None:
    out, real = writer()
    await out.send_head(400, list(JSON), b"Bad Request", TOO_LONG[:10], end=False)
    await out.send_head(200, list(SSE), b"OK", text("hi") + FINISH, end=True)
    assert out.state is State.DONE
    assert real.head().startswith(b"HTTP/1.1 200 OK\r\n")
    assert [line["done"] for line in real.lines()] == [False, True]


# Streams


async def test_a_stream_to_its_last_line() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    assert out.state is State.STREAMING
    assert b"content-type: " + NDJSON_TYPE + b"\r\n" in real.head()
    await out.send_body(text("two"))
    await out.end(FINISH)
    assert out.state is State.DONE
    assert real.response.state is ClientState.DONE
    assert real.sent.endswith(LAST_CHUNK)
    got = real.lines()
    assert [line["message"]["content"] for line in got] == ["one ", "two", ""]
    assert [line["created_at"] for line in got] == [AT] * 3
    assert got[-1]["done_reason"] == "stop"
    assert got[-1]["total_duration"] == TIMING.total_ns


async def test_a_stream_in_one_read() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", text("a") + text("b") + FINISH, end=True)
    assert out.state is State.DONE
    assert [line["done"] for line in real.lines()] == [False, False, True]
    assert real.sent.endswith(LAST_CHUNK)


async def test_the_last_line_goes_out_with_done_before_the_body_ends() -> None:
    """Issue 39: at the model server's ``[DONE]`` the last line is written (an Ollama app
    may leave once it has it); the answer's end follows the upstream body's, nothing more
    in it. The head's read holding ``[DONE]`` too gives it at once."""
    for first, rest in ((text("one "), FINISH + b"data: [DONE]\n\n"),
                        (text("one ") + FINISH + b"data: [DONE]\n\n", b"")):
        out, real = writer()
        await out.send_head(200, list(SSE), b"OK", first, end=False)
        await out.send_body(rest)
        assert [(line["done"], line["message"]["content"]) for line in real.lines()] == [
            (False, "one "), (True, "")]
        assert real.response.state is ClientState.STREAMING  # the upstream body goes on
        await out.end(b"")
        assert out.state is State.DONE
        assert len(real.lines()) == 2
        assert real.sent.endswith(LAST_CHUNK)


async def test_an_error_line_mid_stream_ends_it_and_the_rest_is_dropped() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    await out.send_body(ERROR + text("lost"))
    assert out.state is State.BROKEN
    assert real.response.state is ClientState.BROKEN
    assert not real.response.keep_alive
    sent = bytes(real.sent)
    await out.send_body(text("more"))
    await out.end(FINISH)
    await out.error_event(upstream_timeout("stalled"), at_boundary=True)
    assert real.sent == sent
    assert not real.sent.endswith(LAST_CHUNK)
    assert real.lines() == [real.lines()[0], {"error": "the model crashed"}]


async def test_an_error_line_in_the_first_read() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", ERROR, end=True)
    assert out.state is State.BROKEN
    assert real.lines() == [{"error": "the model crashed"}]
    assert real.error_code == "upstream_error"
    assert not real.sent.endswith(LAST_CHUNK)


async def test_a_stream_that_ends_before_it_said_it_was_finished() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    await out.end(text("two"))
    assert out.state is State.BROKEN
    assert real.response.state is ClientState.BROKEN
    assert real.error_code == "upstream_error"
    assert "error" in real.lines()[-1]
    assert not real.sent.endswith(LAST_CHUNK)


async def test_a_cut_the_relay_reports_is_one_error_line() -> None:
    out, real = writer()
    await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    await out.send_body(b'data: {"choi')  # half an event: no line yet
    await out.error_event(upstream_timeout("the upstream stalled"), at_boundary=False)
    assert out.state is State.BROKEN
    assert real.response.state is ClientState.BROKEN
    assert real.error_code == "upstream_timeout"
    assert real.lines() == [real.lines()[0], {"error": "the upstream stalled"}]
    assert not real.sent.endswith(LAST_CHUNK)


async def test_a_stream_the_client_asked_whole_is_refused_before_anything_is_sent() -> None:
    out, real = writer(stream=False)
    with pytest.raises(SluiceError, match="streamed an answer that was asked whole"):
        await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    assert out.state is State.IDLE
    assert real.sent == b""


# Calls no state takes (the relay never makes them)


async def test_body_bytes_before_any_head_raise() -> None:
    out, _ = writer()
    with pytest.raises(AssertionError, match="body bytes while idle"):
        await out.send_body(text("x"))
    with pytest.raises(AssertionError, match="the end while idle"):
        await out.end()


async def test_a_second_head_after_the_stream_began_raises() -> None:
    out, _ = writer()
    await out.send_head(200, list(SSE), b"OK", text("one "), end=False)
    with pytest.raises(AssertionError, match="another answer while streaming"):
        await out.send_whole(200, list(JSON), WHOLE)


async def test_a_cut_before_the_head_raises_and_after_the_end_too() -> None:
    out, _ = writer()
    with pytest.raises(AssertionError, match="a cut while idle"):
        await out.error_event(upstream_timeout("x"), at_boundary=True)
    await out.send_head(200, list(SSE), b"OK", text("a") + FINISH, end=True)
    with pytest.raises(AssertionError, match="a cut while done"):
        await out.error_event(upstream_timeout("x"), at_boundary=True)
    with pytest.raises(AssertionError, match="body bytes while done"):
        await out.send_body(text("b"))
