"""The relay through real listeners: bytes in equal bytes out, headers, routing, errors."""

from __future__ import annotations

import json

import trio

from tests.client import HEALTH, Client, chat_body, request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
    sse_stream,
    status,
)
from tests.rawhttp import Raw


async def test_non_streaming_chat_is_relayed_unchanged(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str
) -> None:
    body = b'{"id":"x","object":"chat.completion","choices":[{"message":{"content":"h\xc3\xa9"}}]}'

    async def answer(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.send_raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"X-Custom: yes\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{len(body[:10]):x}".encode() + b"\r\n" + body[:10] + b"\r\n"
                         + f"{len(body[10:]):x}".encode() + b"\r\n" + body[10:] + b"\r\n0\r\n\r\n")

    upstream.on("POST", "/v1/chat/completions", answer)
    gw = await start_gateway([("fake", upstream.url)])
    sent = chat_body(temperature=0)
    reply = await request(gw.address(transport), "POST", "/v1/chat/completions", sent,
                          headers=[("authorization", "Bearer client-secret"),
                                   ("content-type", "application/json"),
                                   ("connection", "keep-alive, x-drop-me"),
                                   ("x-drop-me", "1"), ("x-keep-me", "2")])
    assert reply.status == 200
    assert reply.body == body
    assert reply.header("content-length") == str(len(body))
    assert reply.header("x-custom") == "yes"
    assert reply.header("keep-alive") is None
    assert reply.header("x-sluice-served-by") == "local:fake"
    seen = upstream.requests_to("/v1/chat/completions")[-1]
    assert seen.body == sent  # forwarded byte for byte
    assert seen.header("authorization") is None  # the client's credentials stay here
    assert seen.header("x-drop-me") is None  # listed in Connection: hop-by-hop
    assert seen.header("x-keep-me") == "2"
    assert seen.header("host") == upstream.url.removeprefix("http://") if \
        upstream.url.startswith("http") else seen.header("host") == "localhost"


async def test_stream_is_relayed_chunk_by_chunk(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str
) -> None:
    events = sse_events(5)
    upstream.on("POST", "/v1/chat/completions", sse_stream(events, gap=0.02))
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.address(transport), "POST", "/v1/chat/completions",
                          chat_body(stream=True))
    assert reply.status == 200
    assert reply.complete
    assert reply.body == b"".join(events)
    assert reply.reads == events  # one upstream chunk, one client read: no coalescing
    assert reply.header("content-type") == "text/event-stream"
    assert reply.header("x-sluice-served-by") == "local:fake"


async def test_unix_socket_backend(unix_upstream: FakeUpstream,
                                   start_gateway: StartGateway) -> None:
    events = sse_events(3)
    unix_upstream.on("POST", "/v1/chat/completions", sse_stream(events))
    gw = await start_gateway([("sock", unix_upstream.url)])
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body(stream=True))
    assert reply.body == b"".join(events)
    assert reply.header("x-sluice-served-by") == "local:sock"


