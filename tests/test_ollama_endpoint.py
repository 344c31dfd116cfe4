"""The Ollama endpoints of a gateway (proxy/ollama.py) against a fake model server: a
stream translated line by line as it arrives, a stream cut midway (one error line, no last
chunk), a model server's error answer in Ollama's shape, the whole answer, and every listener
answering them."""

from __future__ import annotations

import json

from tests.client import CHAT, Client, connect, request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    reset_mid_stream,
    sse_events,
    sse_stream,
)

BODY = json.dumps({"model": "fake-model",
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def lines(body: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in body.split(b"\n") if line]


async def test_a_stream_is_translated_line_by_line(start_gateway: StartGateway,
                                                   upstream: FakeUpstream) -> None:
    upstream.on("POST", CHAT, sse_stream(sse_events(4), gap=0.05))
    gw = await start_gateway([("llama", upstream.url)])
    reply = await request(gw.unix, "POST", "/api/chat", BODY)
    assert reply.status == 200
    assert reply.header("content-type") == "application/x-ndjson"
    got = lines(reply.body)
    assert [g["message"]["content"] for g in got[:-1]] == ["tok1 ", "tok2 "]  # type: ignore[index]
    assert got[-1]["done"] is True
    assert got[-1]["done_reason"] == "stop"
    sent = json.loads(upstream.requests_to(CHAT)[-1].body)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


async def test_a_cut_stream_ends_with_one_error_line(start_gateway: StartGateway,
                                                     upstream: FakeUpstream) -> None:
    upstream.on("POST", CHAT, reset_mid_stream(3))
    gw = await start_gateway([("llama", upstream.url)], failover=False)
    stream = await connect(gw.unix)
    client = Client(stream)
    await client.send_request("POST", "/api/chat", BODY)
    head = await client.read_head()
    assert head.status_code == 200
    body = b""
    try:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            body += data
    finally:
        await client.aclose()
    assert not body.endswith(b"0\r\n\r\n")  # no last chunk: the answer is incomplete
    assert b'{"error":' in body
    assert b'"done":true' not in body


async def test_a_model_servers_error_in_ollamas_shape(start_gateway: StartGateway,
                                                      upstream: FakeUpstream) -> None:
    async def refuse(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(400, {"error": {"code": 400, "message": "the prompt is too long",
                                     "type": "exceed_context_size_error"}})

    upstream.on("POST", CHAT, refuse)
    gw = await start_gateway([("llama", upstream.url)])
    reply = await request(gw.unix, "POST", "/api/chat", BODY)
    assert reply.status == 400
    assert reply.json() == {"error": "the prompt is too long"}


async def test_a_whole_answer(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    upstream.on("POST", CHAT, json_completion("hello"))
    gw = await start_gateway([("llama", upstream.url)])
    body = json.dumps({"model": "fake-model", "stream": False,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    for address in (gw.unix, gw.tcp):
        reply = await request(address, "POST", "/api/chat", body)
        assert reply.status == 200
        doc = reply.json()
        assert doc["message"] == {"role": "assistant", "content": "hello"}
        assert doc["done"] is True
        assert doc["prompt_eval_count"] == 5
        assert doc["eval_count"] == 1
    assert (await request(gw.unix, "GET", "/api/tags")).json()["models"][0]["name"] == \
        "fake-model"
    missing = await request(gw.unix, "POST", "/api/show", b'{"model": "nope"}')
    assert missing.status == 404
    assert missing.json() == {"error": "model 'nope' not found"}
