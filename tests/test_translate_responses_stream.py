"""A streamed Chat Completions answer as the Responses API's events
(protocol/translate/responses_stream.py; SPEC §17.1 "Chat → Responses"): every event read
back through the openai SDK's own SSE decoder and checked against its pydantic models, the
order rules checked on every stream (sequence numbers, one open item at a time, deltas only
to the open item, ``output_item.done`` with the whole item, ``response.completed`` last),
and the translator bugs other gateways had, each as a case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from protocol.translate.chat import Usage, context_overflow
from protocol.translate.responses import Stream, from_chat, overflow_error, tool_names

EVENT = TypeAdapter(ResponseStreamEvent)
PROPERTY = settings(max_examples=200, derandomize=True, deadline=None)
# Codes the SDK's ResponseError model lists; the Responses API also fails a response with
# context_length_exceeded (Codex compacts on it), which the SDK reads without validating.
SDK_CODES = {"server_error", "rate_limit_exceeded", "invalid_prompt"}
TOOLS = tool_names({"tools": [
    {"type": "function", "name": "shell", "parameters": {"type": "object"}},
    {"type": "function", "name": "read", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch"},
    {"type": "namespace", "name": "mcp__fs__", "description": "files",
     "tools": [{"type": "function", "name": "list"}]}]})


def events(data: bytes) -> list[dict[str, Any]]:
    """The events of ``data`` as the SDK reads them, each validated by its models."""
    out = []
    for sse in SSEDecoder().iter_bytes(iter([data])):
        value = sse.json()
        assert sse.event == value["type"]
        if value["type"] == "response.failed" and \
                value["response"]["error"]["code"] not in SDK_CODES:
            EVENT.validate_python({**value, "response": {
                **value["response"], "error": {**value["response"]["error"],
                                               "code": "server_error"}}})
        else:
            EVENT.validate_python(value)
        out.append(value)
    return out


def check(seen: list[dict[str, Any]]) -> dict[str, Any]:
    """The order rules; the last event's response."""
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert [e["type"] for e in seen[:2]] == ["response.created", "response.in_progress"]
    assert seen[-1]["type"] in ("response.completed", "response.failed")
    assert all(e["type"] not in ("response.completed", "response.failed") for e in seen[:-1])
    open_item: dict[str, Any] | None = None
    done: list[dict[str, Any]] = []
    text = ""
    for event in seen[2:-1]:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert open_item is None, "two items open at once"
            assert event["output_index"] == len(done)
            open_item, text = event["item"], ""
            continue
        assert open_item is not None, f"{kind} outside an item"
        if "item_id" in event:
            assert event["item_id"] == open_item["id"]
            assert event["output_index"] == len(done)
        if kind.endswith(".delta"):
            text += event["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert event["text"] == text
        elif kind == "response.function_call_arguments.done":
            assert event["arguments"] == text
        elif kind == "response.custom_tool_call_input.done":
            assert event["input"] == text
        elif kind == "response.content_part.done":
            assert event["part"]["text"] == text
        elif kind == "response.output_item.done":
            assert event["item"]["id"] == open_item["id"]
            assert event["item"]["type"] == open_item["type"]
            done.append(event["item"])
            open_item = None
    assert open_item is None
    response = seen[-1]["response"]
    assert response["output"] == done
    assert response["id"] == seen[0]["response"]["id"]
    return dict(response)


def run(chunks: list[dict[str, Any]], stream: Stream | None = None,
        end: str = "finish") -> tuple[Stream, list[dict[str, Any]], dict[str, Any]]:
    stream = stream or Stream("asked", TOOLS, prompt_chars=400, created_at=1700000000)
    data = stream.start() + b"".join(stream.feed(c) for c in chunks)
    data += stream.finish() if end == "finish" else stream.fail("server_error", "cut")
    seen = events(data)
    return stream, seen, check(seen)


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "x",
            "choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def tool(index: int, ident: str | None = None, name: str | None = None,
         arguments: str | None = None) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index, "function": {}}
    if ident is not None:
        piece["id"], piece["type"] = ident, "function"
    if name is not None:
        piece["function"]["name"] = name
    if arguments is not None:
        piece["function"]["arguments"] = arguments
    return piece


def usage_chunk(prompt: int = 50, completion: int = 9, cached: int = 32) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "x",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion,
                                     "prompt_tokens_details": {"cached_tokens": cached}}}


def kinds(seen: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in seen]


def calls(response: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(i["call_id"], i["name"], i.get("arguments", i.get("input")))
            for i in response["output"] if i["type"] in ("function_call", "custom_tool_call")]