async def test_keep_alive_and_pipelining(upstream: FakeUpstream,
                                         start_gateway: StartGateway, transport: str) -> None:
    upstream.on("POST", "/v1/chat/completions", sse_stream(sse_events(2)))
    gw = await start_gateway([("fake", upstream.url)])
    client = await Client.open(gw.address(transport))
    try:
        # Two requests written back to back before reading anything: answered in order.
        await client.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
        await client.stream.send_all(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = await client.read_reply()
        await client.send_request("GET", "/v1/models")  # h11 needs our side to advance
        second = await client.read_reply()
        assert first.body == b"".join(sse_events(2))
        assert second.json() == HEALTH
    finally:
        await client.aclose()


async def test_pipelined_requests_with_bodies_in_one_write(
        upstream: FakeUpstream, start_gateway: StartGateway, transport: str) -> None:
    """Requests whose bodies came with their heads (read past h11): three in one write,
    then a GET; each body exactly its own, the replies in order on the one connection."""
    upstream.on("POST", "/v1/chat/completions", json_completion("ok"))
    gw = await start_gateway([("fake", upstream.url)])
    sizes = (0, 1, 5000)
    bodies = [chat_body(messages=[{"role": "user", "content": "x" * n}]) for n in sizes]
    wire = b"".join(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(body), body) for body in bodies)
    raw = await Raw.open(gw.address(transport))
    try:
        await raw.send(wire + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        replies = [await raw.response() for _ in range(4)]
    finally:
        await raw.aclose()
    assert [r.status for r in replies] == [200, 200, 200, 200]
    assert json.loads(replies[3].body) == HEALTH
    got = [json.loads(r.body)["messages"][0]["content"]
           for r in upstream.requests_to("/v1/chat/completions")]
    assert got == ["x" * n for n in sizes]


async def test_model_lists_merge_backends(nursery: trio.Nursery,
                                          start_gateway: StartGateway) -> None:
    a = FakeUpstream(models=["m1", "shared"])
    b = FakeUpstream(models=["shared", "m2"])
    await nursery.start(a.serve)
    await nursery.start(b.serve)
    gw = await start_gateway([("a", a.url), ("b", b.url)])
    for path in ("/v1/models", "/api/v1/inference/models"):
        reply = await request(gw.tcp, "GET", path)
        assert reply.status == 200
        doc = reply.json()
        assert doc["object"] == "list"
        assert [(m["id"], m["owned_by"]) for m in doc["data"]] == [
            ("m1", "llamacpp"), ("shared", "llamacpp"), ("m2", "llamacpp")]
    one = await request(gw.tcp, "GET", "/v1/models/m2")
    assert one.json()["id"] == "m2"
    missing = await request(gw.tcp, "GET", "/v1/models/nope")
    assert missing.status == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    # Routing follows the model: each backend gets the requests for its own models.
    a.on("POST", "/v1/chat/completions", status(200, {"from": "a"}))
    b.on("POST", "/v1/chat/completions", status(200, {"from": "b"}))
    for model, origin in (("m1", "a"), ("m2", "b"), ("shared", "a")):
        reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body(model))
        assert reply.json() == {"from": origin}
        assert reply.header("x-sluice-served-by") == f"local:{origin}"


async def test_unknown_model_is_503(upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body("nope"))
    assert reply.status == 503
    err = reply.json()["error"]
    assert err["code"] == "model_not_available"
    assert set(err) == {"message", "type", "code", "param"}


async def test_upstream_errors_are_relayed_as_is(upstream: FakeUpstream,
                                                 start_gateway: StartGateway) -> None:
    upstream.on("POST", "/v1/chat/completions",
                status(400, {"error": {"code": 400, "message": "too long",
                                       "type": "exceed_context_size_error"}}))
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body(stream=True))
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "exceed_context_size_error"
    upstream.on("POST", "/v1/chat/completions", status(503, {"error": {"message": "busy"}}))
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body())
    assert reply.status == 503
    assert reply.json() == {"error": {"message": "busy"}}


async def test_bad_requests(upstream: FakeUpstream, start_gateway: StartGateway,
                            transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)], max_body_size=1024)
    addr = gw.address(transport)
    cases = [
        (b"", 400, "missing_model"),
        (b"{not json", 400, "invalid_json"),
        (b"[1,2]", 400, "invalid_json"),
        (b'{"messages":[]}', 400, "missing_model"),
        (b'{"model":5}', 400, "invalid_model"),
        (b'{"model":"fake-model","stream":"yes"}', 400, "invalid_stream"),
        (json.dumps({"model": "fake-model", "pad": "x" * 2000}).encode(), 413,
         "request_too_large"),
    ]
    for body, code, err_code in cases:
        reply = await request(addr, "POST", "/v1/chat/completions", body)
        assert reply.status == code, body
        assert reply.json()["error"]["code"] == err_code
    assert upstream.requests_to("/v1/chat/completions") == []
    reply = await request(addr, "GET", "/nope")
    assert reply.status == 404
    reply = await request(addr, "GET", "/v1/chat/completions")
    assert reply.status == 405
    assert reply.header("allow") == "POST"
    reply = await request(addr, "POST", "/health", b"{}")
    assert reply.status == 405
    assert reply.header("allow") == "GET"
