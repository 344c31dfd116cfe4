"""OpenAI SSE streams as Ollama NDJSON (protocol/ollama/stream.py, sse_reader.py,
tool_calls.py, metrics.py): streams llama.cpp recorded (tests/fixtures/ollama/) fed whole,
one byte at a time and split anywhere (CRLF and UTF-8 characters split too) give the same
lines; what gives no line; tool-call pieces put together; the last line's figures; error
events, cut streams, caps, and random bytes that never crash it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.ollama import Answer, Kind, StreamTranslator, Timing
from protocol.ollama.sse_reader import EVENT_CAP, SseReader
from protocol.ollama.stream import CUT_MESSAGE
from protocol.ollama.tool_calls import ARGUMENTS_CAP, CALLS_CAP, ToolCallParts

FIXTURES = Path(__file__).parent / "fixtures" / "ollama"
CHAT_SSE = (FIXTURES / "chat_stream.sse").read_bytes()
TOOLS_SSE = (FIXTURES / "chat_tools_stream.sse").read_bytes()
COMPLETION_SSE = (FIXTURES / "completion_stream.sse").read_bytes()
CHAT = Answer(Kind.CHAT, "smol:latest")
GENERATE = Answer(Kind.GENERATE, "smol:latest")
RAW = Answer(Kind.GENERATE, "smol:latest", text_completion=True)
AT = "2026-12-02T16:18:11.5Z"
TIMING = Timing(total_ns=6_000_000_000, load_ns=1_000_000, prompt_ns=2_000_000_000)
PROPERTY = settings(max_examples=200, derandomize=True, deadline=None)
STREAMS = [(CHAT, CHAT_SSE), (GENERATE, CHAT_SSE), (CHAT, TOOLS_SSE), (RAW, COMPLETION_SSE)]


def run(answer: Answer, pieces: list[bytes], timing: Timing = TIMING) -> list[dict[str, Any]]:
    translator = StreamTranslator(answer)
    out = b"".join(translator.feed(p, AT) for p in pieces) + translator.finish(AT, timing)
    return lines(out)


def lines(out: bytes) -> list[dict[str, Any]]:
    assert out == b"" or out.endswith(b"\n")
    return [json.loads(line) for line in out.split(b"\n")[:-1]]


def event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_recorded_chat_stream() -> None:
    out = run(CHAT, [CHAT_SSE])
    words = ["1", ".", " Red", ":", " This", " is", " the", " most"]
    assert out[:-1] == [{"model": "smol:latest", "created_at": AT, "done": False,
                         "message": {"role": "assistant", "content": w}} for w in words]
    assert out[-1] == {
        "model": "smol:latest", "created_at": AT, "message": {"role": "assistant", "content": ""},
        "done": True, "done_reason": "length", "total_duration": 6_000_000_000,
        "load_duration": 1_000_000, "prompt_eval_count": 34,
        "prompt_eval_duration": 2_676_765_000, "eval_count": 8, "eval_duration": 2_255_265_000}


def test_recorded_stream_as_generate_and_raw() -> None:
    out = run(GENERATE, [CHAT_SSE])
    assert [line["response"] for line in out[:-1]] == ["1", ".", " Red", ":", " This", " is",
                                                        " the", " most"]
    assert all("message" not in line for line in out)
    assert out[-1]["response"] == ""
    assert out[-1]["done"]
    assert out[-1]["done_reason"] == "length"
    raw = run(RAW, [COMPLETION_SSE])
    assert "".join(line["response"] for line in raw) == " a canvas of endless possibilities,"
    assert len(raw) == 7  # the finish chunk's "" text gives no line
    assert raw[-1]["prompt_eval_count"] == 3
    assert raw[-1]["eval_count"] == 6
    assert raw[-1]["prompt_eval_duration"] == 176_571_000


def test_recorded_tool_calls_are_put_together() -> None:
    out = run(CHAT, [TOOLS_SSE])
    assert len(out) == 2
    assert out[0] == {"model": "smol:latest", "created_at": AT, "done": False, "message": {
        "role": "assistant", "content": "", "tool_calls": [
            {"id": "jV4xQm2Lr8NcT0pWzS6aYb1EoKdH3uFg", "function": {
                "index": 0, "name": "get_weather",
                "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"id": "Zr7TnQ0aWc3XyLb5HdPs9KmE2vUf6GjA", "function": {
                "index": 1, "name": "get_time", "arguments": {"zone": "Europe/Paris"}}}]}}
    assert out[1]["done"]
    assert out[1]["done_reason"] == "stop"
    assert (out[1]["prompt_eval_count"], out[1]["eval_count"]) == (215, 31)


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def cr(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r")


@pytest.mark.parametrize(("answer", "data"), STREAMS)
@pytest.mark.parametrize("endings", [lambda d: d, crlf, cr])
def test_byte_by_byte_is_whole(answer: Answer, data: bytes, endings: Any) -> None:
    whole = run(answer, [endings(data)])
    assert whole == run(answer, [data])  # the line endings make no difference
    ended = endings(data)
    assert run(answer, [ended[i:i + 1] for i in range(len(ended))]) == whole


@PROPERTY
@given(which=st.integers(0, len(STREAMS) - 1),
       cuts=st.lists(st.integers(0, 20_000), max_size=40),
       endings=st.sampled_from(["\n", "\r\n", "\r"]))
def test_split_anywhere_is_whole(which: int, cuts: list[int], endings: str) -> None:
    answer, data = STREAMS[which]
    data = data.replace(b"\n", endings.encode())
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    translator = StreamTranslator(answer)
    whole_translator = StreamTranslator(answer)
    split = b"".join(translator.feed(p, AT) for p in pieces)
    assert split == whole_translator.feed(data, AT)
    assert translator.finish(AT, TIMING) == whole_translator.finish(AT, TIMING)


def test_lines_come_as_soon_as_their_event_ends() -> None:
    translator = StreamTranslator(CHAT)
    first = chunk({"content": "Hel"})
    assert translator.feed(first[:-1], AT) == b""  # the blank line has not come yet
    assert lines(translator.feed(first[-1:], AT))[0]["message"]["content"] == "Hel"
    two = chunk({"content": "lo"}) + chunk({"content": "!"})
    assert [x["message"]["content"] for x in lines(translator.feed(two, AT))] == ["lo", "!"]


def test_a_utf8_character_split_across_pieces() -> None:
    data = chunk({"content": "h\u00e9llo \U0001f30d"}) + chunk({}, "stop") + b"data: [DONE]\n\n"
    at = data.index("\U0001f30d".encode()) + 2
    assert run(CHAT, [data[:at], data[at:]]) == run(CHAT, [data])
    assert run(CHAT, [data])[0]["message"]["content"] == "h\u00e9llo \U0001f30d"


def test_what_gives_no_line() -> None:
    quiet = (b": keep-alive\n\n:\n\n" + b"event: ping\nid: 4\nretry: 10\n\n"
             + chunk({"role": "assistant", "content": None}) + chunk({"content": ""})
             + event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
             + event({"object": "something else"})
             + event({"choices": [{"index": 1, "delta": {"content": "second choice"}}]})
             + b"data: [DONE]\n\n")
    translator = StreamTranslator(CHAT)
    assert translator.feed(quiet, AT) == b""
    assert translator.complete
    last = lines(translator.finish(AT, TIMING))
    assert len(last) == 1
    assert last[0]["done"]
    assert last[0]["done_reason"] == "stop"
    assert (last[0]["prompt_eval_count"], last[0]["eval_count"]) == (3, 1)


def test_a_bom_and_comments_before_the_first_event() -> None:
    data = b"\xef\xbb\xbf:\n\n" + chunk({"content": "x"}) + chunk({}, "stop")
    assert run(CHAT, [data[:1], data[1:2], data[2:]])[0]["message"]["content"] == "x"


def test_multi_line_data_is_joined() -> None:
    data = b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"x"}}]}\n\n'
    translator = StreamTranslator(CHAT)
    assert lines(translator.feed(data, AT))[0]["message"]["content"] == "x"


def test_thinking_is_passed_on() -> None:
    data = chunk({"reasoning_content": "hmm"}) + chunk({"content": "ok"}, "stop")
    chat = run(CHAT, [data])
    assert chat[0]["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    generate = run(GENERATE, [data])
    assert generate[0]["thinking"] == "hmm"
    assert generate[0]["response"] == ""


def test_figures_from_the_clock_when_the_server_has_no_timings() -> None:
    data = chunk({"content": "a"}) + chunk({"content": "b"}) + chunk({}, "stop")
    last = run(CHAT, [data], Timing(total_ns=10_000, load_ns=1_000, prompt_ns=3_000))[-1]
    assert {k: last[k] for k in ("total_duration", "load_duration", "prompt_eval_count",
                                 "prompt_eval_duration", "eval_count", "eval_duration")} == {
        "total_duration": 10_000, "load_duration": 1_000, "prompt_eval_count": 0,
        "prompt_eval_duration": 3_000, "eval_count": 2, "eval_duration": 6_000}
    last = run(CHAT, [data], Timing(total_ns=100))[-1]
    assert (last["prompt_eval_duration"], last["eval_duration"]) == (0, 100)


@pytest.mark.parametrize(("reason", "done"), [("stop", "stop"), ("length", "length"),
                                              ("tool_calls", "stop"),
                                              ("function_call", "stop"),
                                              ("content_filter", "content_filter")])
def test_done_reason(reason: str, done: str) -> None:
    assert run(CHAT, [chunk({}, reason)])[-1]["done_reason"] == done


def test_tool_calls_without_a_finish_reason_come_at_the_end() -> None:
    data = (chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": ""}}]})
            + chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]})
            + b"data: [DONE]\n\n")
    out = run(CHAT, [data])
    assert out[0]["message"]["tool_calls"] == [
        {"id": "c1", "function": {"index": 0, "name": "f", "arguments": {"a": 1}}}]
    assert out[1]["done"]


@pytest.mark.parametrize(("pieces", "arguments"), [
    (["", '{"x":', "[1,2]}"], {"x": [1, 2]}),
    ([], {}),
    (["  "], {}),
    (["{broken"], {"raw": "{broken"}),
    (["[1]"], {"raw": "[1]"}),
])
def test_tool_call_arguments(pieces: list[str], arguments: dict[str, Any]) -> None:
    parts = ToolCallParts()
    parts.add([{"index": 0, "id": "c", "function": {"name": "f"}}])
    for piece in pieces:
        parts.add([{"index": 0, "function": {"arguments": piece}}])
    assert parts.take() == [{"id": "c", "function": {"index": 0, "name": "f",
                                                     "arguments": arguments}}]
    assert not parts


def test_tool_call_deltas_that_are_odd() -> None:
    parts = ToolCallParts()
    parts.add("not a list")
    parts.add([1, {"function": {"name": "a", "arguments": {"whole": True}}},
               {"index": True, "function": {"name": "b"}}])
    # no index: the position in the list (1 and 2); a name once given stays; a whole object
    # of arguments counts only when no text came before it
    parts.add([{"index": 2, "function": {"name": "renamed", "arguments": {"late": 1}}},
               {"index": 1, "function": {"arguments": {"ignored": 1}}}])
    assert parts.take() == [
        {"function": {"index": 0, "name": "a", "arguments": {"whole": True}}},
        {"function": {"index": 1, "name": "b", "arguments": {"late": 1}}}]


@pytest.mark.slow
@PROPERTY
@given(arguments=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                 max_size=4),
       cuts=st.lists(st.integers(0, 200), max_size=8))
def test_tool_call_fragments_assemble(arguments: dict[str, Any], cuts: list[int]) -> None:
    text = json.dumps(arguments)
    points = sorted({c % (len(text) + 1) for c in cuts})
    fragments = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    data = chunk({"tool_calls": [{"index": 0, "id": "x", "type": "function",
                                  "function": {"name": "f", "arguments": ""}}]})
    data += b"".join(chunk({"tool_calls": [{"index": 0, "function": {"arguments": f}}]})
                     for f in fragments)
    data += chunk({}, "tool_calls")
    out = run(CHAT, [data])
    assert out[0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments


def test_caps() -> None:
    parts = ToolCallParts()
    parts.add([{"index": i, "function": {"name": "f"}} for i in range(CALLS_CAP)])
    translator = StreamTranslator(CHAT)
    many = chunk({"tool_calls": [{"index": i, "function": {"name": "f"}}
                                 for i in range(CALLS_CAP + 1)]})
    assert "more than" in lines(translator.feed(many, AT))[0]["error"]
    long = chunk({"tool_calls": [{"index": 0, "function": {"arguments": "x" * ARGUMENTS_CAP}}]})
    translator = StreamTranslator(CHAT)
    out = translator.feed(long + long, AT)
    assert "longer than" in lines(out)[0]["error"]
    reader = SseReader()
    assert reader.feed(b"data: " + b"x" * (EVENT_CAP - 100)) == []
    translator = StreamTranslator(CHAT)
    assert translator.feed(b"data: " + b"x" * EVENT_CAP, AT).startswith(b'{"error":')
    assert translator.failed
    assert translator.feed(chunk({"content": "x"}), AT) == b""


def test_nothing_follows_the_last_line() -> None:
    translator = StreamTranslator(CHAT)
    translator.feed(CHAT_SSE, AT)
    assert translator.complete
    assert not translator.closed
    assert lines(translator.finish(AT, TIMING))[-1]["done"]
    assert not translator.failed  # a clean end is no failure
    assert translator.closed
    assert translator.feed(chunk({"content": "late"}), AT) == b""
    assert translator.finish(AT, TIMING) == b""
    assert translator.error("late") == b""
    assert not translator.failed


def test_an_error_event_ends_the_stream() -> None:
    translator = StreamTranslator(CHAT)
    out = translator.feed(chunk({"content": "a"}) + event(
        {"error": {"code": 500, "message": "the slot failed", "type": "server_error"}})
        + chunk({"content": "never"}), AT)
    assert lines(out) == [{"model": "smol:latest", "created_at": AT, "done": False,
                           "message": {"role": "assistant", "content": "a"}},
                          {"error": "the slot failed"}]
    assert translator.failed
    assert translator.closed
    assert translator.feed(chunk({"content": "more"}), AT) == b""
    assert translator.finish(AT, TIMING) == b""
    assert translator.error("late") == b""


@pytest.mark.parametrize(("data", "message"), [
    (b"data: {not json\n\n", "not JSON"),
    (b"data: [1, 2]\n\n", "not a JSON object"),
    (b'data: {"error": "plain"}\n\n', "plain"),
    (b'data: {"error": {"type": "x"}}\n\n', "error (x)"),
])
def test_events_that_end_in_an_error_line(data: bytes, message: str) -> None:
    out = lines(StreamTranslator(GENERATE).feed(data, AT))
    assert len(out) == 1
    assert message in out[0]["error"]


def test_a_cut_stream_ends_with_an_error_line() -> None:
    cut = CHAT_SSE[:CHAT_SSE.index(b'"finish_reason":"length"')]
    translator = StreamTranslator(CHAT)
    assert len(lines(translator.feed(cut, AT))) == 8
    assert not translator.complete
    assert lines(translator.finish(AT, TIMING)) == [{"error": CUT_MESSAGE}]
    translator = StreamTranslator(CHAT)
    translator.feed(chunk({"content": "x"}), AT)
    assert lines(translator.error("upstream timed out")) == [{"error": "upstream timed out"}]
    assert translator.error("again") == b""
    assert translator.finish(AT, TIMING) == b""


def test_an_empty_stream_is_cut() -> None:
    assert run(CHAT, []) == [{"error": CUT_MESSAGE}]


def test_embeddings_are_not_streamed() -> None:
    with pytest.raises(ValueError, match="not streamed"):
        StreamTranslator(Answer(Kind.EMBED, "m"))
    assert "ended=False" in repr(StreamTranslator(CHAT))


@PROPERTY
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_never_crash(data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    for answer in (CHAT, RAW):
        out = run(answer, pieces)
        assert out  # the last line, or the error line
        assert "error" in out[-1] or out[-1]["done"] is True
        assert all("error" not in line for line in out[:-1])


SSE_TEXT = st.lists(st.sampled_from([
    b"data: ", b"data:", b"{", b"}", b'"choices"', b":", b"[", b"]", b'{"index":0,"delta":',
    b'{"content":"x"}', b'"finish_reason":"stop"', b"[DONE]", b"\n", b"\r", b"\r\n", b"\n\n",
    b",", b"event: e", b": ping", b'"usage":{"prompt_tokens":1}', b"\xef\xbb\xbf", b"\xff",
]), max_size=40).map(b"".join)


@PROPERTY
@given(data=SSE_TEXT, cuts=st.lists(st.integers(0, 600), max_size=8))
def test_sse_like_bytes_split_anywhere_give_the_same_lines(data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole = run(CHAT, [data])
    assert run(CHAT, pieces) == whole
    assert run(CHAT, [data[i:i + 1] for i in range(len(data))]) == whole


# The translator reads most events without parsing them (protocol/ollama/text_delta.py: the
# bytes around the text of an event it parsed); whatever the text, and however the JSON
# writes it, each line must carry exactly the text json.loads reads from its event.
_TEXTS = st.lists(st.text(st.characters(codec="utf-8"), max_size=12), min_size=1, max_size=8)


def _written(doc: dict[str, Any], ascii_only: bool, spaced: bool) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only,
                      separators=(", ", ": ") if spaced else (",", ":"))
    return b"data: " + text.encode("utf-8", "surrogatepass") + b"\n\n"


@PROPERTY
@given(_TEXTS, st.booleans(), st.booleans(), st.lists(st.integers(0, 4000), max_size=6),
       st.sampled_from([CHAT, GENERATE]))
def test_every_text_comes_through_as_json_reads_it(texts: list[str], ascii_only: bool,
                                                   spaced: bool, cuts: list[int],
                                                   answer: Answer) -> None:
    def shaped(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _written({"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
                         "created": 1, "id": "c", "model": "m",
                         "object": "chat.completion.chunk"}, ascii_only, spaced)

    stream = (shaped({"role": "assistant", "content": None})
              + b"".join(shaped({"content": t}) for t in texts)
              + shaped({}, "stop") + b"data: [DONE]\n\n")
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    got = run(answer, pieces)
    said = [g["message"]["content"] if answer is CHAT else g["response"] for g in got[:-1]]
    assert said == [t for t in texts if t]
    assert got[-1]["done"] is True