def test_text_stream_events_in_order_with_usage() -> None:
    stream, seen, response = run([delta(role="assistant", content=""), delta(content="Hel"),
                                  delta(content="lo"), delta("stop"), usage_chunk()])
    assert kinds(seen) == ["created", "in_progress", "output_item.added", "content_part.added",
                           "output_text.delta", "output_text.delta", "output_text.done",
                           "content_part.done", "output_item.done", "completed"]
    assert seen[0]["response"]["status"] == "in_progress"
    assert seen[0]["response"]["created_at"] == 1700000000
    assert response["status"] == "completed"
    assert response["model"] == "asked"
    assert response["output"][0]["content"][0]["text"] == "Hello"
    assert response["usage"]["input_tokens"] == 50
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 32
    assert response["usage"]["output_tokens"] == 9
    assert response["usage"]["total_tokens"] == 59
    assert stream.usage == Usage(50, 32, 9)
    assert stream.usage_estimated is False


def test_a_tool_call_whose_id_name_and_whole_arguments_come_in_one_chunk() -> None:
    _, seen, response = run([delta(tool_calls=[tool(0, "c1", "shell", '{"cmd":"ls -la"}')]),
                             delta("tool_calls"), usage_chunk()])
    assert calls(response) == [("c1", "shell", '{"cmd":"ls -la"}')]
    assert kinds(seen)[2:] == ["output_item.added", "function_call_arguments.delta",
                               "function_call_arguments.done", "output_item.done", "completed"]


def test_arguments_before_the_name() -> None:
    _, _, response = run([delta(tool_calls=[tool(0, arguments='{"cmd":')]),
                          delta(tool_calls=[tool(0, arguments='"pwd"}')]),
                          delta(tool_calls=[tool(0, "c1", "shell")]),
                          delta("tool_calls")])
    assert calls(response) == [("c1", "shell", '{"cmd":"pwd"}')]


def test_two_interleaved_tool_calls() -> None:
    _, _, response = run([delta(tool_calls=[tool(0, "c1", "shell", '{"cmd"')]),
                          delta(tool_calls=[tool(1, "c2", "read", '{"path"')]),
                          delta(tool_calls=[tool(0, arguments=':"ls"}'),
                                            tool(1, arguments=':"a.txt"}')]),
                          delta("tool_calls")])
    assert calls(response) == [("c1", "shell", '{"cmd":"ls"}'),
                               ("c2", "read", '{"path":"a.txt"}')]


def test_empty_tool_calls_beside_text_and_empty_deltas_send_nothing() -> None:
    stream = Stream("m", TOOLS)
    assert stream.start()
    assert stream.feed(delta(role="assistant", content="", tool_calls=[])) == b""
    assert stream.feed(delta(content=None, reasoning_content="")) == b""
    assert stream.feed({"choices": []}) == b""
    _, seen, response = run([delta(content="Hi", tool_calls=[]), delta(tool_calls=[]),
                             delta(content=" there", tool_calls=[]), delta("stop")])
    assert [i["type"] for i in response["output"]] == ["message"]  # one item, never closed
    assert response["output"][0]["content"][0]["text"] == "Hi there"
    assert kinds(seen).count("output_text.delta") == 2


def test_reasoning_then_text_then_a_tool() -> None:
    _, seen, response = run([delta(reasoning_content="Let me "), delta(reasoning_content="see."),
                             delta(content="I will list."),
                             delta(tool_calls=[tool(0, "c1", "shell", '{"cmd":"ls"}')]),
                             delta("tool_calls"), usage_chunk()])
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Let me see."}]
    assert kinds(seen)[2:9] == ["output_item.added", "content_part.added",
                                "reasoning_text.delta", "reasoning_text.delta",
                                "reasoning_text.done", "content_part.done", "output_item.done"]
    assert [e["output_index"] for e in seen if e["type"] == "response.output_item.done"] == \
        [0, 1, 2]


def test_vllm_reasoning_field_and_text_after_a_call() -> None:
    _, _, response = run([delta(reasoning="hmm"),
                          delta(tool_calls=[tool(0, "c1", "shell", "{}")]),
                          delta(content="and then"), delta("tool_calls")])
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call"]


