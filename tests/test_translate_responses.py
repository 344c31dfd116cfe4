"""The Responses API as Chat Completions, the request and the whole answer
(protocol/translate/responses.py, responses_answer.py; SPEC §17.1): every mapping of
"Responses → Chat" with plain values, the tool table that restores namespace and custom
tools, the whole answer checked against the openai SDK's own models, and the errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import InputTokenCountResponse, Response
from pydantic import TypeAdapter

from protocol.errors import Family, SluiceError
from protocol.translate import responses
from protocol.translate.chat import text_of_prompt
from protocol.translate.responses import (
    ToolName,
    count_answer,
    from_chat,
    overflow_error,
    to_chat,
    tool_names,
)

# The SDK's own type of a chat request's messages, to check what we send the server.
MESSAGE: TypeAdapter[ChatCompletionMessageParam] = TypeAdapter(ChatCompletionMessageParam)


def chat(body: dict[str, Any], context: int | None = None) -> dict[str, Any]:
    out = to_chat({"model": "m", **body}, context=context)
    json.dumps(out)  # plain JSON values only
    for message in out["messages"]:
        MESSAGE.validate_python(message)
    return out


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def say(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, name: str, arguments: str = "{}", **more: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, **more}


def output(call_id: str, text: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def refused(body: dict[str, Any]) -> SluiceError:
    with pytest.raises(SluiceError) as caught:
        to_chat({"model": "m", **body}, context=None)
    assert caught.value.status == 400
    return caught.value


# --- messages -------------------------------------------------------------------------------


def test_input_string_and_instructions() -> None:
    out = chat({"instructions": "Be brief.", "input": "Hello"})
    assert out["messages"] == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hello"}]
    assert out["model"] == "m"


def test_developer_and_system_items_before_the_first_user_turn_join_the_system_message() -> None:
    out = chat({"instructions": "I", "input": [say("developer", "D"), say("system", "S"),
                                               user("hi")]})
    assert out["messages"] == [{"role": "system", "content": "I\n\nD\n\nS"},
                               {"role": "user", "content": "hi"}]


def test_a_later_developer_item_goes_before_the_next_user_turn_not_between_calls_and_outputs(
) -> None:
    out = chat({"input": [user("one"), call("c1", "ls"), say("developer", "mind the sandbox"),
                          output("c1", "a b"), user("two")]})
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "user"]
    assert out["messages"][1]["tool_calls"][0]["id"] == "c1"
    assert out["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "a b"}
    assert out["messages"][3] == {"role": "user", "content": "mind the sandbox\n\ntwo"}


def test_a_developer_item_after_the_last_user_turn_is_a_last_user_turn() -> None:
    out = chat({"input": [user("one"), call("c1", "ls"), output("c1", "x"),
                          say("developer", "now answer")]})
    assert out["messages"][-1] == {"role": "user", "content": "now answer"}
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "user"]


def test_consecutive_user_items_are_one_user_turn() -> None:
    out = chat({"input": [user("<environment_context/>"), user("fix the bug")]})
    assert out["messages"] == [{"role": "user", "content": "<environment_context/>\n\nfix the bug"}]


def test_images_become_image_url_parts() -> None:
    url = "data:image/png;base64,iVBORw0KGgo="
    out = chat({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": url, "detail": "low"}]}]})
    assert out["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}]


def test_an_image_by_file_id_and_file_parts_are_refused() -> None:
    err = refused({"input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]})
    assert err.code == "unsupported_content"
    assert err.param == "input[0].content[0]"
    err = refused({"input": [{"role": "user", "content": [
        {"type": "input_file", "file_data": "JVBERi0=", "filename": "a.pdf"}]}]})
    assert err.code == "unsupported_content"


def test_assistant_text_and_the_function_calls_after_it_are_one_assistant_message() -> None:
    out = chat({"input": [
        user("list and read"),
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        call("c1", "ls", '{"path": "."}'), call("c2", "cat", '{"file": "a"}'),
        output("c1", "a"), output("c2", [{"type": "input_text", "text": "A"},
                                         {"type": "input_text", "text": "B"}]),
        user("thanks")]})
    assistant = out["messages"][1]
    assert assistant["content"] == "Let me look."
    assert [c["function"] for c in assistant["tool_calls"]] == [
        {"name": "ls", "arguments": '{"path": "."}'}, {"name": "cat", "arguments": '{"file": "a"}'}]
    assert all(c["type"] == "function" for c in assistant["tool_calls"])
    assert out["messages"][2:4] == [{"role": "tool", "tool_call_id": "c1", "content": "a"},
                                    {"role": "tool", "tool_call_id": "c2", "content": "A\n\nB"}]


@pytest.mark.parametrize(("given", "text"), [
    ("plain", "plain"), ([{"type": "input_text", "text": "a"}, {"type": "input_image",
                                                               "image_url": "data:,"}], "a"),
    ({"content": "ran", "success": True}, "ran"), ({"exit": 0}, '{"exit": 0}'), (None, "")])
def test_tool_outputs_are_text(given: object, text: str) -> None:
    out = chat({"input": [user("go"), call("c1", "ls"), output("c1", given)]})
    assert out["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": text}


def test_function_calls_without_text_have_empty_content() -> None:
    out = chat({"input": [user("go"), call("c1", "ls"), output("c1", "x")]})
    assert out["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}


def test_reasoning_items_with_text_go_to_the_next_assistant() -> None:
    out = chat({"input": [
        user("q"),
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "think hard"}]},
        call("c1", "ls"), output("c1", "x"),
        {"type": "reasoning", "id": "rs_2",
         "summary": [{"type": "summary_text", "text": "a summary"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "done"}]}]})
    assert out["messages"][1]["reasoning_content"] == "think hard"
    assert out["messages"][3] == {"role": "assistant", "content": "done",
                                  "reasoning_content": "a summary"}


def test_a_reasoning_item_without_content_is_dropped_never_refused() -> None:
    out = chat({"input": [user("q"),
                          {"type": "reasoning", "id": "rs_1", "summary": [],
                           "encrypted_content": "gAAAA..."},
                          {"type": "reasoning", "id": "rs_2"},
                          {"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": "a"}]}]})
    assert out["messages"][1] == {"role": "assistant", "content": "a"}


def test_items_of_the_hosted_api_are_dropped() -> None:
    dropped = [{"type": "web_search_call", "id": "ws_1", "status": "completed"},
               {"type": "local_shell_call", "id": "lsh_1", "call_id": "x", "status": "completed",
                "action": {"type": "exec", "command": ["ls"], "env": {}}},
               {"type": "item_reference", "id": "msg_0"},
               {"type": "compaction", "encrypted_content": "..."},
               {"type": "mcp_call", "id": "mcp_1", "name": "n", "arguments": "{}",
                "server_label": "s"},
               {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "s", "tools": []}]
    out = chat({"input": [user("q"), *dropped, user("r")]})
    assert out["messages"] == [{"role": "user", "content": "q\n\nr"}]


def test_custom_tool_calls_in_history_are_function_calls_of_one_input() -> None:
    out = chat({"input": [
        user("patch it"),
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}]})
    function = out["messages"][1]["tool_calls"][0]["function"]
    assert function["name"] == "apply_patch"
    assert json.loads(function["arguments"]) == {"input": "*** Begin Patch\n*** End Patch"}
    assert out["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Done!"}


@pytest.mark.parametrize(("item", "param"), [
    ("text", "input[0]"),
    ({"role": "robot", "content": "x"}, "input[0].role"),
    ({"role": "user", "content": 5}, "input[0].content"),
    ({"type": "function_call", "call_id": "c", "name": "f"}, "input[0].arguments"),
    ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
])
def test_malformed_items_are_400_naming_the_field(item: object, param: str) -> None:
    err = refused({"input": [item]})
    assert err.param == param
    assert json.loads(err.body(Family.RESPONSES))["error"]["param"] == param


# --- tools ----------------------------------------------------------------------------------

NAMESPACE = {"type": "namespace", "name": "mcp__github__", "description": "GitHub",
             "tools": [{"type": "function", "name": "create_issue", "description": "New issue",
                        "parameters": {"type": "object",
                                       "properties": {"title": {"type": "string"}}}},
                       {"type": "custom", "name": "search", "description": "Query"}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
SHELL = {"type": "function", "name": "shell", "description": "Run a command", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"]}}
HOSTED = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs"]},
          {"type": "image_generation"}, {"type": "code_interpreter", "container": "auto"},
          {"type": "computer_use_preview", "display_width": 1, "display_height": 1,
           "environment": "linux"},
          {"type": "mcp", "server_label": "s", "server_url": "https://example.invalid"}]


def test_tools_function_namespace_and_custom_hosted_dropped() -> None:
    out = chat({"input": "hi", "tools": [SHELL, NAMESPACE, PATCH, *HOSTED]})
    functions = [t["function"] for t in out["tools"]]
    assert all(t["type"] == "function" for t in out["tools"])
    assert [f["name"] for f in functions] == ["shell", "mcp__github__create_issue",
                                              "mcp__github__search", "apply_patch"]
    assert functions[0] == {"name": "shell", "description": "Run a command", "strict": False,
                            "parameters": SHELL["parameters"]}
    assert functions[1]["parameters"] == NAMESPACE["tools"][0]["parameters"]  # type: ignore
    custom = {"type": "object", "properties": {"input": {"type": "string"}},
              "required": ["input"]}
    assert functions[2]["parameters"] == custom
    assert functions[3]["parameters"] == custom
    assert functions[3]["description"].startswith("Edit files")
    assert "start: /.+/" in functions[3]["description"]  # the grammar the input follows


def test_no_doubled_separator_in_namespace_names() -> None:
    out = chat({"input": "hi", "tools": [
        {"type": "namespace", "name": "fs", "description": "",
         "tools": [{"type": "function", "name": "read"}]},
        {"type": "namespace", "name": "mcp__fs__", "description": "",
         "tools": [{"type": "function", "name": "_write"}]}]})
    assert [t["function"]["name"] for t in out["tools"]] == ["fs__read", "mcp__fs__write"]


def test_only_hosted_tools_leave_no_tools_and_no_tool_choice() -> None:
    out = chat({"input": "hi", "tools": HOSTED, "tool_choice": "required"})
    assert "tools" not in out
    assert "tool_choice" not in out


def test_tool_names_restore_namespace_and_custom_tools() -> None:
    names = tool_names({"tools": [SHELL, NAMESPACE, PATCH, *HOSTED]})
    assert names.restore("mcp__github__create_issue") == ToolName("create_issue",
                                                                  "mcp__github__", False)
    assert names.restore("mcp__github__search") == ToolName("search", "mcp__github__", True)
    assert names.restore("apply_patch") == ToolName("apply_patch", None, True)
    assert names.restore("shell") == ToolName("shell")
    assert names.restore("not_asked_for") == ToolName("not_asked_for")
    assert tool_names({}) == responses.NO_TOOLS


def test_namespace_tools_in_history_and_tool_choice() -> None:
    out = chat({"tools": [NAMESPACE],
                "tool_choice": {"type": "function", "name": "create_issue",
                                "namespace": "mcp__github__"},
                "input": [user("file it"),
                          call("c1", "create_issue", '{"title": "t"}', namespace="mcp__github__"),
                          output("c1", "#1"),
                          {"type": "custom_tool_call", "call_id": "c2", "name": "search",
                           "namespace": "mcp__github__", "input": "is:open"},
                          {"type": "custom_tool_call_output", "call_id": "c2", "output": "[]"}]})
    assert out["tool_choice"] == {"type": "function",
                                  "function": {"name": "mcp__github__create_issue"}}
    names = [m["tool_calls"][0]["function"]["name"] for m in out["messages"] if "tool_calls" in m]
    assert names == ["mcp__github__create_issue", "mcp__github__search"]


@pytest.mark.parametrize(("choice", "expected"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "name": "shell"}, {"type": "function", "function": {"name": "shell"}}),
    ({"type": "custom", "name": "apply_patch"},
     {"type": "function", "function": {"name": "apply_patch"}}),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                            "name": "shell"}]}, "required"),
    ({"type": "allowed_tools", "mode": "auto", "tools": []}, "auto"),
    ({"type": "web_search"}, None),  # the hosted tool was dropped
    ({"type": "function", "name": "nowhere"}, None),  # not a tool of the request
])
def test_tool_choice(choice: object, expected: object) -> None:
    out = chat({"input": "hi", "tools": [SHELL, PATCH], "tool_choice": choice})
    assert out.get("tool_choice") == expected


@pytest.mark.parametrize("tools", [
    {"type": "function"}, "shell", {"type": "namespace", "name": "n"},
    {"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}])
def test_malformed_tools_are_400(tools: object) -> None:
    assert refused({"input": "hi", "tools": [tools]}).param.startswith("tools[0]")  # type: ignore


# --- the other fields -----------------------------------------------------------------------


def test_fields_kept_renamed_and_dropped() -> None:
    out = chat({"input": "hi", "temperature": 0.2, "top_p": 0.9, "parallel_tool_calls": False,
                "reasoning": {"effort": "high", "summary": "auto"}, "max_output_tokens": 500,
                "store": True, "metadata": {"a": "b"}, "include": ["reasoning.encrypted_content"],
                "truncation": "auto", "service_tier": "auto", "prompt_cache_key": "k",
                "text": {"verbosity": "low"}, "stream": False})
    assert {k: v for k, v in out.items() if k != "messages"} == {
        "model": "m", "temperature": 0.2, "top_p": 0.9, "parallel_tool_calls": False,
        "reasoning_effort": "high", "max_tokens": 500}


def test_stream_asks_for_the_usage_chunk() -> None:
    out = chat({"input": "hi", "stream": True})
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("form", "expected"), [
    ({"type": "json_schema", "name": "answer", "strict": True,
      "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
     {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
         "type": "object", "properties": {"a": {"type": "string"}}}}}),
    ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "text"}, None),
])
def test_text_format_is_response_format(form: dict[str, Any], expected: object) -> None:
    out = chat({"input": "hi", "text": {"format": form}})
    assert out.get("response_format") == expected


def test_max_output_tokens_64000_against_an_8k_context_is_clamped() -> None:
    out = chat({"instructions": "x" * 3000, "input": "hi", "max_output_tokens": 64000},
               context=8192)
    prompt = text_of_prompt(out)
    assert 0 < out["max_tokens"] <= 8192 - prompt // 4  # fits beside the prompt
    assert out["max_tokens"] == 8192 - responses.prompt_estimate(out)
    assert chat({"input": "hi", "max_output_tokens": 64000})["max_tokens"] == 64000  # unknown
    assert chat({"input": "hi", "max_output_tokens": 100}, context=8192)["max_tokens"] == 100
    assert chat({"input": "x" * 40000, "max_output_tokens": 100}, context=8192)["max_tokens"] == 1
    assert "max_tokens" not in chat({"input": "hi"}, context=8192)


@pytest.mark.parametrize(("field", "code"), [
    ("previous_response_id", "previous_response_not_supported"),
    ("conversation", "conversation_not_supported")])
def test_stored_state_is_refused_in_the_responses_shape(field: str, code: str) -> None:
    err = refused({"input": "hi", field: "resp_123"})
    assert err.code == code
    assert err.param == field
    assert json.loads(err.body(Family.RESPONSES)) == {"error": {
        "message": err.message, "type": "invalid_request_error", "code": code, "param": field}}
    assert "stores none" in err.message
    chat({"input": "hi", "previous_response_id": None})  # null is no reference


# --- the whole answer -----------------------------------------------------------------------

SDK_RESPONSE = Response.model_validate


def answer(message: dict[str, Any], finish: str = "stop",
           usage: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000,
                           "model": "served",
                           "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                        "finish_reason": finish}]}
    if usage is not None:
        doc["usage"] = usage
    return doc


USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
         "prompt_tokens_details": {"cached_tokens": 64},
         "completion_tokens_details": {"reasoning_tokens": 7}}


def test_whole_text_answer() -> None:
    out = from_chat(answer({"content": "Hi there"}, usage=USAGE), model="asked")
    parsed = SDK_RESPONSE(out)
    assert parsed.output_text == "Hi there"
    assert out["id"].startswith("resp_")
    assert out["object"] == "response"
    assert out["model"] == "asked"
    assert out["status"] == "completed"
    assert out["store"] is False
    assert out["created_at"] == 1700000000
    assert out["usage"] == {"input_tokens": 100,
                            "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
                            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 7},
                            "total_tokens": 120}
    assert [item["type"] for item in out["output"]] == ["message"]
    assert from_chat(answer({"content": "x"}), model="m", created_at=5.5)["created_at"] == 5.5


def test_whole_answer_reasoning_text_and_calls_restored() -> None:
    names = tool_names({"tools": [SHELL, NAMESPACE, PATCH]})
    out = from_chat(answer({"content": "Working.", "reasoning_content": "plan",
                            "tool_calls": [
                                {"id": "c1", "type": "function",
                                 "function": {"name": "shell", "arguments": '{"cmd":"ls"}'}},
                                {"id": "c2", "type": "function",
                                 "function": {"name": "mcp__github__create_issue",
                                              "arguments": '{"title":"t"}'}},
                                {"id": "c3", "type": "function",
                                 "function": {"name": "apply_patch",
                                              "arguments": '{"input":"*** Begin Patch"}'}}]},
                           finish="tool_calls", usage=USAGE), model="m", tools=names)
    SDK_RESPONSE(out)
    items = out["output"]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call",
                                          "function_call", "custom_tool_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "plan"}]
    assert items[2]["name"] == "shell"
    assert items[2]["arguments"] == '{"cmd":"ls"}'
    assert "namespace" not in items[2]
    assert (items[3]["name"], items[3]["namespace"], items[3]["call_id"]) == (
        "create_issue", "mcp__github__", "c2")
    assert (items[4]["name"], items[4]["input"], items[4]["call_id"]) == (
        "apply_patch", "*** Begin Patch", "c3")
    assert out["status"] == "completed"


def test_whole_answer_cut_at_the_token_limit_is_incomplete() -> None:
    out = from_chat(answer({"content": "Once upon"}, finish="length"), model="m")
    SDK_RESPONSE(out)
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    filtered = from_chat(answer({"content": ""}, finish="content_filter"), model="m")
    assert filtered["incomplete_details"] == {"reason": "content_filter"}


def test_whole_answer_without_usage_is_estimated() -> None:
    out = from_chat(answer({"content": "x" * 40}), model="m", prompt_chars=400)
    assert out["usage"]["input_tokens"] == 100
    assert out["usage"]["output_tokens"] == 10


def test_whole_answer_without_choices_is_a_bad_upstream() -> None:
    with pytest.raises(SluiceError) as caught:
        from_chat({"error": {"message": "boom"}}, model="m")
    assert caught.value.status == 502
    assert "boom" in caught.value.message


def test_overflow_error_is_context_length_exceeded() -> None:
    err = overflow_error(9000, 8192)
    assert err.status == 400
    assert err.code == "context_length_exceeded"
    body = json.loads(err.body(Family.RESPONSES))["error"]
    assert body["code"] == "context_length_exceeded"
    assert body["type"] == "invalid_request_error"
    assert "9000 tokens > 8192 maximum" in body["message"]
    assert overflow_error(None, None).code == "context_length_exceeded"


def test_count_answer_is_the_sdks_input_tokens() -> None:
    assert InputTokenCountResponse.model_validate(count_answer(42)).input_tokens == 42


def test_the_module_has_the_translators_face() -> None:
    assert responses.NAME == "responses"
    assert responses.FAMILY is Family.RESPONSES
    for name in ("to_chat", "from_chat", "Stream", "overflow_error", "count_answer",
                 "tool_names"):
        assert callable(getattr(responses, name))


# --- any input: a chat body or a 400, never a crash -----------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
TEXT = st.text(max_size=8)


def mostly(shape: Any) -> Any:
    """``shape``, one time in eight any JSON value instead."""
    return st.integers(0, 7).flatmap(lambda n: JSON if n == 0 else shape)


def shaped(kind: str, fields: dict[str, Any], **optional: Any) -> Any:
    """Items of ``kind`` with these fields, now and then one of them any JSON value."""
    return st.fixed_dictionaries({"type": st.just(kind), **fields}, optional=optional)


PART = mostly(shaped("input_text", {"text": TEXT}) | shaped("output_text", {"text": TEXT})
              | shaped("input_image", {}, image_url=mostly(st.just("data:,"))))
CONTENT = mostly(TEXT | st.lists(PART, max_size=3))
ITEM = mostly(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system",
                                                    "developer"]) | JSON,
                           "content": CONTENT}, optional={"type": st.just("message")}),
    shaped("function_call", {"call_id": TEXT, "name": TEXT, "arguments": TEXT | JSON},
           namespace=TEXT | JSON),
    shaped("custom_tool_call", {"call_id": TEXT, "name": TEXT, "input": TEXT}),
    shaped("function_call_output", {"call_id": TEXT, "output": CONTENT}),
    shaped("custom_tool_call_output", {"call_id": TEXT, "output": CONTENT}),
    shaped("reasoning", {"summary": st.lists(shaped("summary_text", {"text": TEXT}),
                                             max_size=2) | JSON},
           content=st.lists(shaped("reasoning_text", {"text": TEXT}), max_size=2) | JSON)))
NAME = st.text(min_size=1, max_size=8)
FUNCTION = shaped("function", {"name": NAME}, parameters=JSON, description=JSON)
CUSTOM = shaped("custom", {"name": NAME}, format=JSON)
TOOL = mostly(FUNCTION | CUSTOM | shaped("web_search", {}) | shaped(
    "namespace", {"name": NAME, "tools": st.lists(mostly(FUNCTION | CUSTOM), max_size=3)}))
FIELDS = st.fixed_dictionaries({"input": mostly(st.lists(ITEM, min_size=1, max_size=6))}, optional={
    "tools": mostly(st.lists(TOOL, min_size=1, max_size=4)), "instructions": mostly(TEXT),
    "tool_choice": JSON | shaped("function", {"name": TEXT}), "text": JSON, "reasoning": JSON,
    "max_output_tokens": mostly(st.integers(-1, 10**6)), "stream": JSON})


@settings(max_examples=300, derandomize=True, deadline=None)
@given(FIELDS, st.none() | st.integers(0, 100000))
def test_any_body_is_a_chat_body_or_a_400(body: dict[str, Any], context: int | None) -> None:
    refusal: SluiceError | None = None
    try:
        out = to_chat(body, context=context)
    except SluiceError as err:
        refusal = err
    if refusal is not None:
        assert refusal.status == 400
        assert refusal.param
        return
    json.dumps(out)
    tool_names(body)  # what to_chat accepted, the tool table reads too
    for message in out["messages"]:
        MESSAGE.validate_python(message)
    assert all(m["role"] != "system" for m in out["messages"][1:])  # one system message, first
