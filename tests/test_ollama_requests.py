"""Ollama requests as OpenAI requests (protocol/ollama/requests.py and its helpers): paths,
bodies, stream defaults, options, format, images, tools and tool calls, keep_alive, the
load-only requests, and every bad input refused with a 400 in Ollama's error shape."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import Family, SluiceError
from protocol.ollama import Kind, LoadOnly, Translated, parse_keep_alive, translate_request
from protocol.ollama.images import media_type
from protocol.ollama.options import SCHEMA_NAME

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 16).decode()
GIF = base64.b64encode(b"GIF89a" + b"\0" * 16).decode()
WEBP = base64.b64encode(b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 8).decode()
OTHER = base64.b64encode(b"BM not a known signature").decode()
USER = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def translated(kind: Kind, **fields: Any) -> tuple[Translated, dict[str, Any]]:
    result = translate_request(kind, body(**fields))
    assert isinstance(result, Translated)
    sent = json.loads(result.body)
    assert result.body == json.dumps(sent, separators=(",", ":"), ensure_ascii=False).encode()
    return result, sent


def refused(kind: Kind, raw: bytes) -> SluiceError:
    with pytest.raises(SluiceError) as caught:
        translate_request(kind, raw)
    err = caught.value
    assert err.status == 400
    assert json.loads(err.body(Family.OLLAMA)) == {"error": err.message}
    return err


def test_chat_becomes_a_streamed_chat_completion_with_usage() -> None:
    result, sent = translated(Kind.CHAT, messages=USER)
    assert result.path == "/v1/chat/completions"
    assert (result.model, result.stream, result.keep_alive) == ("m", True, None)
    assert result.answer.kind is Kind.CHAT
    assert result.answer.model == "m"
    assert not result.answer.text_completion
    assert sent == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "messages": USER}


@pytest.mark.parametrize("stream", [None, True])
def test_stream_is_the_default(stream: bool | None) -> None:
    result, _ = translated(Kind.CHAT, messages=USER, stream=stream)
    assert result.stream


def test_not_streamed_asks_for_no_usage_chunk() -> None:
    result, sent = translated(Kind.CHAT, messages=USER, stream=False)
    assert not result.stream
    assert sent == {"model": "m", "stream": False, "messages": USER}


def test_options_map_to_openai_and_llama_cpp_fields() -> None:
    options = {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "x"],
               "num_predict": 64, "repeat_penalty": 1.1, "presence_penalty": 0.5,
               "frequency_penalty": 0.25, "min_p": 0.05, "typical_p": 0.7,
               "repeat_last_n": 33, "mirostat": 1, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
               "num_keep": 4, "num_ctx": 8192, "num_gpu": 1, "num_thread": 8,
               "use_mmap": True, "unknown_option": "x", "top_k_unused": None}
    _, sent = translated(Kind.CHAT, messages=USER, options=options, stream=False)
    assert sent == {"model": "m", "stream": False, "messages": USER, "temperature": 0.2,
                    "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "x"],
                    "max_tokens": 64, "repeat_penalty": 1.1, "presence_penalty": 0.5,
                    "frequency_penalty": 0.25, "min_p": 0.05, "typical_p": 0.7,
                    "repeat_last_n": 33, "mirostat": 1, "mirostat_tau": 5.0,
                    "mirostat_eta": 0.1, "n_keep": 4}


@pytest.mark.parametrize(("options", "fields"), [
    ({"num_predict": -1}, {}),  # Ollama's "no limit"
    ({"num_predict": -2}, {}),
    ({"num_predict": 12.0, "seed": 3.0}, {"max_tokens": 12, "seed": 3}),
    ({"stop": "END"}, {"stop": ["END"]}),
    ({"temperature": None}, {}),
    ({"temperature": 1}, {"temperature": 1}),
])
def test_option_values(options: dict[str, Any], fields: dict[str, Any]) -> None:
    _, sent = translated(Kind.GENERATE, prompt="p", options=options, stream=False)
    del sent["model"], sent["stream"], sent["messages"]
    assert sent == fields


def test_format_json_and_schema() -> None:
    _, sent = translated(Kind.CHAT, messages=USER, format="json")
    assert sent["response_format"] == {"type": "json_object"}
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    _, sent = translated(Kind.CHAT, messages=USER, format=schema)
    assert sent["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": SCHEMA_NAME, "schema": schema}}
    for none in ("", None):
        _, sent = translated(Kind.CHAT, messages=USER, format=none)
        assert "response_format" not in sent


def test_generate_is_system_and_prompt_as_messages() -> None:
    result, sent = translated(Kind.GENERATE, prompt="Why?", system="Be brief.", stream=False,
                              format="json", template="{{ .Prompt }}", context=[1, 2],
                              suffix="end", think=True)
    assert result.path == "/v1/chat/completions"
    assert result.answer.kind is Kind.GENERATE
    assert not result.answer.text_completion
    assert sent == {"model": "m", "stream": False,
                    "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Why?"}],
                    "response_format": {"type": "json_object"}}


def test_generate_raw_is_a_text_completion() -> None:
    result, sent = translated(Kind.GENERATE, prompt="[INST] hi [/INST]", raw=True,
                              options={"num_predict": 3})
    assert result.path == "/v1/completions"
    assert result.answer.text_completion
    assert sent == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "prompt": "[INST] hi [/INST]", "max_tokens": 3}
    schema = {"type": "object"}
    _, sent = translated(Kind.GENERATE, prompt="p", raw=True, format={"type": "array"})
    assert sent["json_schema"] == {"type": "array"}
    _, sent = translated(Kind.GENERATE, prompt="p", raw=True, format="json")
    assert sent["json_schema"] == schema


def test_generate_images_are_image_parts() -> None:
    _, sent = translated(Kind.GENERATE, prompt="What is it?", images=[PNG, JPEG])
    assert sent["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
    ]}]


@pytest.mark.parametrize(("image", "kind"), [(PNG, "image/png"), (JPEG, "image/jpeg"),
                                             (GIF, "image/gif"), (WEBP, "image/webp"),
                                             (OTHER, "image/jpeg")])
def test_image_media_type_from_magic(image: str, kind: str) -> None:
    assert media_type(base64.b64decode(image)) == kind
    _, sent = translated(Kind.CHAT, messages=[{"role": "user", "content": "", "images": [image]}])
    assert sent["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{image}"}}]


def test_image_base64_wrapped_over_lines_is_joined() -> None:
    wrapped = PNG[:10] + "\n" + PNG[10:]
    _, sent = translated(Kind.CHAT, messages=[{"role": "user", "content": "x",
                                               "images": [wrapped]}])
    assert sent["messages"][0]["content"][1]["image_url"]["url"].endswith(PNG)


def test_tools_and_tool_calls_both_ways() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    untyped = {"function": {"name": "get_time"}}
    messages = [
        {"role": "user", "content": "Weather in Toronto and the time?"},
        {"role": "assistant", "content": "", "thinking": "let me see", "tool_calls": [
            {"function": {"name": "get_time", "arguments": {}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Toronto"}}},
        ]},
        {"role": "tool", "content": "11 degrees", "tool_name": "get_weather"},
        {"role": "tool", "content": "noon", "tool_name": "nothing-matches"},
        {"role": "tool", "content": "late", "tool_name": "get_time"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "given-id", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}},
            {"function": {"name": "get_time"}}]},
        {"role": "tool", "content": "13:00", "tool_call_id": "given-id"},
        {"role": "tool", "content": "14:00"},
    ]
    _, sent = translated(Kind.CHAT, messages=messages, tools=[tool, untyped])
    assert sent["tools"] == [tool, {"type": "function", "function": {"name": "get_time"}}]
    assert sent["messages"] == [
        {"role": "user", "content": "Weather in Toronto and the time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1_0", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}},
            {"id": "call_1_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Toronto"}'}}]},
        {"role": "tool", "content": "11 degrees", "tool_call_id": "call_1_1"},
        {"role": "tool", "content": "noon", "tool_call_id": "call_1_0"},
        {"role": "tool", "content": "late", "tool_call_id": "call_4"},  # none left
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "given-id", "type": "function",
             "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}},
            {"id": "call_5_1", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "content": "13:00", "tool_call_id": "given-id"},
        {"role": "tool", "content": "14:00", "tool_call_id": "call_5_1"},
    ]
    again, _ = translated(Kind.CHAT, messages=messages, tools=[tool, untyped])
    twice, _ = translated(Kind.CHAT, messages=messages, tools=[tool, untyped])
    assert again.body == twice.body  # the made-up ids are the same every time


def test_message_content_null_or_absent_is_empty() -> None:
    _, sent = translated(Kind.CHAT, messages=[{"role": "user"},
                                              {"role": "assistant", "content": None}])
    assert sent["messages"] == [{"role": "user", "content": ""},
                                {"role": "assistant", "content": ""}]


def test_embed_and_embeddings() -> None:
    result, sent = translated(Kind.EMBED, input="one", truncate=True, keep_alive="1m",
                              options={"num_ctx": 1})
    assert (result.path, result.stream, result.keep_alive) == ("/v1/embeddings", False, 60.0)
    assert sent == {"model": "m", "input": ["one"], "encoding_format": "float"}
    _, sent = translated(Kind.EMBED, input=["a", "b"], dimensions=8)
    assert sent == {"model": "m", "dimensions": 8, "input": ["a", "b"],
                    "encoding_format": "float"}
    result, sent = translated(Kind.EMBEDDINGS, prompt="legacy")
    assert result.answer.kind is Kind.EMBEDDINGS
    assert sent == {"model": "m", "input": ["legacy"], "encoding_format": "float"}


@pytest.mark.parametrize(("kind", "fields"), [
    (Kind.CHAT, {}), (Kind.CHAT, {"messages": []}), (Kind.CHAT, {"messages": None}),
    (Kind.GENERATE, {}), (Kind.GENERATE, {"prompt": ""}), (Kind.GENERATE, {"prompt": None}),
    (Kind.GENERATE, {"prompt": "", "raw": True}),
    (Kind.EMBED, {}), (Kind.EMBED, {"input": ""}), (Kind.EMBED, {"input": []}),
    (Kind.EMBEDDINGS, {}), (Kind.EMBEDDINGS, {"prompt": ""}),
])
def test_load_only(kind: Kind, fields: dict[str, Any]) -> None:
    result = translate_request(kind, body(**fields))
    assert isinstance(result, LoadOnly)
    assert (result.model, result.answer.kind, result.keep_alive, result.unload) == (
        "m", kind, None, False)
    unload = translate_request(kind, body(keep_alive=0, **fields))
    assert isinstance(unload, LoadOnly)
    assert unload.unload
    assert unload.keep_alive == 0
    kept = translate_request(kind, body(keep_alive="-1m", **fields))
    assert isinstance(kept, LoadOnly)
    assert kept.keep_alive == math.inf
    assert not kept.unload


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (0, 0.0), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0),
    ("1.5h", 5400.0), ("300ms", 0.3), ("90", 90.0), (" 2m ", 120.0), ("1h0m0.5s", 3600.5),
    ("1000000us", 1.0), ("1000000\u00b5s", 1.0), ("5000000000ns", 5.0), ("-0s", 0.0),
    (30, 30.0), (2.5, 2.5), (-1, math.inf), ("-1m", math.inf), ("-5", math.inf),
    (-0.5, math.inf), ("+3s", 3.0), (".5s", 0.5),
])
def test_keep_alive(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["", "m", "5", "5x", "1h-30m", "5 m", "--1m", "1e3s",
                                   "forever", True, False, [], {}, "-", "1.2.3s", "s5"])
def test_keep_alive_refused(value: object) -> None:
    if value == "5":
        assert parse_keep_alive(value) == 5.0  # the one leniency: a bare number of seconds
        return
    with pytest.raises(SluiceError) as caught:
        parse_keep_alive(value)
    assert caught.value.status == 400
    assert "keep_alive" in caught.value.message


def test_keep_alive_nan_refused() -> None:
    with pytest.raises(SluiceError):
        parse_keep_alive(math.nan)


BAD: list[tuple[Kind, bytes, str]] = [
    (Kind.CHAT, b"", "missing request body"),
    (Kind.CHAT, b"  \n", "missing request body"),
    (Kind.CHAT, b"{", "not valid JSON"),
    (Kind.CHAT, b'{"model": "m"} x', "not valid JSON"),
    (Kind.CHAT, b'{"model": NaN}', "not valid JSON"),
    (Kind.CHAT, b"\xff\xfe", "not valid JSON"),
    (Kind.CHAT, b"[" * 5000, "not valid JSON"),
    (Kind.CHAT, b"[]", "JSON object"),
    (Kind.CHAT, b'"model"', "JSON object"),
    (Kind.CHAT, b"{}", "model is required"),
    (Kind.GENERATE, body(model=""), "model is required"),
    (Kind.EMBED, body(model=None), "model is required"),
    (Kind.CHAT, body(model=3), "model must be a string"),
    (Kind.CHAT, body(messages={"role": "user"}), "messages must be a list"),
    (Kind.CHAT, body(messages=["hi"]), "messages[0] must be an object"),
    (Kind.CHAT, body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    (Kind.CHAT, body(messages=[{"content": "x"}]), "messages[0].role"),
    (Kind.CHAT, body(messages=[{"role": "user", "content": ["x"]}]), "content must be a str"),
    (Kind.CHAT, body(messages=[{"role": "user", "content": 1}]), "content must be a string"),
    (Kind.CHAT, body(messages=USER, options=[1]), "options must be an object"),
    (Kind.EMBED, body(input="x", options="x"), "options must be an object"),
    (Kind.CHAT, body(messages=USER, options={"temperature": "hot"}), "'temperature'"),
    (Kind.CHAT, body(messages=USER, options={"temperature": True}), "'temperature'"),
    (Kind.CHAT, body(messages=USER, options={"top_k": 1.5}), "'top_k'"),
    (Kind.CHAT, body(messages=USER, options={"num_predict": "10"}), "'num_predict'"),
    (Kind.CHAT, body(messages=USER, options={"stop": [1]}), "'stop'"),
    (Kind.CHAT, body(messages=USER, stream="yes"), "stream must be true or false"),
    (Kind.GENERATE, body(prompt="p", stream=1), "stream must be true or false"),
    (Kind.CHAT, body(messages=USER, format="xml"), "format"),
    (Kind.CHAT, body(messages=USER, format=["json"]), "format"),
    (Kind.CHAT, body(messages=USER, keep_alive="soon"), "keep_alive"),
    (Kind.CHAT, body(messages=USER, keep_alive=[5]), "keep_alive"),
    (Kind.GENERATE, body(prompt="p", images="abc"), "images must be a list"),
    (Kind.GENERATE, body(prompt="p", images=[1]), "images[0] must be"),
    (Kind.GENERATE, body(prompt="p", images=["not base64!"]), "images[0] is not"),
    (Kind.GENERATE, body(prompt="p", images=[""]), "images[0] is empty"),
    (Kind.CHAT, body(messages=[{"role": "user", "images": ["%%"]}]), "messages[0].images[0]"),
    (Kind.CHAT, body(messages=USER, tools={"x": 1}), "tools must be a list"),
    (Kind.CHAT, body(messages=USER, tools=["x"]), "tools[0]"),
    (Kind.CHAT, body(messages=USER, tools=[{"type": "function"}]), "tools[0]"),
    (Kind.CHAT, body(messages=[{"role": "assistant", "tool_calls": {}}]), "must be a list"),
    (Kind.CHAT, body(messages=[{"role": "assistant", "tool_calls": [1]}]), "tool_calls[0]"),
    (Kind.CHAT, body(messages=[{"role": "assistant", "tool_calls": [{"function": {}}]}]),
     "function.name"),
    (Kind.CHAT, body(messages=[{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": 3}}]}]), "arguments must be an object"),
    (Kind.GENERATE, body(prompt=["p"]), "prompt must be a string"),
    (Kind.GENERATE, body(prompt="p", system=1), "system must be a string"),
    (Kind.GENERATE, body(prompt="p", raw="true"), "raw must be true or false"),
    (Kind.GENERATE, body(prompt="p", raw=True, system="s"), "raw mode"),
    (Kind.GENERATE, body(prompt="p", raw=True, images=[PNG]), "raw mode"),
    (Kind.EMBED, body(input=3), "input must be a string or a list"),
    (Kind.EMBED, body(input=["a", 2]), "input[1] must be a string"),
    (Kind.EMBED, body(input="a", dimensions=0), "dimensions"),
    (Kind.EMBED, body(input="a", dimensions="8"), "dimensions"),
    (Kind.EMBEDDINGS, body(prompt=5), "prompt must be a string"),
    (Kind.EMBEDDINGS, body(prompt=0), "prompt must be a string"),
]


@pytest.mark.parametrize(("kind", "raw", "words"), BAD)
def test_bad_input_is_a_400(kind: Kind, raw: bytes, words: str) -> None:
    assert words in refused(kind, raw).message


@PROPERTY
@given(kind=st.sampled_from(list(Kind)), raw=st.binary(max_size=200))
def test_any_bytes_translate_or_are_refused(kind: Kind, raw: bytes) -> None:
    status = 200
    try:
        translate_request(kind, raw)
    except SluiceError as err:
        status = err.status
    assert status in (200, 400)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", "", None, 1]), "stream": JSONISH, "keep_alive": JSONISH,
    "options": JSONISH, "format": JSONISH, "messages": JSONISH, "prompt": JSONISH,
    "system": JSONISH, "raw": JSONISH, "images": JSONISH, "tools": JSONISH,
    "input": JSONISH, "dimensions": JSONISH})


@pytest.mark.slow
@PROPERTY
@given(kind=st.sampled_from(list(Kind)), fields=FIELDS)
def test_any_json_object_translates_to_json_or_is_refused(kind: Kind,
                                                          fields: dict[str, Any]) -> None:
    try:
        result = translate_request(kind, json.dumps(fields).encode())
    except SluiceError as err:
        status = err.status
        result = None
    else:
        status = 200
    assert status in (200, 400)
    if isinstance(result, Translated):
        sent = json.loads(result.body)
        assert sent["model"] == result.model == fields["model"]