def test_namespace_and_custom_tools_are_restored() -> None:
    _, seen, response = run([
        delta(tool_calls=[tool(0, "c1", "mcp__fs__list", "{}")]),
        delta(tool_calls=[tool(1, "c2", "apply_patch", '{"input": "*** Begin')]),
        delta(tool_calls=[tool(1, arguments=' Patch"}')]), delta("tool_calls")])
    first, second = response["output"]
    assert (first["type"], first["name"], first["namespace"]) == ("function_call", "list",
                                                                 "mcp__fs__")
    assert (second["type"], second["name"], second["input"]) == ("custom_tool_call",
                                                                "apply_patch", "*** Begin Patch")
    assert "response.custom_tool_call_input.delta" in [e["type"] for e in seen]


def test_a_call_without_an_id_gets_one_and_one_without_a_name_is_not_sent() -> None:
    _, _, response = run([delta(tool_calls=[tool(0, name="shell", arguments="{}")]),
                          delta(tool_calls=[tool(1, arguments="{}")]), delta("tool_calls")])
    assert calls(response) == [("call_0", "shell", "{}")]


def test_no_usage_chunk_is_estimated() -> None:
    stream, _, response = run([delta(content="x" * 40), delta("stop")])
    assert stream.usage_estimated is True
    assert stream.usage == Usage(100, None, 10)  # prompt 400 chars, answer 40, ÷ 4
    assert response["usage"]["input_tokens"] == 100
    assert response["usage"]["output_tokens"] == 10


def test_the_usage_chunk_after_finish_reason_is_waited_for() -> None:
    stream = Stream("m", TOOLS)
    data = stream.start() + stream.feed(delta(content="ok")) + stream.feed(delta("stop"))
    assert b"response.completed" not in data
    data += stream.feed(usage_chunk(7, 1, 0)) + stream.finish()
    assert check(events(data))["usage"]["input_tokens"] == 7
    assert stream.usage_estimated is False


def test_length_is_completed_with_status_incomplete() -> None:
    _, seen, response = run([delta(content="Once upon"), delta("length"), usage_chunk()])
    assert seen[-1]["type"] == "response.completed"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_cut_stream_fails_and_then_says_nothing() -> None:
    stream = Stream("m", TOOLS)
    data = stream.start() + stream.feed(delta(content="par"))
    data += stream.fail("context_length_exceeded", "Your input exceeds the context window")
    seen = events(data)
    response = seen[-1]["response"]
    assert seen[-1]["type"] == "response.failed"
    assert response["status"] == "failed"
    assert response["error"] == {"code": "context_length_exceeded",
                                 "message": "Your input exceeds the context window"}
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert stream.usage_estimated is True
    for more in (stream.feed(delta(content="x")), stream.finish(), stream.ping(),
                 stream.fail("server_error", "again"), stream.start()):
        assert more == b""


def test_an_error_chunk_fails_the_response() -> None:
    stream = Stream("m")
    data = stream.start() + stream.feed({"error": {"message": "the slot was lost"}})
    response = check(events(data))
    assert response["error"] == {"code": "server_error", "message": "the slot was lost"}
    assert stream.finish() == b""


def test_a_failure_closes_the_open_item_as_incomplete_and_drops_gathered_calls() -> None:
    _, seen, response = run([delta(content="done text"), delta(reasoning_content="more"),
                             delta(reasoning_content=" and")], end="fail")
    assert seen[-1]["type"] == "response.failed"
    assert [(i["type"], i["status"]) for i in response["output"]] == [
        ("message", "completed"), ("reasoning", "incomplete")]
    _, _, response = run([delta(tool_calls=[tool(0, "c1", "shell", '{"cmd":')])], end="fail")
    assert response["output"] == []


def test_ping_is_a_comment_the_sdk_skips() -> None:
    stream = Stream("m")
    data = stream.start() + stream.ping() + stream.feed(delta(content="a")) + stream.ping()
    data += stream.finish()
    assert data.count(b": ping\n\n") == 2
    check(events(data))


def test_start_is_sent_once() -> None:
    stream = Stream("m")
    assert stream.start()
    assert stream.start() == b""


CALL_ARGUMENTS = st.text(alphabet=st.sampled_from('{}":,abcé 0\\n'), min_size=0, max_size=40)


