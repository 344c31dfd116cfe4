"""protocol/affinity.py: the canonical prompt text of every dialect, the prefix chain and the
session key (SPEC §15)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.affinity import MAX_SESSION_KEY, PS, RS, US, chain, prompt_text, session_key

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def seg(role: str, content: str) -> str:
    return RS + role + US + content


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- prompt_text, one dialect at a time ---------------------------------------------------


def test_chat_completions_messages_in_order() -> None:
    doc = {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ], "temperature": 0.5}
    assert prompt_text("/v1/chat/completions", doc) == (
        seg("system", "be brief") + seg("user", "hello") + seg("assistant", "hi"))


def test_chat_parts_text_and_json() -> None:
    doc = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, IMAGE, {"type": "text", "text": "twice"}]}]}
    assert prompt_text("/v1/chat/completions", doc) == seg(
        "user", "look" + PS + compact(IMAGE) + PS + "twice")


def test_a_single_text_part_reads_as_the_plain_string() -> None:
    plain = {"messages": [{"role": "user", "content": "hello"}]}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert prompt_text("/v1/chat/completions", plain) == prompt_text(
        "/v1/chat/completions", parts)


def test_chat_tools_and_tool_calls() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    doc = {"tools": tools, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]}
    assert prompt_text("/v1/chat/completions", doc) == (
        seg("tools", compact(tools)) + seg("user", "go")
        + seg("assistant", "") + PS + compact(calls) + seg("tool", "42"))


def test_anthropic_system_string_and_blocks() -> None:
    msgs = [{"role": "user", "content": "q"}]
    as_string = {"system": "rules", "messages": msgs}
    as_blocks = {"system": [{"type": "text", "text": "rules",
                             "cache_control": {"type": "ephemeral"}}], "messages": msgs}
    want = seg("system", "rules") + seg("user", "q")
    assert prompt_text("/v1/messages", as_string) == want
    assert prompt_text("/v1/messages", as_blocks) == want


def test_anthropic_tool_use_and_results_as_json_without_cache_control() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    marked = {**result, "cache_control": {"type": "ephemeral"}}
    tool = {"name": "f", "input_schema": {"type": "object"}}
    doc = {"system": "s", "tools": [{**tool, "cache_control": {"type": "ephemeral"}}],
           "messages": [{"role": "user", "content": "go"},
                        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, use]},
                        {"role": "user", "content": [marked]}]}
    assert prompt_text("/v1/messages", doc) == (
        seg("system", "s") + seg("tools", compact([tool])) + seg("user", "go")
        + seg("assistant", "ok" + PS + compact(use)) + seg("user", compact(result)))


def test_cache_control_moving_to_the_newest_message_changes_nothing() -> None:
    def turn(n: int) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = []
        for i in range(n):
            block: dict[str, Any] = {"type": "text", "text": f"q{i}"}
            if i == n - 1:
                block["cache_control"] = {"type": "ephemeral"}
            msgs += [{"role": "user", "content": [block]}, {"role": "assistant", "content": "a"}]
        return {"system": "s", "messages": msgs[:-1]}

    one, two = prompt_text("/v1/messages", turn(1)), prompt_text("/v1/messages", turn(2))
    assert one is not None
    assert two is not None
    assert two.startswith(one)


def test_responses_instructions_and_input_string() -> None:
    doc = {"instructions": "be kind", "input": "hello"}
    assert prompt_text("/v1/responses", doc) == seg("system", "be kind") + seg("user", "hello")


def test_responses_input_items() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c", "output": "3"}
    doc = {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}, IMAGE]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "yo", "annotations": []}]},
        call, output]}
    assert prompt_text("/v1/responses", doc) == (
        seg("user", "hi" + PS + compact(IMAGE)) + seg("assistant", "yo")
        + seg("item", compact(call)) + seg("item", compact(output)))


def test_responses_string_then_list_keeps_the_prefix() -> None:
    first = prompt_text("/v1/responses", {"input": "hello"})
    second = prompt_text("/v1/responses", {"input": [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "more"}]})
    assert first is not None
    assert second is not None
    assert second.startswith(first)


def test_completions_prompt_shapes() -> None:
    assert prompt_text("/v1/completions", {"prompt": "once upon"}) == seg("prompt", "once upon")
    assert prompt_text("/v1/completions", {"prompt": [1, 2, 3]}) == seg("prompt", "1,2,3")
    assert prompt_text("/v1/completions", {"prompt": ["a", "b"]}) == (
        seg("prompt", "a") + seg("prompt", "b"))
    assert prompt_text("/v1/completions", {"prompt": ["a", [1, 2]]}) == (
        seg("prompt", "a") + seg("prompt", "[1,2]"))


def test_ollama_native_shapes() -> None:
    gen = {"model": "m", "system": "sys", "prompt": "why", "images": ["AAAA"]}
    assert prompt_text("/api/generate", gen) == (
        seg("system", "sys") + seg("prompt", "why") + PS + '["AAAA"]')
    chat = {"messages": [{"role": "user", "content": "see", "images": ["AAAA"]}]}
    assert prompt_text("/api/chat", chat) == seg("user", "see") + PS + '["AAAA"]'


def test_query_string_and_trailing_slash_are_ignored() -> None:
    doc = {"messages": [{"role": "user", "content": "x"}]}
    want = seg("user", "x")
    assert prompt_text("/v1/messages?beta=true", doc) == want
    assert prompt_text("/v1/chat/completions/", doc) == want


@pytest.mark.parametrize("path", [
    "/v1/embeddings", "/v1/images/generations", "/v1/messages/count_tokens",
    "/v1/responses/input_tokens", "/api/embed", "/v1/models", "/whatever"])
def test_paths_without_a_prompt(path: str) -> None:
    assert prompt_text(path, {"input": "text", "messages": [{"role": "user"}],
                              "prompt": "p"}) is None


def test_an_empty_prompt_is_none() -> None:
    assert prompt_text("/v1/chat/completions", {"messages": []}) is None
    assert prompt_text("/v1/completions", {}) is None
    assert prompt_text("/v1/responses", {"input": ""}) is None
    assert prompt_text("/v1/completions", {"prompt": ""}) is None
    assert prompt_text("/api/generate", {"prompt": ""}) is None


@pytest.mark.parametrize("doc", [
    {"messages": "hello"},
    {"messages": {"role": "user"}},
    {"messages": [None, 3, "x", ["y"], {"role": 7, "content": {"a": 1}}]},
    {"messages": [{"role": "user", "content": 12.5}, {"content": "no role"}]},
    {"messages": [{"role": "user", "content": [None, 1, "s", {"type": "text", "text": 5}]}]},
    {"system": {"odd": True}, "tools": "not a list", "messages": [{"role": "user"}]},
    {"tools": [1, {"cache_control": 1}], "messages": [{"role": "u", "tool_calls": 5}]},
    {"messages": [{"role": "user", "content": "\ud800 lone surrogate"}]},
    {"prompt": {"x": float("nan")}},
])
def test_malformed_bodies_never_raise(doc: dict[str, Any]) -> None:
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions",
                 "/api/chat", "/api/generate"):
        text = prompt_text(path, doc)
        assert text is None or isinstance(text, str)
        if text:
            chain("m", text, 16)


def test_a_body_that_is_not_an_object() -> None:
    assert prompt_text("/v1/chat/completions", [1, 2]) is None  # type: ignore[arg-type]


def test_too_deep_a_part_reads_as_a_placeholder() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    text = prompt_text("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image", "data": deep}]}]})
    assert text == seg("user", "?")


# -- the prefix property, for every dialect -----------------------------------------------

texts = st.text(max_size=40)
parts = st.one_of(texts, st.lists(st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "image_url", "image_url": {"url": t}}, texts)), max_size=3))
turns = st.lists(st.tuples(parts, parts), min_size=1, max_size=5)


def dialect_doc(path: str, system: str, history: list[tuple[Any, Any]], n: int) -> dict[
        str, Any]:
    """Turn ``n`` (1-based) of a conversation: its first n user messages and the n-1
    answers between them, as the client of ``path`` sends it."""
    msgs: list[dict[str, Any]] = []
    for i, (question, answer) in enumerate(history[:n]):
        msgs.append({"role": "user", "content": question})
        if i < n - 1:
            msgs.append({"role": "assistant", "content": answer})
    if path == "/v1/messages":
        return {"system": system, "messages": msgs}
    if path == "/v1/responses":
        return {"instructions": system, "input": msgs}
    return {"messages": [{"role": "system", "content": system}, *msgs]}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/responses",
                        "/api/chat"]), texts, turns)
def test_each_turn_starts_with_the_previous_one(path: str, system: str,
                                                 history: list[tuple[Any, Any]]) -> None:
    previous = ""
    for n in range(1, len(history) + 1):
        text = prompt_text(path, dialect_doc(path, system, history, n)) or ""
        assert text.startswith(previous)
        previous = text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=5))
def test_completion_prompts_that_grow_keep_their_prefix(pieces: list[str]) -> None:
    previous = ""
    for n in range(1, len(pieces) + 1):
        text = prompt_text("/v1/completions", {"prompt": "".join(pieces[:n])}) or ""
        assert text.startswith(previous)
        previous = text


# -- chain --------------------------------------------------------------------------------


def test_chain_blocks_and_determinism() -> None:
    assert chain("m", "", 4) == ()
    keys = chain("m", "abcdefghij", 4)  # abcd efgh ij
    assert len(keys) == 3
    assert all(0 <= k < 2**64 for k in keys)
    assert keys == chain("m", "abcdefghij", 4)
    assert chain("m", "abcdefgh", 4) == keys[:2]
    assert chain("m", "abcdefghiX", 4)[:2] == keys[:2]
    assert chain("m", "abcdefghiX", 4)[2] != keys[2]
    assert chain("m", "Xbcdefghij", 4)[1] != keys[1]  # every key carries all before it


def test_chain_is_fixed_across_processes() -> None:
    # A pinned value: blake2b-64 of the block salted by the model's seed, little-endian.
    assert chain("m", "abcd", 4) == chain("m", "abcd", 4)
    import hashlib

    seed = hashlib.blake2b(b"m", digest_size=8, person=b"sluice-chain").digest()
    first = hashlib.blake2b(b"abcd", digest_size=8, salt=seed).digest()
    assert chain("m", "abcd", 4) == (int.from_bytes(first, "little"),)


def test_models_never_share_keys() -> None:
    one, two = chain("llama", "same prompt" * 10, 8), chain("qwen", "same prompt" * 10, 8)
    assert not set(one) & set(two)


def test_blocks_are_characters_not_bytes() -> None:
    text = "héllo wörld ça va"
    keys = chain("m", text, 5)
    assert len(keys) == 4
    assert chain("m", text + "x", 5)[:3] == keys[:3]
    # The same characters, whatever the rest of the text is (ASCII or not).
    assert chain("m", "abcdeé", 5)[0] == chain("m", "abcdef", 5)[0]


def test_chain_takes_lone_surrogates() -> None:
    assert len(chain("m", "a\ud800b" * 4, 4)) == 3


def test_block_chars_below_one() -> None:
    with pytest.raises(ValueError, match="block_chars"):
        chain("m", "abc", 0)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60), st.integers(1, 9))
def test_chain_of_a_prefix_is_a_prefix(a: str, b: str, size: int) -> None:
    a = a[: len(a) - len(a) % size]  # whole blocks only
    head = chain("model", a, size)
    assert chain("model", a + b, size)[: len(head)] == head


# -- session_key --------------------------------------------------------------------------


def sluice(value: str | bytes) -> list[tuple[bytes, bytes]]:
    return [(b"x-sluice-session", value.encode() if isinstance(value, str) else value)]


def test_session_key_order() -> None:
    both = {"user": "u1", "metadata": {"user_id": "a1"}}
    assert session_key(sluice("s1"), both) == "s1"
    assert session_key(sluice(""), both) == "u1"
    assert session_key(sluice("  "), both) == "u1"
    assert session_key([], both) == "u1"
    assert session_key([], {"user": "", "metadata": {"user_id": "a1"}}) == "a1"
    assert session_key([], {"user": 5, "metadata": {"user_id": "a1"}}) == "a1"
    assert session_key([], {"metadata": {"user_id": ""}}) is None
    assert session_key([], {"metadata": "x"}) is None
    assert session_key([], {}) is None
    assert session_key([], [1]) is None  # type: ignore[arg-type]


def test_session_keys_of_the_agents_in_spec_order() -> None:
    """SPEC §17.2: x-sluice-session, x-claude-code-session-id, session-id or session_id,
    prompt_cache_key, user, metadata.user_id; the first present wins, wherever the headers
    stand in the request."""
    body = {"prompt_cache_key": "pck", "user": "u", "metadata": {"user_id": "a"}}
    heads = [(b"session-id", b"codex"), (b"x-claude-code-session-id", b"claude"),
             (b"accept", b"*/*"), (b"x-sluice-session", b"mine")]
    assert session_key(heads, body) == "mine"
    assert session_key(heads[:3], body) == "claude"
    assert session_key(heads[:1], body) == "codex"
    assert session_key([(b"session_id", b"codex2")], body) == "codex2"
    assert session_key([(b"session-id", b" "), (b"session_id", b"c3")], body) == "c3"
    assert session_key([(b"thread-id", b"t")], body) == "pck"
    assert session_key([], {"prompt_cache_key": "", "user": "u"}) == "u"
    assert session_key([], {"prompt_cache_key": 7, "metadata": {"user_id": "a"}}) == "a"


def test_claude_codes_billing_block_is_not_routing_text() -> None:
    """SPEC §17.2: a system text block that starts with the billing header (its ``cch=``
    changes per request) is left out; the rest of the system prompt is kept in order."""
    msgs = [{"role": "user", "content": "q"}]

    def system(cch: str) -> dict[str, Any]:
        return {"system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1; cch={cch};"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}},
            {"type": "text", "text": "Be brief."}], "messages": msgs}

    text = prompt_text("/v1/messages", system("1a2b"))
    assert text == seg("system", "You are Claude Code." + PS + "Be brief.") + seg("user", "q")
    assert prompt_text("/v1/messages", system("9f9f")) == text
    alone = {"system": [{"type": "text", "text": "x-anthropic-billing-header: a"}],
             "messages": msgs}
    assert prompt_text("/v1/messages", alone) == seg("user", "q")
    elsewhere = {"system": "x-anthropic-billing-header: kept as a plain string",
                 "messages": [{"role": "user", "content": [
                     {"type": "text", "text": "x-anthropic-billing-header: a user's text"}]}]}
    assert prompt_text("/v1/messages", elsewhere) == (
        seg("system", "x-anthropic-billing-header: kept as a plain string")
        + seg("user", "x-anthropic-billing-header: a user's text"))


def test_long_session_values_are_digested() -> None:
    edge = "k" * MAX_SESSION_KEY
    assert session_key(sluice(edge), {}) == edge
    long_one, long_two = "x" * 1000, "x" * 999 + "y"
    one, two = session_key(sluice(long_one), {}), session_key([], {"user": long_two})
    assert one is not None
    assert two is not None
    assert one != two
    assert one.startswith("#")
    assert len(one) <= MAX_SESSION_KEY
    assert session_key(sluice(long_one), {}) == one
