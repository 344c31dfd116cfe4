"""Anthropic Messages and the OpenAI Responses API as first-class paths (SPEC §12): the
family decided once from the path, sluice's own errors in each family's shape (whole answers
and the event that ends a cut stream), x-api-key as an access key (never forwarded), the
anthropic-* headers forwarded, a model server's own error relayed as it came, and the usage
of each stream grammar found without touching the relayed bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import Family, SluiceError, family_of, model_not_available
from protocol.request_record import stream_usage, token_counts
from protocol.sse import SseObserver, error_event
from tests.client import request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    reset_mid_stream,
    sse_stream,
)

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"


def anthropic_stream(text: str = "Hello there", model: str = "m") -> list[bytes]:
    """Anthropic Messages stream events as llama.cpp and Anthropic write them."""
    def event(name: str, data: dict[str, object]) -> bytes:
        return (f"event: {name}\ndata: ".encode()
                + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")

    words = text.split(" ")
    return [
        event("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 0}}}),
        event("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
        *(event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": w + " "}})
          for w in words),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": len(words)}}),
        event("message_stop", {"type": "message_stop"}),
    ]


def responses_stream(model: str = "m") -> list[bytes]:
    def event(name: str, data: dict[str, object]) -> bytes:
        return (f"event: {name}\ndata: ".encode()
                + json.dumps({"type": name, **data}, separators=(",", ":")).encode()
                + b"\n\n")

    return [
        event("response.created", {"response": {"id": "r1", "status": "in_progress",
                                                "model": model, "usage": None}}),
        event("response.output_text.delta", {"delta": "Hi"}),
        event("response.output_text.delta", {"delta": " there"}),
        event("response.completed", {"response": {
            "id": "r1", "status": "completed", "model": model,
            "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11}}}),
    ]


# ------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(("path", "family"), [
    ("/v1/chat/completions", Family.OPENAI), ("/v1/completions", Family.OPENAI),
    ("/v1/embeddings", Family.OPENAI), ("/v1/models", Family.OPENAI),
    ("/v1/messages", Family.ANTHROPIC), ("/v1/messages/count_tokens", Family.ANTHROPIC),
    ("/v1/responses", Family.RESPONSES), ("/v1/responses/input_tokens", Family.RESPONSES),
    ("/api/chat", Family.OLLAMA), ("/api/tags", Family.OLLAMA),
    ("/api/v1/settings/api", Family.OPENAI), ("/health", Family.OPENAI),
    ("/metrics", Family.OPENAI), ("/", Family.OPENAI),
])
def test_the_family_of_a_path(path: str, family: Family) -> None:
    assert family_of(path) is family


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
    (503, "overloaded_error"), (500, "api_error"), (502, "api_error"), (504, "api_error"),
    (422, "invalid_request_error"),
])
def test_error_bodies_in_each_family(status: int, kind: str) -> None:
    err = SluiceError(status, "it went wrong", type="server_error", code="some_code",
                      param="model")
    openai = {"error": {"message": "it went wrong", "type": "server_error",
                        "code": "some_code", "param": "model"}}
    assert json.loads(err.body()) == openai
    assert json.loads(err.body(Family.RESPONSES)) == openai
    assert json.loads(err.body(Family.ANTHROPIC)) == {
        "type": "error", "error": {"type": kind, "message": "it went wrong (some_code)"}}
    assert json.loads(err.body(Family.OLLAMA)) == {"error": "it went wrong"}


def _event(data: bytes) -> tuple[str | None, dict[str, object]]:
    assert data.endswith(b"\n\n")
    name = None
    payload = None
    for line in data.strip(b"\n").split(b"\n"):
        if line.startswith(b"event: "):
            name = line[7:].decode()
        else:
            assert line.startswith(b"data: ")
            payload = json.loads(line[6:])
    assert isinstance(payload, dict)
    return name, payload


def test_the_event_that_ends_a_cut_stream_in_each_family() -> None:
    err = model_not_available("m")
    assert _event(error_event(err, True)) == (None, {"error": err.to_dict()})
    name, payload = _event(error_event(err, True, Family.ANTHROPIC))
    assert name == "error"
    assert payload == {"type": "error", "error": {
        "type": "overloaded_error", "message": f"{err.message} (model_not_available)"}}
    name, payload = _event(error_event(err, True, Family.RESPONSES))
    assert name == "error"
    assert payload == {"type": "error", "code": "model_not_available",
                       "message": err.message, "param": err.param}
    assert error_event(err, False, Family.ANTHROPIC).startswith(b"\n\nevent: error\n")


def _observe(stream: bytes, cuts: list[int]) -> SseObserver:
    observer = SseObserver()
    at = 0
    for cut in sorted(set(cuts)):
        observer.see(stream[at:cut])
        at = cut
    observer.see(stream[at:])
    return observer


@given(st.lists(st.integers(0, 2000), max_size=12))
def test_anthropic_usage_is_message_start_merged_with_message_delta(cuts: list[int]) -> None:
    stream = b"".join(anthropic_stream("one two three four"))
    observer = _observe(stream, [c % (len(stream) + 1) for c in cuts])
    usage = stream_usage(observer.first_usage_line, observer.usage_line)
    assert usage == {"input_tokens": 12, "output_tokens": 4}
    assert token_counts(usage) == (12, 4)


@given(st.lists(st.integers(0, 2000), max_size=12))
def test_responses_usage_is_that_of_response_completed(cuts: list[int]) -> None:
    stream = b"".join(responses_stream())
    observer = _observe(stream, [c % (len(stream) + 1) for c in cuts])
    usage = stream_usage(observer.first_usage_line, observer.usage_line)
    assert usage == {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11}


def test_anthropic_cached_input_counts_as_prompt_tokens() -> None:
    usage = {"cache_read_input_tokens": 30, "input_tokens": 1, "output_tokens": 3}
    assert token_counts(usage) == (31, 3)
    assert token_counts({"input_tokens": 31, "output_tokens": 3, "total_tokens": 34,
                         "input_tokens_details": {"cached_tokens": 30}}) == (31, 3)


def test_chat_usage_is_the_last_chunks() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
    last = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    observer = _observe(chunk * 3 + last + b"data: [DONE]\n\n", [])
    usage = stream_usage(observer.first_usage_line, observer.usage_line)
    assert usage == {"prompt_tokens": 3, "completion_tokens": 1}


# ------------------------------------------------------------------------- through a gateway


async def test_our_errors_before_the_answer_in_each_family(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    body = b'{"model": "nowhere", "max_tokens": 8, "messages": []}'
    anthropic = await request(gw.unix, "POST", MESSAGES, body)
    assert anthropic.status == 503
    assert anthropic.json() == {"type": "error", "error": {
        "type": "overloaded_error", "message": anthropic.json()["error"]["message"]}}
    assert anthropic.json()["error"]["message"].endswith("(model_not_available)")
    assert "nowhere" in anthropic.json()["error"]["message"]
    bad = await request(gw.unix, "POST", MESSAGES, b"{not json")
    assert bad.status == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    for bad_body, code in ((b'{"max_tokens": 8, "messages": []}', "missing_model"),
                           (b'{"model": "m", "messages": "hi"}', "invalid_messages"),
                           (b'{"model": "claude-x", "stream": "yes"}', "invalid_stream")):
        refused = await request(gw.unix, "POST", MESSAGES, bad_body)
        assert refused.status == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert refused.json()["error"]["message"].endswith(f"({code})")
        openai_shaped = await request(gw.unix, "POST", "/v1/chat/completions", bad_body)
        assert openai_shaped.json()["error"]["code"] == code
    responses = await request(gw.unix, "POST", RESPONSES, body)
    assert responses.status == 503
    assert responses.json()["error"]["code"] == "model_not_available"
    chat = await request(gw.unix, "POST", "/v1/chat/completions", body)
    assert chat.json()["error"]["code"] == "model_not_available"  # unchanged
    # The connection stays usable after each: three on one keep-alive connection.
    assert (await request(gw.unix, "GET", "/health")).status == 200


async def test_a_model_servers_own_error_is_relayed_as_it_came(
        start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    own = b'{"error":{"code":400,"message":"too long","type":"exceed_context_size_error"}}'

    async def refuse(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(400, json.loads(own))

    upstream.on("POST", MESSAGES, refuse)
    gw = await start_gateway([("llama", upstream.url)])
    reply = await request(gw.unix, "POST", MESSAGES, b'{"model": "fake-model", "messages": []}')
    assert reply.status == 400
    assert reply.body == own


@pytest.mark.parametrize(("path", "events", "family"), [
    (MESSAGES, anthropic_stream(), Family.ANTHROPIC),
    (RESPONSES, responses_stream(), Family.RESPONSES),
])
async def test_a_cut_stream_ends_with_the_familys_error_event(
        start_gateway: StartGateway, upstream: FakeUpstream, path: str, events: list[bytes],
        family: Family) -> None:
    upstream.on("POST", path, reset_mid_stream(2, events))
    gw = await start_gateway([("llama", upstream.url)], failover=False)
    reply = await request(gw.unix, "POST", path, b'{"model": "fake-model", "stream": true}')
    assert reply.status == 200
    assert reply.body.startswith(events[0] + events[1])
    name, payload = _event(reply.body[len(events[0] + events[1]):])
    assert name == "error"
    assert payload["type"] == "error"
    if family is Family.ANTHROPIC:
        assert payload["error"]["type"] == "api_error"  # type: ignore[index]
    else:
        assert payload["code"] in ("upstream_unreachable", "upstream_protocol_error")


async def test_usage_of_each_grammar_reaches_the_request_log(
        start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    upstream.on("POST", MESSAGES, sse_stream(anthropic_stream("a b c"),
                                             chunked_groups=[[0, 1], [2, 3, 4], [5, 6, 7]]))
    upstream.on("POST", RESPONSES, sse_stream(responses_stream()))
    gw = await start_gateway([("llama", upstream.url)])
    for path in (MESSAGES, RESPONSES):
        reply = await request(gw.unix, "POST", path, b'{"model": "fake-model", "stream": true}')
        assert reply.status == 200
        assert reply.body == b"".join(anthropic_stream("a b c") if path == MESSAGES
                                      else responses_stream())
    log = (await request(gw.unix, "GET", "/api/v1/requests")).json()["requests"]
    usage = {r["path"]: r["usage"] for r in log}
    assert usage[MESSAGES] == {"input_tokens": 12, "output_tokens": 3}
    assert usage[RESPONSES] == {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11}
    metrics = (await request(gw.unix, "GET", "/metrics")).body.decode()
    assert 'type="prompt"} 21' in metrics
    assert 'type="completion"} 5' in metrics


async def test_x_api_key_is_an_access_key_and_never_forwarded(
        start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    upstream.on("POST", MESSAGES, sse_stream(anthropic_stream()))
    gw = await start_gateway([("llama", upstream.url)], require_auth=True)
    admin = gw.gateway.settings.secrets.admin_token
    made = await request(gw.unix, "POST", "/api/v1/access-keys", b'{"name": "claude"}',
                         [("authorization", f"Bearer {admin}")])
    key = made.json()["key"]
    body = b'{"model": "fake-model", "stream": true, "messages": []}'
    headers = [("anthropic-version", "2023-06-01"),
               ("anthropic-beta", "tools-2024-04-04"), ("content-type", "application/json")]
    missing = await request(gw.tcp, "POST", MESSAGES, body, headers)
    assert missing.status == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    wrong = await request(gw.tcp, "POST", MESSAGES, body, [*headers, ("x-api-key", "nope")])
    assert wrong.status == 401
    assert wrong.json()["type"] == "error"
    good = await request(gw.tcp, "POST", MESSAGES, body, [*headers, ("x-api-key", key)])
    assert good.status == 200, good.body
    sent = dict(upstream.requests_to(MESSAGES)[-1].headers)
    assert b"x-api-key" not in sent
    assert b"authorization" not in sent
    assert sent[b"anthropic-version"] == b"2023-06-01"
    assert sent[b"anthropic-beta"] == b"tools-2024-04-04"
    keys = (await request(gw.unix, "GET", "/api/v1/access-keys", None,
                          [("authorization", f"Bearer {admin}")])).json()
    assert keys[0]["lastUsedAt"] is not None


def test_every_family_event_is_framed_on_a_boundary() -> None:
    err = model_not_available("m")
    for family in Family:
        assert error_event(err, False, family).startswith(b"\n\n")
        assert not error_event(err, True, family).startswith(b"\n")

