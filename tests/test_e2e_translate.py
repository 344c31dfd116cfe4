"""Messages and Responses translated to llama.cpp's own Chat Completions (SPEC §17.1), end to
end with the real demo model behind ``apis: translate``: the ``anthropic`` SDK's and the
``openai`` SDK's whole and streamed answers, the request log's ``translated``, count_tokens
from llama.cpp's
``/apply-template`` + ``/tokenize`` (against llama.cpp's own Messages count), and the
server's real context overflow in Anthropic's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

from protocol.config import ModelConfig
from proxy.demo import DEMO_MODEL
from tests.client import request
from tests.conftest import RunningGateway
from tests.test_e2e_clients import anthropic_client, openai_client
from tests.test_e2e_llama import gguf, managed_gateway  # noqa: F401 (fixture)

pytest.importorskip("xllamacpp")

# greedy (the SDK no longer takes temperature as an argument)
ASK: dict[str, Any] = {"model": DEMO_MODEL, "max_tokens": 16, "extra_body": {"temperature": 0},
                       "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                                  {"type": "text", "text": "You are brief."}],
                       "messages": [{"role": "user", "content": "Name three colours."}]}


async def start(nursery: trio.Nursery, folder: Path, model: Path, apis: str) -> RunningGateway:
    return await managed_gateway(nursery, folder, ModelConfig(
        name=DEMO_MODEL, path=str(model), context=1024, parallel=2, threads=1, preload=True,
        apis=apis))


async def test_the_sdk_through_llama_cpps_chat(nursery: trio.Nursery, short_tmp: Path,
                                               gguf: Path) -> None:  # noqa: F811
    gw = await start(nursery, short_tmp, gguf, "translate")
    listed = (await request(gw.unix, "GET", "/v1/models")).json()["data"]
    assert listed[0]["sluice"]["apis"] == {"messages": "translate", "responses": "translate"}

    def ask() -> tuple[Any, list[str], Any]:
        with anthropic_client(gw.unix) as sdk:
            whole = sdk.messages.create(**ASK)
            with sdk.messages.stream(**ASK) as stream:
                texts = list(stream.text_stream)
                final = stream.get_final_message()
        return whole, texts, final

    with trio.fail_after(120):
        whole, texts, final = await trio.to_thread.run_sync(ask)
    assert whole.type == "message"
    assert whole.model == DEMO_MODEL
    assert whole.content[0].type == "text"
    assert whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0
    assert 0 < whole.usage.output_tokens <= 16
    assert "".join(texts) == whole.content[0].text  # greedy: the same text both ways
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) \
        == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    log = (await request(gw.unix, "GET", "/api/v1/requests?limit=2")).json()["requests"]
    assert [(e["translated"], e["usageEstimated"], e["status"]) for e in log] == [
        ("messages", False, 200)] * 2
    assert log[0]["usage"]["completion_tokens"] == final.usage.output_tokens


async def test_the_responses_api_through_llama_cpps_chat(
        nursery: trio.Nursery, short_tmp: Path, gguf: Path) -> None:  # noqa: F811
    gw = await start(nursery, short_tmp, gguf, "translate")
    ask = {"model": DEMO_MODEL, "input": "Name three colours.", "instructions": "Be brief.",
           "max_output_tokens": 16, "temperature": 0}

    def run() -> tuple[Any, Any]:
        with openai_client(gw.unix) as sdk:
            whole = sdk.responses.create(**ask)
            with sdk.responses.stream(**ask) as stream:
                final = stream.get_final_response()
        return whole, final

    with trio.fail_after(120):
        whole, final = await trio.to_thread.run_sync(run)
    assert whole.output_text
    assert final.output_text == whole.output_text  # greedy: the same text both ways
    assert whole.status in ("completed", "incomplete")
    assert whole.usage is not None
    assert 0 < whole.usage.output_tokens <= 16
    log = (await request(gw.unix, "GET", "/api/v1/requests?limit=2")).json()["requests"]
    assert [(e["path"], e["translated"], e["status"]) for e in log] == [
        ("/v1/responses", "responses", 200)] * 2


async def test_count_tokens_and_the_context_overflow(nursery: trio.Nursery, short_tmp: Path,
                                                     gguf: Path) -> None:  # noqa: F811
    native = await start(nursery, short_tmp / "n", gguf, "native")
    translated = await start(nursery, short_tmp / "t", gguf, "translate")
    count = {"model": DEMO_MODEL, "messages": ASK["messages"]}

    def counts() -> tuple[int, int]:
        with anthropic_client(native.unix) as a, anthropic_client(translated.unix) as b:
            return (a.messages.count_tokens(**count).input_tokens,
                    b.messages.count_tokens(**count).input_tokens)

    with trio.fail_after(60):
        theirs, ours = await trio.to_thread.run_sync(counts)
    assert theirs > 0
    assert abs(ours - theirs) <= 1  # llama.cpp's own count, give or take its BOS token

    huge = {**ASK, "messages": [{"role": "user", "content": "colour " * 3000}]}

    def overflow() -> anthropic.BadRequestError:
        with anthropic_client(translated.unix) as sdk:
            try:
                sdk.messages.create(**huge)
            except anthropic.BadRequestError as err:
                return err
        raise AssertionError("a prompt over the context was answered")

    with trio.fail_after(60):
        err = await trio.to_thread.run_sync(overflow)
    message = err.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("prompt is too long: ")
    assert message.endswith(" maximum")
