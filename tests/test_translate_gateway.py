"""Messages translated to Chat Completions through a whole gateway (SPEC §17.1), against a
fake chat-only model server (it answers ``/v1/chat/completions`` and 404 elsewhere, as
mlx_lm.server does): ``auto`` probes and marks it, the real ``anthropic`` SDK gets whole and
streamed answers (text and a tool call), the request log and the metrics say so; the safety
net for a server the probes could not tell; ``native`` relays untouched; the context
overflow, a cut stream and count_tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import attrs
import httpx2
import pytest
import trio

from protocol.config import BackendConfig
from proxy.server import Gateway
from tests.client import request
from tests.conftest import RunningGateway, gateway_config, open_settings
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    reset_mid_stream,
    sse_stream,
    status,
)
from tests.waits import settled

MODEL = "fake-model"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


USAGE = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":3,'
         b'"prompt_tokens_details":{"cached_tokens":10}}}\n\n')
DONE = b"data: [DONE]\n\n"
TEXT_STREAM = [chunk({"role": "assistant", "content": None}), chunk({"content": "Red, "}),
               chunk({"content": "green, blue."}), chunk({}, "stop"), USAGE, DONE]
TOOL_STREAM = [chunk({"role": "assistant", "content": None}),
               chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]}),
               chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                      "function": {"name": "read_file"}}]}),
               chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "a.txt"}'}}]}),
               chunk({}, "tool_calls"), USAGE, DONE]


def chat_only(stream: list[bytes] | None = None) -> FakeUpstream:
    up = FakeUpstream(models=(MODEL,))

    async def chat(req: ReceivedRequest, w: ResponseWriter) -> None:
        if req.json().get("stream"):
            await sse_stream(stream or TEXT_STREAM)(req, w)
        else:
            await json_completion("Red, green, blue.")(req, w)

    up.on("POST", "/v1/chat/completions", chat)
    return up


async def start(nursery: trio.Nursery, folder: Path, up: FakeUpstream,
                apis: str = "auto") -> RunningGateway:
    await nursery.start(up.serve)
    cfg = gateway_config([], socket_dir=folder / "s")
    cfg = attrs.evolve(cfg, backends=(BackendConfig(name="mlx", url=up.url, apis=apis),))
    gateway = Gateway(open_settings(folder / "data", cfg))
    await nursery.start(gateway.run)
    await gateway.backends.ready.wait()
    return RunningGateway(gateway)


def client(gw: RunningGateway) -> anthropic.Anthropic:
    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=gw.gateway.ctx.socket_path))
    return anthropic.Anthropic(base_url="http://localhost", api_key="unused", http_client=http,
                               max_retries=0)


async def log_entries(gw: RunningGateway, count: int) -> list[dict[str, Any]]:
    log, hub = gw.gateway.ctx.request_log, gw.gateway.hub

    def logged() -> bool:
        hub.drain()  # the batched records, handed to the log now
        return len(log) >= count

    await settled(logged, f"{count} requests in the request log")
    found: list[dict[str, Any]] = (await request(gw.unix, "GET",
                                                 "/api/v1/requests")).json()["requests"]
    return found


ASK = {"model": MODEL, "max_tokens": 64,
       "messages": [{"role": "user", "content": "Name three colours."}]}


async def test_auto_probes_and_the_sdk_gets_translated_answers(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    up = chat_only()
    gw = await start(nursery, short_tmp, up)
    backend = gw.gateway.backends.backends[0]
    assert backend.apis.view() == {"messages": "translate", "responses": "translate"}
    assert [r.body for r in up.requests_to("/v1/messages")] == [b"{}"]

    def ask() -> tuple[Any, list[str], Any]:
        with client(gw) as sdk:
            whole = sdk.messages.create(**ASK)
            with sdk.messages.stream(**ASK) as stream:
                texts = list(stream.text_stream)
                final = stream.get_final_message()
        return whole, texts, final

    whole, texts, final = await trio.to_thread.run_sync(ask)
    assert whole.content[0].text == "Red, green, blue."
    assert whole.stop_reason == "end_turn"
    assert whole.model == MODEL
    assert "".join(texts) == "Red, green, blue."
    assert final.usage.input_tokens == 20
    assert final.usage.cache_read_input_tokens == 10
    assert final.usage.output_tokens == 3
    assert final.stop_reason == "end_turn"
    sent = [r.json() for r in up.requests_to("/v1/chat/completions")]
    assert sent[0]["messages"] == [{"role": "user", "content": "Name three colours."}]
    assert sent[1]["stream_options"] == {"include_usage": True}
    assert len(up.requests_to("/v1/messages")) == 1  # only the probe: never relayed
    entries = await log_entries(gw, 2)
    assert [(e["path"], e["translated"], e["usageEstimated"]) for e in entries] == [
        ("/v1/messages", "messages", False)] * 2
    assert entries[0]["usage"]["prompt_tokens"] == 30  # read from the chat answer
    metrics = (await request(gw.unix, "GET", "/metrics")).body.decode()
    assert 'api="messages",code="200"} 2' in metrics
    listed = (await request(gw.unix, "GET", "/v1/models")).json()["data"]
    assert listed[0]["sluice"]["apis"] == {"messages": "translate", "responses": "translate"}


async def test_a_streamed_tool_call_reaches_the_sdk_whole(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    gw = await start(nursery, short_tmp, chat_only(TOOL_STREAM))
    tools = [{"name": "read_file", "description": "Read a file",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]

    def ask() -> Any:
        with client(gw) as sdk, sdk.messages.stream(**ASK, tools=tools) as stream:
            return stream.get_final_message()

    final = await trio.to_thread.run_sync(ask)
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert (block.type, block.id, block.name, block.input) == (
        "tool_use", "call_1", "read_file", {"path": "a.txt"})


async def test_the_header_and_a_stream_without_usage(nursery: trio.Nursery,
                                                     short_tmp: Path) -> None:
    plain = [chunk({"content": "Hello there"}), chunk({}, "stop"), DONE]
    gw = await start(nursery, short_tmp, chat_only(plain), apis="translate")
    reply = await request(gw.unix, "POST", "/v1/messages",
                          json.dumps({**ASK, "stream": True}).encode())
    assert reply.status == 200
    assert reply.header("x-sluice-translated") == "chat"
    assert reply.header("content-type") == "text/event-stream"
    names = [line[7:] for line in reply.body.decode().split("\n") if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    (entry,) = await log_entries(gw, 1)
    assert entry["translated"] == "messages"
    assert entry["usageEstimated"] is True


async def test_the_safety_net_translates_once_and_marks_the_server(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    up = chat_only()

    async def unclear(req: ReceivedRequest, w: ResponseWriter) -> None:
        # the probe's {} gets a 503 (nothing learnt); a real request a 404
        await status(503 if req.body == b"{}" else 404)(req, w)

    up.on("POST", "/v1/messages", unclear)
    gw = await start(nursery, short_tmp, up)
    backend = gw.gateway.backends.backends[0]
    assert backend.apis.messages is None
    body = json.dumps(ASK).encode()
    first = await request(gw.unix, "POST", "/v1/messages", body)
    assert first.status == 200
    assert first.json()["content"][0]["text"] == "Red, green, blue."
    assert backend.apis.messages == "translate"
    second = await request(gw.unix, "POST", "/v1/messages", body)
    assert second.status == 200
    real = [r for r in up.requests_to("/v1/messages") if r.body != b"{}"]
    assert len(real) == 1  # the second went straight to chat
    assert len(up.requests_to("/v1/chat/completions")) == 2


async def test_native_relays_untouched(nursery: trio.Nursery, short_tmp: Path) -> None:
    up = chat_only()
    answer = {"id": "msg_x", "type": "message", "role": "assistant", "model": MODEL,
              "content": [{"type": "text", "text": "native"}], "stop_reason": "end_turn",
              "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    up.on("POST", "/v1/messages", status(200, answer))
    gw = await start(nursery, short_tmp, up, apis="native")
    assert up.requests_to("/v1/messages") == []  # native: never probed
    body = json.dumps(ASK).encode()
    reply = await request(gw.unix, "POST", "/v1/messages", body)
    assert reply.json() == answer
    assert reply.header("x-sluice-translated") is None
    assert up.requests_to("/v1/messages")[0].body == body  # byte for byte
    (entry,) = await log_entries(gw, 1)
    assert entry["translated"] is None


async def test_context_overflow_in_anthropics_words(nursery: trio.Nursery,
                                                    short_tmp: Path) -> None:
    up = FakeUpstream(models=(MODEL,))
    up.on("POST", "/v1/chat/completions", status(400, {"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000,
        "n_ctx": 8192, "message": "the request exceeds the available context size"}}))
    gw = await start(nursery, short_tmp, up, apis="translate")

    def ask() -> Exception:
        with client(gw) as sdk:
            try:
                sdk.messages.create(**ASK)
            except anthropic.BadRequestError as err:
                return err
        raise AssertionError("no error")

    err = await trio.to_thread.run_sync(ask)
    assert isinstance(err, anthropic.BadRequestError)
    assert err.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 9000 tokens > 8192 maximum"}}


async def test_a_cut_stream_ends_with_an_error_event(nursery: trio.Nursery,
                                                     short_tmp: Path) -> None:
    up = FakeUpstream(models=(MODEL,))
    up.on("POST", "/v1/chat/completions", reset_mid_stream(2, TEXT_STREAM))
    gw = await start(nursery, short_tmp, up, apis="translate")
    reply = await request(gw.unix, "POST", "/v1/messages",
                          json.dumps({**ASK, "stream": True}).encode())
    events = reply.body.decode().split("\n\n")
    assert events[-2].startswith("event: error\ndata: ")
    error = json.loads(events[-2].split("data: ", 1)[1])
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert "message_stop" not in reply.body.decode()


@pytest.mark.parametrize("tokenizes", [True, False])
async def test_count_tokens(nursery: trio.Nursery, short_tmp: Path, tokenizes: bool) -> None:
    up = chat_only()
    if tokenizes:
        up.on("POST", "/apply-template", status(200, {"prompt": "<user>Name three</user>"}))
        up.on("POST", "/tokenize", status(200, {"tokens": [1, 2, 3, 4, 5, 6, 7]}))
    gw = await start(nursery, short_tmp, up, apis="translate")
    body = json.dumps({"model": MODEL, "messages": ASK["messages"]}).encode()
    reply = await request(gw.unix, "POST", "/v1/messages/count_tokens", body)
    if tokenizes:
        assert reply.status == 200
        assert reply.json() == {"input_tokens": 7}
        sent = up.requests_to("/apply-template")[0].json()
        assert sent["messages"] == [{"role": "user", "content": "Name three colours."}]
    else:
        assert reply.status == 404
        assert reply.json()["error"]["type"] == "not_found_error"
    assert up.requests_to("/v1/messages/count_tokens") == []

