"""The Responses API translated to Chat Completions through a whole gateway (SPEC §17.1),
against the fake chat-only model server of tests/test_translate_gateway.py: the real
``openai`` SDK's whole and streamed answers, a streamed tool call, the request log, the
context overflow as ``context_length_exceeded`` and ``input_tokens``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import trio

from tests.client import request
from tests.conftest import RunningGateway
from tests.fakeupstream import FakeUpstream, status
from tests.test_translate_gateway import MODEL, TOOL_STREAM, chat_only, log_entries, start


def client(gw: RunningGateway) -> openai.OpenAI:
    http = httpx.Client(transport=httpx.HTTPTransport(uds=gw.gateway.ctx.socket_path))
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", http_client=http,
                         max_retries=0)


async def test_the_sdk_gets_translated_responses(nursery: trio.Nursery,
                                                 short_tmp: Path) -> None:
    up = chat_only()
    gw = await start(nursery, short_tmp, up)
    assert gw.gateway.backends.backends[0].apis.responses == "translate"

    def ask() -> tuple[Any, list[str], Any]:
        with client(gw) as sdk:
            whole = sdk.responses.create(model=MODEL, input="Name three colours.",
                                         instructions="Be brief.")
            kinds = []
            with sdk.responses.stream(model=MODEL, input="Name three colours.") as stream:
                for event in stream:
                    kinds.append(event.type)
                final = stream.get_final_response()
        return whole, kinds, final

    whole, kinds, final = await trio.to_thread.run_sync(ask)
    assert whole.output_text == "Red, green, blue."
    assert whole.model == MODEL
    assert final.output_text == "Red, green, blue."
    assert final.status == "completed"
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 3)
    sent = [r.json() for r in up.requests_to("/v1/chat/completions")]
    assert sent[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    entries = await log_entries(gw, 2)
    assert [(e["path"], e["translated"]) for e in entries] == [("/v1/responses",
                                                                "responses")] * 2


async def test_a_streamed_tool_call(nursery: trio.Nursery, short_tmp: Path) -> None:
    gw = await start(nursery, short_tmp, chat_only(TOOL_STREAM), apis="translate")
    tools = [{"type": "function", "name": "read_file", "description": "Read a file",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]

    def ask() -> Any:
        with client(gw) as sdk, sdk.responses.stream(model=MODEL, input="read a.txt",
                                                     tools=tools) as stream:  # type: ignore[arg-type]
            return stream.get_final_response()

    final = await trio.to_thread.run_sync(ask)
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, c.call_id, json.loads(c.arguments)) for c in calls] == [
        ("read_file", "call_1", {"path": "a.txt"})]


async def test_overflow_and_input_tokens(nursery: trio.Nursery, short_tmp: Path) -> None:
    up = FakeUpstream(models=(MODEL,))
    up.on("POST", "/v1/chat/completions", status(400, {"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000,
        "n_ctx": 8192, "message": "the request exceeds the available context size"}}))
    up.on("POST", "/apply-template", status(200, {"prompt": "<user>hi</user>"}))
    up.on("POST", "/tokenize", status(200, {"tokens": [1, 2, 3]}))
    gw = await start(nursery, short_tmp, up, apis="translate")
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()
    reply = await request(gw.unix, "POST", "/v1/responses", body)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    counted = await request(gw.unix, "POST", "/v1/responses/input_tokens", body)
    assert counted.status == 200
    assert counted.json()["input_tokens"] == 3


def test_plain_texts_give_the_same_events_as_chunks() -> None:
    """The Responses stream's fast path (``plain``, used by the relay's writer for chunks of
    text alone) makes the events ``feed`` makes of the same chunks."""
    from protocol.translate.responses_stream import Stream

    def chunk(field: str, text: str) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {field: text}, "finish_reason": None}]}

    def events(data: bytes) -> list[dict[str, Any]]:
        out = []
        for block in data.decode().split("\n\n")[:-1]:
            doc = json.loads(block.split("data: ", 1)[1])
            doc.pop("item_id", None)
            if "item" in doc:
                doc["item"].pop("id", None)
            out.append(doc)
        return out

    by_chunk, by_plain = Stream("m"), Stream("m")
    slow = by_chunk.start() + b"".join(by_chunk.feed(chunk("reasoning_content", t))
                                       for t in ("hm", "m"))
    slow += b"".join(by_chunk.feed(chunk("content", t)) for t in ("Hel", "lo", "", " w\u00f6"))
    slow += by_chunk.finish()
    fast = by_plain.start() + by_plain.plain([b"hm", b"m"], True)
    fast += by_plain.plain([b"Hel", b"lo", b"", " w\u00f6".encode()], False) + by_plain.finish()
    assert events(fast)[2:-1] == events(slow)[2:-1]
