"""A streamed chat answer as Anthropic's Messages stream
(protocol/translate/messages_stream.py): the state machine fed plain chunks, every output
checked against the stream's rules (one open block at a time, indices in opening order,
no delta to a block not open, one valid input_json_delta per tool_use), and each reported
translator bug as a case."""

from __future__ import annotations

import json
from typing import Any

from protocol.translate.messages_stream import Stream


def events(data: bytes) -> list[dict[str, Any]]:
    """The events of SSE bytes, each its data with the event name checked against it."""
    out = []
    assert data == b"" or data.endswith(b"\n\n")
    for block in data.decode().split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        doc = json.loads(data_line.removeprefix("data: "))
        assert doc["type"] == name
        out.append(doc)
    return out


def check(all_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Messages stream's rules; gives the blocks as a client would build them."""
    assert all_events[0]["type"] == "message_start"
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    json_deltas: dict[int, int] = {}
    for doc in all_events[1:]:
        kind = doc["type"]
        if kind == "content_block_start":
            assert open_index is None, "a block started while another is open"
            assert doc["index"] == len(blocks)
            open_index = doc["index"]
            blocks.append(dict(doc["content_block"]))
        elif kind == "content_block_delta":
            assert doc["index"] == open_index, "a delta to a block that is not open"
            delta, block = doc["delta"], blocks[doc["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                json_deltas[doc["index"]] = json_deltas.get(doc["index"], 0) + 1
                block["input"] = json.loads(delta["partial_json"])
        elif kind == "content_block_stop":
            assert doc["index"] == open_index
            open_index = None
        elif kind == "message_delta":
            assert open_index is None
        elif kind not in ("ping", "message_stop"):
            raise AssertionError(f"unexpected event {kind}")
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            assert json_deltas.get(index) == 1, "a tool_use without exactly one json delta"
    if all_events[-1]["type"] == "message_stop":
        assert all_events[-2]["type"] == "message_delta"
    return blocks


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        doc["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"choices": [], "usage": doc}


def call(index: int, id: str | None = None, name: str | None = None,
         arguments: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    doc: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        doc["id"] = id
        doc["type"] = "function"
    return doc


def run(chunks: list[dict[str, Any]], prompt_chars: int = 0) -> tuple[Stream, list[dict[str, Any]]]:
    stream = Stream("claude-x", prompt_chars=prompt_chars)
    out = stream.start() + stream.ping()
    for one in chunks:
        out += stream.feed(one)
    out += stream.finish()
    assert stream.finish() == b""
    assert stream.feed(chunk({"content": "late"})) == b""
    return stream, events(out)


def last_delta(all_events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in reversed(all_events) if e["type"] == "message_delta")


def test_text_stream_with_usage_after_finish() -> None:
    stream, out = run([chunk({"role": "assistant", "content": None}),
                       chunk({"content": "Hel"}), chunk({"content": "lo"}),
                       chunk(finish="stop"), usage(120, 2, cached=100)])
    assert out[0]["message"]["model"] == "claude-x"
    assert out[1] == {"type": "ping"}
    assert check(out) == [{"type": "text", "text": "Hello"}]
    delta = last_delta(out)
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 20, "cache_read_input_tokens": 100,
                              "cache_creation_input_tokens": 0, "output_tokens": 2}
    assert out[-1] == {"type": "message_stop"}
    assert not stream.usage_estimated
    assert stream.usage == (120, 100, 2)


def test_no_usage_chunk_is_estimated() -> None:
    stream, out = run([chunk({"content": "x" * 12}), chunk(finish="stop")], prompt_chars=80)
    assert stream.usage_estimated
    assert last_delta(out)["usage"]["input_tokens"] == 20
    assert last_delta(out)["usage"]["output_tokens"] == 3


def test_tool_call_id_name_and_whole_arguments_in_one_chunk() -> None:
    _, out = run([chunk({"tool_calls": [call(0, "c1", "read", '{"path":"a.txt"}')]}),
                  chunk(finish="tool_calls"), usage(10, 5)])
    assert check(out) == [{"type": "tool_use", "id": "c1", "name": "read",
                           "input": {"path": "a.txt"}}]
    assert last_delta(out)["delta"]["stop_reason"] == "tool_use"


def test_arguments_before_the_name() -> None:
    _, out = run([chunk({"tool_calls": [call(0, arguments='{"q":')]}),
                  chunk({"tool_calls": [call(0, arguments=' 1}')]}),
                  chunk({"tool_calls": [call(0, "c1", "find")]}),
                  chunk(finish="tool_calls")])
    assert check(out) == [{"type": "tool_use", "id": "c1", "name": "find", "input": {"q": 1}}]


def test_two_interleaved_tool_calls() -> None:
    _, out = run([chunk({"tool_calls": [call(0, "a", "f", '{"x"')]}),
                  chunk({"tool_calls": [call(1, "b", "g", '{"y"')]}),
                  chunk({"tool_calls": [call(0, arguments=": 1}")]}),
                  chunk({"tool_calls": [call(1, arguments=": 2}")]}),
                  chunk(finish="tool_calls"), usage(3, 4)])
    assert check(out) == [{"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}},
                          {"type": "tool_use", "id": "b", "name": "g", "input": {"y": 2}}]


def test_empty_tool_calls_beside_text() -> None:
    _, out = run([chunk({"content": "Hi", "tool_calls": []}),
                  chunk({"content": "", "tool_calls": []}), chunk({}),
                  chunk({"content": " there"}), chunk(finish="stop")])
    assert check(out) == [{"type": "text", "text": "Hi there"}]
    assert last_delta(out)["delta"]["stop_reason"] == "end_turn"


def test_reasoning_then_text_then_a_tool() -> None:
    _, out = run([chunk({"reasoning_content": "Let me "}),
                  chunk({"reasoning_content": "think."}),
                  chunk({"content": "I'll read it."}),
                  chunk({"tool_calls": [call(0, "c9", "read", "")]}),
                  chunk({"tool_calls": [call(0, arguments='{"p":"x"}')]}),
                  chunk(finish="tool_calls"), usage(1, 1)])
    assert check(out) == [{"type": "thinking", "thinking": "Let me think.", "signature": ""},
                          {"type": "text", "text": "I'll read it."},
                          {"type": "tool_use", "id": "c9", "name": "read", "input": {"p": "x"}}]
    starts = [e["index"] for e in out if e["type"] == "content_block_start"]
    assert starts == [0, 1, 2]


def test_text_after_a_tool_opened_comes_after_it() -> None:
    _, out = run([chunk({"tool_calls": [call(0, "c", "f", "{}")]}),
                  chunk({"content": "and more"}), chunk(finish="tool_calls")])
    assert check(out) == [{"type": "tool_use", "id": "c", "name": "f", "input": {}},
                          {"type": "text", "text": "and more"}]


def test_finish_reasons() -> None:
    for finish, want in (("length", "max_tokens"), ("content_filter", "refusal")):
        _, out = run([chunk({"content": "x"}), chunk(finish=finish)])
        assert last_delta(out)["delta"]["stop_reason"] == want
    stream = Stream("m")
    data = stream.start() + stream.feed({"choices": [{"index": 0, "delta": {},
                                                       "finish_reason": "stop",
                                                       "stop_reason": "###"}]})
    out = events(data + stream.finish())
    assert last_delta(out)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}


def test_ping_only_before_content() -> None:
    stream = Stream("m")
    assert events(stream.start())[0]["type"] == "message_start"
    assert stream.start() == b""
    assert events(stream.ping()) == [{"type": "ping"}]
    stream.feed(chunk({"content": "a"}))
    assert stream.ping() == b""


def test_cut_stream_is_an_error_event_and_nothing_after() -> None:
    stream = Stream("m")
    stream.start()
    stream.feed(chunk({"content": "par"}))
    out = events(stream.fail("upstream_error", "the stream was cut"))
    assert out == [{"type": "error", "error": {
        "type": "api_error", "message": "the stream was cut (upstream_error)"}}]
    assert stream.finish() == b""
    assert stream.fail("x", "y") == b""
    assert stream.closed


def test_an_upstream_error_event_fails_the_stream() -> None:
    stream = Stream("m")
    stream.start()
    out = events(stream.feed({"error": {"message": "slot died"}}))
    assert out[0]["type"] == "error"
    assert "slot died" in out[0]["error"]["message"]
    assert stream.finish() == b""


def test_invalid_arguments_are_kept_not_lost() -> None:
    _, out = run([chunk({"tool_calls": [call(0, "c", "f", "not json")]}),
                  chunk(finish="tool_calls")])
    assert check(out)[0]["input"] == {"arguments": "not json"}


def test_plain_texts_give_the_same_events_as_chunks() -> None:
    texts = [b"Hel", b"lo, ", b"", b"w\xc3\xb6rld"]
    by_chunk, by_plain = Stream("m"), Stream("m")
    slow = b"".join(by_chunk.feed(chunk({"reasoning_content": "hm"})) for _ in range(2))
    fast = by_plain.plain([b"hm", b"hm"], True)
    assert fast == slow
    slow = b"".join(by_chunk.feed(chunk({"content": t.decode()})) for t in texts)
    fast = by_plain.plain(texts, False)
    assert events(fast) == events(slow)
    tool = chunk({"tool_calls": [call(0, "c", "f", "{}")]})
    assert by_plain.feed(tool) == by_chunk.feed(tool)
    # after a tool block opened, text is held for the end either way
    assert by_plain.plain([b"late"], False) == by_chunk.feed(chunk({"content": "late"})) == b""
    assert events(by_plain.finish())[-3:] == events(by_chunk.finish())[-3:]
