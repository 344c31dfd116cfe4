"""The official ``openai`` SDK, streaming and not, through the gateway over TCP and over the
Unix socket (the SDK is synchronous here and runs in a worker thread)."""

from __future__ import annotations

from typing import Any

import openai
import trio

from tests.conftest import StartGateway
from tests.fakeupstream import FakeUpstream, json_completion, sse_events, sse_stream


def stream_with_sdk(client: openai.OpenAI) -> dict[str, Any]:
    with client:
        chunks = list(client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True))
        try:
            client.chat.completions.create(model="missing",
                                           messages=[{"role": "user", "content": "x"}])
            missing: Any = None
        except openai.APIStatusError as exc:
            missing = exc
    return {"chunks": chunks, "missing": missing}


async def test_openai_sdk(upstream: FakeUpstream, start_gateway: StartGateway,
                          transport: str) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion("hello there"))
    gw = await start_gateway([("fake", upstream.url)])
    with trio.fail_after(20):
        # Non-streaming first: json_completion ignores "stream", so swap per request.
        result: dict[str, Any] = {}

        def run() -> None:
            client = gw.openai_client(transport)
            with client:
                result["models"] = [m.id for m in client.models.list()]
                result["whole"] = client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "hi"}],
                    temperature=0, max_tokens=8)

        await trio.to_thread.run_sync(run)
        upstream.on("POST", "/v1/chat/completions", sse_stream(sse_events(4)))
        streamed = await trio.to_thread.run_sync(stream_with_sdk, gw.openai_client(transport))
    assert result["models"] == ["fake-model"]
    assert result["whole"].choices[0].message.content == "hello there"
    chunks = streamed["chunks"]
    assert len(chunks) == 4
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text  # the fake's tokens came through in order
    missing = streamed["missing"]
    assert isinstance(missing, openai.APIStatusError)
    assert missing.status_code == 503
    assert missing.body["code"] == "model_not_available"  # type: ignore[index]
