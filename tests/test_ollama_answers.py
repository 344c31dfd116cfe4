"""Whole answers, load answers, listings and errors of the Ollama API
(protocol/ollama/answers.py, listings.py, errors.py), and the official ollama-python client
reading all of them: its requests translated, the answers llama.cpp recorded
(tests/fixtures/ollama/) translated back, over an httpx MockTransport (no sockets)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.errors import Family, SluiceError
from protocol.ollama import (
    OLLAMA_VERSION,
    PATHS,
    Answer,
    Kind,
    LoadedModel,
    LoadOnly,
    ModelFacts,
    StreamTranslator,
    Timing,
    Translated,
    error_line,
    facts_from_entry,
    format_time,
    load_answer,
    model_not_found,
    not_supported,
    ps_body,
    show_body,
    show_model,
    tags_body,
    translate_request,
    upstream_error,
    version_body,
    whole_answer,
)

ollama = pytest.importorskip("ollama")

FIXTURES = Path(__file__).parent / "fixtures" / "ollama"
AT = "2026-12-02T16:18:11.5Z"
TIMING = Timing(total_ns=4_000_000_000, load_ns=500_000_000)
CHAT = Answer(Kind.CHAT, "smol")
NOW = 1_796_228_183.25


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_whole_chat_answer() -> None:
    out = json.loads(whole_answer(CHAT, fixture("chat_whole.json"), AT, TIMING))
    assert out == {"model": "smol", "created_at": AT,
                   "message": {"role": "assistant", "content": "1. Red: This is the most"},
                   "done": True, "done_reason": "length", "total_duration": 4_000_000_000,
                   "load_duration": 500_000_000, "prompt_eval_count": 34,
                   "prompt_eval_duration": 620_793_000, "eval_count": 8,
                   "eval_duration": 1_210_298_000}
    response = ollama.ChatResponse.model_validate(out)
    assert response.message.content == "1. Red: This is the most"
    assert response.done


def test_whole_generate_answers() -> None:
    chat_based = json.loads(whole_answer(Answer(Kind.GENERATE, "smol"),
                                         fixture("chat_whole.json"), AT, TIMING))
    assert chat_based["response"] == "1. Red: This is the most"
    assert "message" not in chat_based
    raw = json.loads(whole_answer(Answer(Kind.GENERATE, "smol", text_completion=True),
                                  fixture("completion_whole.json"), AT, TIMING))
    assert raw["response"] == " a canvas of endless possibilities,"
    assert (raw["done_reason"], raw["prompt_eval_count"], raw["eval_count"]) == ("length", 3, 6)
    assert ollama.GenerateResponse.model_validate(raw).response == raw["response"]


def test_whole_chat_with_tool_calls_and_thinking() -> None:
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "reasoning_content": "weather, so a tool",
        "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city":"Tokyo"}'}}, "junk"]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
    out = json.loads(whole_answer(CHAT, body, AT, Timing(total_ns=100)))
    assert out["message"] == {"role": "assistant", "content": "", "thinking": "weather, so a tool",
                              "tool_calls": [{"id": "c1", "function": {
                                  "index": 0, "name": "get_weather",
                                  "arguments": {"city": "Tokyo"}}}]}
    assert out["done_reason"] == "stop"
    assert (out["prompt_eval_duration"], out["eval_duration"]) == (0, 100)
    response = ollama.ChatResponse.model_validate(out)
    assert response.message.tool_calls[0].function.arguments == {"city": "Tokyo"}


def test_whole_embed_answers() -> None:
    recorded = json.loads(fixture("embeddings.json"))
    vectors = [item["embedding"] for item in recorded["data"]]
    out = json.loads(whole_answer(Answer(Kind.EMBED, "smol"), fixture("embeddings.json"), AT,
                                  TIMING))
    assert out == {"model": "smol", "embeddings": vectors, "total_duration": 4_000_000_000,
                   "load_duration": 500_000_000, "prompt_eval_count": 2}
    assert ollama.EmbedResponse.model_validate(out).embeddings == vectors
    legacy = json.loads(whole_answer(Answer(Kind.EMBEDDINGS, "smol"), fixture("embeddings.json"),
                                     AT, TIMING))
    assert legacy == {"embedding": vectors[0]}
    shuffled = json.dumps({"data": [{"index": 1, "embedding": [2]},
                                    {"index": 0, "embedding": [1]}]}).encode()
    assert json.loads(whole_answer(Answer(Kind.EMBED, "m"), shuffled, AT, TIMING))[
        "embeddings"] == [[1], [2]]
    empty = json.loads(whole_answer(Answer(Kind.EMBEDDINGS, "m"), b'{"data": []}', AT, TIMING))
    assert empty == {"embedding": []}


@pytest.mark.parametrize(("kind", "body"), [
    (Kind.CHAT, b"not json"), (Kind.CHAT, b"[1]"), (Kind.CHAT, b'{"choices": []}'),
    (Kind.CHAT, b'{"choices": [{"index": 0}]}'), (Kind.GENERATE, b'{"choices": "x"}'),
    (Kind.CHAT, b'{"error": {"message": "boom"}}'), (Kind.EMBED, b'{"data": {}}'),
    (Kind.EMBED, b'{"data": [{"embedding": [[1.0]]}]}'),
    (Kind.EMBEDDINGS, b'{"data": [{"embedding": [true]}]}'),
])
def test_untranslatable_answers_are_502(kind: Kind, body: bytes) -> None:
    with pytest.raises(SluiceError) as caught:
        whole_answer(Answer(kind, "m"), body, AT, TIMING)
    assert caught.value.status == 502


def test_load_answers() -> None:
    for kind, expected in [
        (Kind.CHAT, {"model": "m", "created_at": AT, "message": {"role": "assistant",
                                                                  "content": ""},
                     "done": True, "done_reason": "load"}),
        (Kind.GENERATE, {"model": "m", "created_at": AT, "response": "", "done": True,
                         "done_reason": "load"}),
        (Kind.EMBED, {"model": "m", "embeddings": []}),
        (Kind.EMBEDDINGS, {"embedding": []}),
    ]:
        assert json.loads(load_answer(LoadOnly(Answer(kind, "m"), None), AT)) == expected
    unload = json.loads(load_answer(LoadOnly(Answer(Kind.CHAT, "m"), 0.0), AT))
    assert unload["done_reason"] == "unload"
    assert ollama.ChatResponse.model_validate(unload).done


def test_upstream_errors() -> None:
    err = upstream_error(400, fixture("exceed_context.json"))
    assert err.status == 400
    assert json.loads(err.body(Family.OLLAMA)) == {"error": (
        "request (3031 tokens) exceeds the available context size (1024 tokens), "
        "try increasing it")}
    assert upstream_error(500, b"Internal Server Error\n").message == "Internal Server Error"
    assert upstream_error(503, b"").message == "the model server answered 503"
    assert upstream_error(502, b'{"error": "plain"}').message == "plain"
    assert upstream_error(500, b'{"ok": true}').message == "the model server answered 500"
    assert upstream_error(500, b"x" * 5000).message == "x" * 1000
    assert error_line("boom") == b'{"error":"boom"}\n'
    assert error_line("\ud800") == b'{"error":"\\ud800"}\n'


@pytest.mark.parametrize("path", ["/api/pull", "/api/push", "/api/create", "/api/copy",
                                  "/api/delete", "/api/blobs/sha256:abc"])
def test_model_file_endpoints_are_not_supported(path: str) -> None:
    err = not_supported(path)
    assert err.status == 501
    assert "models folder" in err.message
    assert "GGUF" in err.message
    assert json.loads(err.body(Family.OLLAMA)) == {"error": err.message}


def test_listings() -> None:
    facts = ModelFacts(name="smollm2-135m", size=98_362_432, modified_at=1_721_680_408.5,
                       format="gguf", family="llama", parameter_size="135M",
                       quantization_level="Q4_1", context_length=2048)
    tags = json.loads(tags_body([facts, facts_from_entry({"id": "remote-m", "created": 0})]))
    assert tags["models"][0] == {
        "name": "smollm2-135m", "model": "smollm2-135m",
        "modified_at": "2024-07-22T20:33:28.5Z", "size": 98_362_432, "digest": "",
        "details": {"parent_model": "", "format": "gguf", "family": "llama",
                    "families": ["llama"], "parameter_size": "135M",
                    "quantization_level": "Q4_1"}}
    assert tags["models"][1]["modified_at"] == "1970-01-01T00:00:00Z"
    assert tags["models"][1]["details"]["families"] == []
    listed = ollama.ListResponse.model_validate(tags)
    assert [m.model for m in listed.models] == ["smollm2-135m", "remote-m"]
    ps = json.loads(ps_body([LoadedModel(facts, 200_000_000, NOW + 300),
                             LoadedModel(facts, 1, math.inf)], NOW))
    assert ps["models"][0]["expires_at"] == format_time(NOW + 300)
    assert ps["models"][0]["size"] == 200_000_000
    assert ps["models"][0]["size_vram"] == 0
    assert ps["models"][1]["expires_at"].startswith("2319-")
    running = ollama.ProcessResponse.model_validate(ps)
    assert running.models[1].expires_at.year == 2319
    show = json.loads(show_body(facts, ("completion", "tools")))
    assert show["capabilities"] == ["completion", "tools"]
    assert show["model_info"] == {"general.architecture": "llama", "llama.context_length": 2048}
    assert show["parameters"] == "num_ctx 2048"
    assert show["template"] == ""
    assert ollama.ShowResponse.model_validate(show).details.family == "llama"
    bare = json.loads(show_body(ModelFacts(name="x")))
    assert (bare["capabilities"], bare["model_info"], bare["parameters"]) == (["completion"],
                                                                              {}, "")
    assert json.loads(version_body()) == {"version": OLLAMA_VERSION}
    assert facts_from_entry({"id": "m", "created": 5}, size=3, format="gguf") == ModelFacts(
        name="m", size=3, modified_at=5.0, format="gguf")


def test_show_model() -> None:
    assert show_model(b'{"model": "a"}') == "a"
    assert show_model(b'{"name": "b"}') == "b"
    for bad in (b"", b"{", b"[]", b'{"model": ""}', b'{"model": 1}'):
        with pytest.raises(SluiceError) as caught:
            show_model(bad)
        assert caught.value.status == 400
    assert model_not_found("x").status == 404
    assert model_not_found("x").message == "model 'x' not found"


def test_format_time() -> None:
    assert format_time(0) == "1970-01-01T00:00:00Z"
    assert format_time(1_721_680_408.123648) == "2024-07-22T20:33:28.123648Z"
    assert format_time(-1) == "1970-01-01T00:00:00Z"
    assert format_time(math.inf) == format_time(1e300) == "9999-12-31T23:59:59Z"
    assert format_time(math.nan) == "1970-01-01T00:00:00Z"


# The ollama-python client against the translation layer, with llama.cpp's recorded answers
# standing in for the model server.

def fake_gateway(cut: bool = False) -> Callable[[httpx.Request], httpx.Response]:
    facts = ModelFacts(name="smol", size=98_362_432, format="gguf", family="llama")

    def handle(request: httpx.Request) -> httpx.Response:
        try:
            return respond(request)
        except SluiceError as err:
            return httpx.Response(err.status, content=err.body(Family.OLLAMA))

    def respond(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/tags":
            return httpx.Response(200, content=tags_body([facts]))
        if path == "/api/ps":
            return httpx.Response(200, content=ps_body([LoadedModel(facts, 1, math.inf)], NOW))
        if path == "/api/show":
            show_model(request.content)
            return httpx.Response(200, content=show_body(facts))
        if path == "/api/version":
            return httpx.Response(200, content=version_body())
        if path not in PATHS:
            raise not_supported(path)
        result = translate_request(PATHS[path], request.content)
        if isinstance(result, LoadOnly):
            return httpx.Response(200, content=load_answer(result, AT))
        return httpx.Response(200, content=answer(result))

    def answer(result: Translated) -> bytes:
        sent = json.loads(result.body)
        if result.path == "/v1/embeddings":
            return whole_answer(result.answer, fixture("embeddings.json"), AT, TIMING)
        raw = result.path == "/v1/completions"
        if not result.stream:
            name = "completion_whole.json" if raw else "chat_whole.json"
            return whole_answer(result.answer, fixture(name), AT, TIMING)
        name = ("completion_stream.sse" if raw else
                "chat_tools_stream.sse" if "tools" in sent else "chat_stream.sse")
        upstream = fixture(name)
        translator = StreamTranslator(result.answer)
        if cut:
            return translator.feed(upstream[:400], AT) + translator.finish(AT, TIMING)
        pieces = [upstream[i:i + 7] for i in range(0, len(upstream), 7)]
        return b"".join(translator.feed(p, AT) for p in pieces) + translator.finish(AT, TIMING)

    return handle


def client(cut: bool = False) -> Any:
    return ollama.Client(host="http://sluice.test", transport=httpx.MockTransport(
        fake_gateway(cut)))


def test_the_ollama_client_chats() -> None:
    c = client()
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = c.chat(model="smol", messages=messages, stream=False, options={"temperature": 0})
    assert whole.message.content == "1. Red: This is the most"
    assert whole.done_reason == "length"
    assert whole.eval_count == 8
    parts = list(c.chat(model="smol", messages=messages, stream=True))
    assert "".join(p.message.content for p in parts) == "1. Red: This is the most"
    assert [p.done for p in parts] == [False] * 8 + [True]
    assert parts[-1].prompt_eval_count == 34
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    called = list(c.chat(model="smol", messages=messages, tools=[tool], stream=True))
    calls = called[0].message.tool_calls
    assert [(t.function.name, t.function.arguments) for t in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_time", {"zone": "Europe/Paris"})]
    loaded = c.chat(model="smol", messages=[], keep_alive=0)
    assert loaded.done_reason == "unload"


def test_the_ollama_client_generates_and_embeds() -> None:
    c = client()
    assert c.generate(model="smol", prompt="Name three colours.", stream=False).response == (
        "1. Red: This is the most")
    raw = "".join(p.response for p in c.generate(model="smol", prompt="The sky is", raw=True,
                                                   stream=True))
    assert raw == " a canvas of endless possibilities,"
    assert c.generate(model="smol").done_reason == "load"
    embedded = c.embed(model="smol", input=["hi", "there"])
    assert len(embedded.embeddings) == 2
    assert embedded.prompt_eval_count == 2
    assert len(c.embeddings(model="smol", prompt="hi").embedding) == 6


def test_the_ollama_client_lists_and_is_refused() -> None:
    c = client()
    assert [m.model for m in c.list().models] == ["smol"]
    assert c.ps().models[0].size_vram == 0
    assert c.show("smol").capabilities == ["completion"]
    with pytest.raises(ollama.ResponseError) as caught:
        c.pull("llama3.2", stream=False)
    assert caught.value.status_code == 501
    assert "models folder" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        c.chat(model="smol", messages=[{"role": "robot", "content": "x"}])
    assert caught.value.status_code == 400
    assert "role" in caught.value.error


def test_the_ollama_client_sees_a_cut_stream_as_an_error() -> None:
    parts = client(cut=True).chat(model="smol", messages=[{"role": "user", "content": "x"}],
                                  stream=True)
    with pytest.raises(ollama.ResponseError) as caught:
        list(parts)
    assert "ended before the answer was complete" in caught.value.error
