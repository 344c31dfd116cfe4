"""The real client SDKs through sluice to the real llama.cpp server (the demo model), each
compared with the same request sent to llama.cpp directly: the ``anthropic`` SDK (whole and
streamed, over TCP and the Unix socket; its error classes on 401 and 503) and the ``openai``
SDK's Responses API. Greedy sampling (temperature 0) makes the two answers the same text."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
import trio

from proxy.demo import DEMO_MODEL
from tests.client import request
from tests.conftest import RunningGateway
from tests.test_e2e_llama import gguf, llama_gateway, managed  # noqa: F401 (fixtures)

pytest.importorskip("xllamacpp")

PROMPT = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0}  # the anthropic SDK no longer takes it as an argument


def _http(address: str) -> tuple[httpx.Client, str]:
    """An httpx client and base URL for ``unix:/path`` or ``host:port``."""
    if address.startswith("unix:"):
        return httpx.Client(transport=httpx.HTTPTransport(uds=address[5:])), "http://localhost"
    return httpx.Client(), f"http://{address.removeprefix('tcp:')}"


def anthropic_client(address: str, key: str = "unused") -> anthropic.Anthropic:
    """The anthropic SDK (it runs on httpx2, the successor of httpx)."""
    if address.startswith("unix:"):
        http = httpx2.Client(transport=httpx2.HTTPTransport(uds=address[5:]))
        base = "http://localhost"
    else:
        http, base = httpx2.Client(), f"http://{address.removeprefix('tcp:')}"
    return anthropic.Anthropic(base_url=base, api_key=key, http_client=http, max_retries=0)


def openai_client(address: str) -> openai.OpenAI:
    http, base = _http(address)
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", http_client=http,
                         max_retries=0)


def gateway_address(gw: RunningGateway, transport: str) -> str:
    return gw.tcp if transport == "tcp" else gw.unix


def direct_address(gw: RunningGateway) -> str:
    address = managed(gw.gateway)["address"]
    assert isinstance(address, str)
    return address


async def _in_thread(fn: Any) -> Any:
    with trio.fail_after(90):
        return await trio.to_thread.run_sync(fn)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_anthropic_sdk_whole_and_streamed(llama_gateway: RunningGateway,  # noqa: F811
                                                transport: str) -> None:
    def ask(address: str) -> tuple[Any, list[Any], Any]:
        with anthropic_client(address) as client:
            whole = client.messages.create(model=DEMO_MODEL, max_tokens=12, extra_body=GREEDY,
                                           messages=PROMPT)  # type: ignore[arg-type]
            with client.messages.stream(model=DEMO_MODEL, max_tokens=12, extra_body=GREEDY,
                                        messages=PROMPT) as stream:  # type: ignore[arg-type]
                events = list(stream)
                final = stream.get_final_message()
            return whole, events, final

    via = await _in_thread(lambda: ask(gateway_address(llama_gateway, transport)))
    direct_to = direct_address(llama_gateway)
    direct = await _in_thread(lambda: ask(direct_to))
    whole, events, final = via
    assert whole.type == "message"
    assert whole.role == "assistant"
    assert whole.content[0].text == direct[0].content[0].text
    assert whole.content[0].text
    assert whole.usage.output_tokens == direct[0].usage.output_tokens
    assert [e.type for e in events] == [e.type for e in direct[1]]
    assert events[0].type == "message_start"
    assert final.content[0].text == direct[2].content[0].text == whole.content[0].text
    # The request log has the stream's tokens (message_start's input, message_delta's output).
    log = (await request(llama_gateway.unix, "GET", "/api/v1/requests?limit=2")).json()
    streamed = log["requests"][0]
    assert streamed["path"] == "/v1/messages"
    assert streamed["stream"] is True
    assert streamed["usage"]["output_tokens"] == final.usage.output_tokens
    assert "input_tokens" in streamed["usage"]


async def test_anthropic_sdk_error_classes(
        llama_gateway: RunningGateway) -> None:  # noqa: F811
    def unknown_model() -> Exception:
        with anthropic_client(llama_gateway.unix) as client:
            try:
                client.messages.create(model="no-such-model", max_tokens=4,
                                       messages=PROMPT)  # type: ignore[arg-type]
            except anthropic.APIStatusError as exc:
                return exc
        raise AssertionError("no error")

    err = await _in_thread(unknown_model)
    assert isinstance(err, anthropic.InternalServerError)  # 503
    assert err.status_code == 503
    assert err.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "model_not_available" in err.body["error"]["message"]  # type: ignore[index]

    settings = llama_gateway.gateway.settings
    reply = await request(llama_gateway.unix, "PUT", "/api/v1/settings/api",
                          b'{"requireAuth": true}',
                          [("authorization", f"Bearer {settings.secrets.admin_token}")])
    assert reply.status == 200

    def no_key() -> Exception:
        with anthropic_client(llama_gateway.tcp, key="sk-sluice-wrong") as client:
            try:
                client.messages.create(model=DEMO_MODEL, max_tokens=4,
                                       messages=PROMPT)  # type: ignore[arg-type]
            except anthropic.APIStatusError as exc:
                return exc
        raise AssertionError("no error")

    try:
        denied = await _in_thread(no_key)
    finally:
        await request(llama_gateway.unix, "PUT", "/api/v1/settings/api",
                      b'{"requireAuth": false}',
                      [("authorization", f"Bearer {settings.secrets.admin_token}")])
    assert isinstance(denied, anthropic.AuthenticationError)
    assert denied.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_openai_sdk_responses_api(
        llama_gateway: RunningGateway) -> None:  # noqa: F811
    def ask(address: str) -> tuple[Any, list[Any]]:
        with openai_client(address) as client:
            whole = client.responses.create(model=DEMO_MODEL, input="Name three colours.",
                                            temperature=0, max_output_tokens=12)
            events = list(client.responses.create(model=DEMO_MODEL,
                                                  input="Name three colours.",
                                                  temperature=0, max_output_tokens=12,
                                                  stream=True))
            return whole, events

    whole, events = await _in_thread(lambda: ask(llama_gateway.tcp))
    direct_to = direct_address(llama_gateway)
    direct_whole, direct_events = await _in_thread(lambda: ask(direct_to))
    assert whole.output_text == direct_whole.output_text
    assert whole.output_text
    assert [e.type for e in events] == [e.type for e in direct_events]
    assert events[-1].type == "response.completed"
    log = (await request(llama_gateway.unix, "GET", "/api/v1/requests?limit=1")).json()
    assert log["requests"][0]["usage"]["output_tokens"] == \
        events[-1].response.usage.output_tokens
    metrics = (await request(llama_gateway.unix, "GET", "/metrics")).body.decode()
    assert 'sluice_tokens_total{model="smollm2-135m"' in metrics