@PROPERTY
@given(first=CALL_ARGUMENTS, second=CALL_ARGUMENTS, data=st.data())
def test_arguments_split_anywhere_give_the_same_arguments(first: str, second: str,
                                                          data: st.DataObject) -> None:
    """Two calls' arguments cut at random places, their pieces interleaved at random, the
    id and name arriving with a random piece of each: the same two calls."""
    pieces: list[list[dict[str, Any]]] = []
    for index, (ident, name, arguments) in enumerate((("c1", "shell", first),
                                                      ("c2", "read", second))):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(arguments)), max_size=6)))
        bits = [arguments[a:b] for a, b in zip([0, *cuts], [*cuts, len(arguments)], strict=True)]
        named = data.draw(st.integers(0, len(bits) - 1))
        pieces.append([tool(index, ident if n == named else None,
                            name if n == named else None, bit) for n, bit in enumerate(bits)])
    order = data.draw(st.permutations([0] * len(pieces[0]) + [1] * len(pieces[1])))
    chunks = []
    taken = [0, 0]
    for which in order:  # each call's pieces stay in their order
        chunks.append(delta(tool_calls=[pieces[which][taken[which]]]))
        taken[which] += 1
    _, _, response = run([*chunks, delta("tool_calls"), usage_chunk()])
    assert calls(response) == [("c1", "shell", first), ("c2", "read", second)]


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["content", "reasoning_content"]),
                          st.text(max_size=5)), max_size=12))
def test_any_mix_of_text_and_reasoning_keeps_the_rules(pieces: list[tuple[str, str]]) -> None:
    _, _, response = run([delta(**{field: text}) for field, text in pieces] + [delta("stop")])
    said = "".join(part["text"] for item in response["output"] for part in item["content"])
    assert said == "".join(text for _, text in pieces)


@pytest.mark.parametrize("created", [0, 1700000000.5])
def test_created_at_is_given(created: float) -> None:
    seen = events(Stream("m", created_at=created).start())
    assert seen[0]["response"]["created_at"] == created


def test_events_are_plain_sse_lines() -> None:
    stream = Stream("m")
    data = stream.start() + stream.feed(delta(content="é\n")) + stream.finish()
    for block in data.split(b"\n\n")[:-1]:
        name, payload = block.split(b"\n")
        assert name.startswith(b"event: ")
        assert payload.startswith(b"data: ")
        assert json.loads(payload[6:])["type"] == name[7:].decode()


def test_a_lone_surrogate_does_not_break_the_stream() -> None:
    """A server's escaped emoji cut between two chunks parses to lone surrogates."""
    _, _, response = run([delta(content=json.loads('"a\\ud83d"')),
                          delta(content=json.loads('"\\ude00b"')), delta("stop")])
    assert response["output"][0]["content"][0]["text"] == "a??b"


FIXTURES = Path(__file__).parent / "fixtures" / "ollama"  # llama.cpp's own wire (its README)


def recorded(name: str) -> list[dict[str, Any]]:
    data = (FIXTURES / name).read_bytes()
    return [json.loads(line[6:]) for line in data.splitlines()
            if line.startswith(b"data: ") and line != b"data: [DONE]"]


def test_llama_cpps_recorded_text_stream() -> None:
    chunks = recorded("chat_stream.sse")
    stream, _, response = run(chunks)
    whole = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                    if c["choices"])
    assert response["output"][0]["content"][0]["text"] == whole
    assert response["status"] == "incomplete"  # max_tokens 8: finish "length"
    assert stream.usage == Usage(34, 0, 8)
    assert stream.usage_estimated is False


def test_llama_cpps_tool_call_stream() -> None:
    chunks = recorded("chat_tools_stream.sse")
    said: dict[int, list[str]] = {}
    for chunk in chunks:
        for piece in chunk["choices"][0]["delta"].get("tool_calls", ()) if chunk["choices"] \
                else ():
            said.setdefault(piece["index"], []).append(piece["function"]["arguments"])
    stream, _, response = run(chunks)
    assert calls(response) == [
        ("jV4xQm2Lr8NcT0pWzS6aYb1EoKdH3uFg", "get_weather", "".join(said[0])),
        ("Zr7TnQ0aWc3XyLb5HdPs9KmE2vUf6GjA", "get_time", "".join(said[1]))]
    assert json.loads("".join(said[0])) == {"city": "Paris", "unit": "celsius"}
    assert stream.usage == Usage(215, 0, 31)


def test_llama_cpps_whole_answer_and_context_overflow() -> None:
    whole = json.loads((FIXTURES / "chat_whole.json").read_bytes())
    out = from_chat(whole, model="smol")
    Response.model_validate(out)
    assert out["output"][0]["content"][0]["text"] == "1. Red: This is the most"
    assert out["usage"]["input_tokens_details"]["cached_tokens"] == 24
    overflow = context_overflow(400, (FIXTURES / "exceed_context.json").read_bytes())
    assert overflow == (3031, 1024)
    err = overflow_error(*overflow)
    assert err.code == "context_length_exceeded"
    assert "3031 tokens > 1024 maximum" in err.message
