"""Anthropic Messages requests and whole answers to and from Chat Completions
(protocol/translate/messages.py, chat.py): SPEC §17.1's mapping with plain values, and the
reported translator bugs that concern the request (a mixed user turn, inline system
messages around a tool_use, max_tokens against a small context)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.errors import Family, SluiceError
from protocol.translate import COUNT_PATHS, TRANSLATORS, messages, translator_for
from protocol.translate.chat import context_overflow, estimate_tokens, read_chunk


def chat(body: dict[str, Any], context: int | None = None) -> dict[str, Any]:
    return messages.to_chat({"model": "m", "max_tokens": 100, **body}, context=context)


def test_the_table_names_messages() -> None:
    assert TRANSLATORS["/v1/messages"] is messages
    assert COUNT_PATHS["/v1/messages/count_tokens"] is messages
    assert translator_for("/v1/chat/completions") is None
    assert messages.NAME == "messages"
    assert messages.FAMILY is Family.ANTHROPIC


def test_system_blocks_joined_billing_block_dropped() -> None:
    out = chat({"system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                           {"type": "text", "text": "You are Claude Code."},
                           {"type": "text", "text": "Be brief.", "cache_control": {}}],
                "messages": [{"role": "user", "content": "hi"}]})
    assert out["messages"] == [{"role": "system", "content": "You are Claude Code.\n\nBe brief."},
                               {"role": "user", "content": "hi"}]
    assert "cache_control" not in json.dumps(out)


def test_inline_system_before_and_after_a_tool_use() -> None:
    body = {"system": "S", "messages": [
        {"role": "system", "content": "early"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}]},
        {"role": "system", "content": "reminder: be careful"},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]},
        {"role": "assistant", "content": "One file."},
        {"role": "system", "content": [{"type": "text", "text": "late"}]},
        {"role": "user", "content": "thanks"}]}
    out = chat(body)["messages"]
    assert out == [
        {"role": "system", "content": "S\n\nearly"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "ls", "arguments": '{"path": "."}'}}]},
        # the tool message right after its tool_use; the reminder after it, never between
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
        {"role": "user", "content": "reminder: be careful"},
        {"role": "assistant", "content": "One file."},
        {"role": "user", "content": "late\n\nthanks"}]


def test_mixed_user_turn_tool_messages_first() -> None:
    body = {"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}},
            {"type": "tool_use", "id": "b", "name": "g", "input": {"x": 1}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "first"},
            {"type": "tool_result", "tool_use_id": "a", "content": [
                {"type": "text", "text": "A1"}, {"type": "text", "text": "A2"}]},
            {"type": "tool_result", "tool_use_id": "b", "content": "boom", "is_error": True},
            {"type": "text", "text": "second"}]}]}
    out = chat(body)["messages"]
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]}
    assert out[2:] == [{"role": "tool", "tool_call_id": "a", "content": "A1\nA2"},
                       {"role": "tool", "tool_call_id": "b", "content": "Error: boom"},
                       {"role": "user", "content": "first\n\nsecond"}]


def test_images_become_data_urls() -> None:
    out = chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                     "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]})
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]


def test_thinking_kept_only_in_the_tool_loop() -> None:
    thought = {"type": "thinking", "thinking": "hmm", "signature": "s"}
    body = {"messages": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": [thought, {"type": "text", "text": "a1"}]},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": [thought, {"type": "tool_use", "id": "t",
                                                    "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": "r"}]}]}
    out = chat(body)["messages"]
    assert "reasoning_content" not in out[1]  # a later user turn has text
    assert out[3]["reasoning_content"] == "hmm"


def test_tools_and_tool_choice() -> None:
    body = {"messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "read", "description": "Read a file",
                       "input_schema": {"type": "object", "properties": {"p": {}}}},
                      {"type": "web_search_20250305", "name": "web_search"},
                      {"type": "bash_20250124", "name": "bash"}],
            "tool_choice": {"type": "tool", "name": "read", "disable_parallel_tool_use": True}}
    out = chat(body)
    assert out["tools"] == [{"type": "function", "function": {
        "name": "read", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"p": {}}}}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "read"}}
    assert out["parallel_tool_calls"] is False
    for given, want in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert chat({**body, "tool_choice": {"type": given}})["tool_choice"] == want


def test_options_stream_effort_format_and_drops() -> None:
    out = chat({"messages": [{"role": "user", "content": "x"}], "stream": True,
                "stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9, "top_k": 5,
                "thinking": {"type": "enabled", "budget_tokens": 10000},
                "metadata": {"user_id": "u"}, "service_tier": "auto",
                "context_management": {}, "container": "c",
                "output_config": {"format": {"type": "json_schema",
                                             "schema": {"type": "object"}}}})
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert out["stop"] == ["END"]
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.2, 0.9, 5)
    assert out["reasoning_effort"] == "high"
    assert out["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": {"type": "object"}, "strict": True}}
    for gone in ("thinking", "metadata", "service_tier", "context_management", "container",
                 "output_config"):
        assert gone not in out
    effort = chat({"messages": [{"role": "user", "content": "x"}],
                   "output_config": {"effort": "low"}})
    assert effort["reasoning_effort"] == "low"


def test_max_tokens_clamped_to_the_context() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 64000}
    out = messages.to_chat({"model": "m", **body}, context=8192)
    assert out["max_tokens"] == 8192 - 100  # the context minus the prompt's estimate
    assert messages.to_chat({"model": "m", **body}, context=None)["max_tokens"] == 64000
    small = messages.to_chat({"model": "m", **body, "max_tokens": 50}, context=8192)
    assert small["max_tokens"] == 50


@pytest.mark.parametrize("body", [
    {"mcp_servers": [{"type": "url", "url": "https://x"}]},
    {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": "JVBER"}}]}]},
])
def test_refused_inputs_are_400(body: dict[str, Any]) -> None:
    with pytest.raises(SluiceError) as caught:
        chat({"messages": [{"role": "user", "content": "x"}], **body})
    assert caught.value.status == 400
    payload = caught.value.payload(Family.ANTHROPIC)
    assert payload["type"] == "error"  # type: ignore[index]
    assert payload["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_bad_messages_are_400() -> None:
    for body in ({"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]}):
        with pytest.raises(SluiceError) as caught:
            messages.to_chat(body, context=None)
        assert caught.value.status == 400


def test_whole_answer_with_reasoning_text_and_tools() -> None:
    answer = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": "tool_calls",
              "message": {"role": "assistant", "content": "Let me look.",
                          "reasoning_content": "think",
                          "tool_calls": [{"id": "c1", "type": "function", "function": {
                              "name": "ls", "arguments": '{"p":"."}'}}]}}],
              "usage": {"prompt_tokens": 50, "completion_tokens": 7,
                        "prompt_tokens_details": {"cached_tokens": 30}}}
    out = messages.from_chat(answer, model="claude-x")
    assert out["id"].startswith("msg_")
    assert out["model"] == "claude-x"
    assert out["type"] == "message"
    assert out["role"] == "assistant"
    assert out["content"] == [{"type": "thinking", "thinking": "think", "signature": ""},
                              {"type": "text", "text": "Let me look."},
                              {"type": "tool_use", "id": "c1", "name": "ls",
                               "input": {"p": "."}}]
    assert out["stop_reason"] == "tool_use"
    assert out["stop_sequence"] is None
    assert out["usage"] == {"input_tokens": 20, "cache_read_input_tokens": 30,
                            "cache_creation_input_tokens": 0, "output_tokens": 7}


@pytest.mark.parametrize(("finish", "extra", "want"), [
    ("stop", {}, ("end_turn", None)), ("length", {}, ("max_tokens", None)),
    ("content_filter", {}, ("refusal", None)),
    ("stop", {"stop_reason": "END"}, ("stop_sequence", "END"))])
def test_whole_answer_stop_reasons(finish: str, extra: dict[str, Any],
                                   want: tuple[str, str | None]) -> None:
    answer = {"choices": [{"index": 0, "finish_reason": finish, **extra,
                           "message": {"role": "assistant", "content": "hi"}}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    out = messages.from_chat(answer, model="m")
    assert (out["stop_reason"], out["stop_sequence"]) == want


def test_whole_answer_without_usage_is_estimated() -> None:
    answer = {"choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "x" * 10}}]}
    out = messages.from_chat(answer, model="m", prompt_chars=40)
    assert out["usage"]["input_tokens"] == 10
    assert out["usage"]["output_tokens"] == 3


def test_overflow_detection_and_answer() -> None:
    llama = json.dumps({"error": {"code": 400, "type": "exceed_context_size_error",
                                  "message": "the request exceeds the available context size",
                                  "n_prompt_tokens": 9000, "n_ctx": 8192}}).encode()
    assert context_overflow(400, llama) == (9000, 8192)
    vllm = json.dumps({"error": {"message": "This model's maximum context length is 4096 "
                                 "tokens. However, you requested 5000 tokens (4000 in the "
                                 "messages, 1000 in the completion).", "type": "BadRequest"}})
    assert context_overflow(400, vllm.encode()) == (5000, 4096)
    assert context_overflow(400, b'{"error":{"message":"bad temperature"}}') is None
    assert context_overflow(500, llama) is None
    err = messages.overflow_error(9000, 8192)
    assert err.status == 400
    assert err.payload(Family.ANTHROPIC) == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 9000 tokens > 8192 maximum"}}
    assert messages.count_answer(12) == {"input_tokens": 12}


def test_reading_chunks() -> None:
    piece = read_chunk({"choices": [{"index": 0, "delta": {
        "content": "a", "reasoning_content": "r",
        "tool_calls": [{"index": 1, "id": "c", "function": {"name": "f", "arguments": "{"}}]},
        "finish_reason": None}]})
    assert (piece.text, piece.reasoning, piece.finish) == ("a", "r", None)
    assert piece.tools[0] == (1, "c", "f", "{")
    usage = read_chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    assert usage.usage == (5, None, 2)
    assert read_chunk({"error": {"message": "oops"}}).error == "oops"
    assert estimate_tokens(0) == 0
    assert estimate_tokens(1) == 1
    assert estimate_tokens(8) == 2
