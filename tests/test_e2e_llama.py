"""End to end with the real demo model: SmolLM2-135M on llama.cpp (xllamacpp), supervised by
the gateway. The GGUF is fetched once into .cache/ (or $SLUICE_TEST_CACHE) and reused."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from protocol.config import ModelConfig
from proxy.demo import DEMO_MODEL
from proxy.server import Gateway
from tests.client import CHAT, Client, chat_body, read_events, request
from tests.conftest import RunningGateway, gateway_config, open_settings
from tests.workers import demo_model

pytest.importorskip("xllamacpp")

PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="session")
def gguf() -> Path:
    return demo_model()


@pytest.fixture
async def llama_gateway(nursery: trio.Nursery, short_tmp: Path, gguf: Path,
                        request: pytest.FixtureRequest) -> RunningGateway:
    parallel = getattr(request, "param", 2)
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(name=DEMO_MODEL, path=str(gguf), context=1024,
                                                parallel=parallel, threads=1, preload=True),))
    gateway = Gateway(open_settings(short_tmp / "data", cfg))
    await nursery.start(gateway.run)
    with trio.fail_after(120):
        await wait_running(gateway, restarts=0)
    return RunningGateway(gateway)


def managed(gateway: Gateway) -> dict[str, Any]:
    assert gateway.ctx.ondemand is not None
    return gateway.ctx.ondemand.status()[0]


async def wait_running(gateway: Gateway, restarts: int) -> dict[str, Any]:
    assert gateway.ctx.ondemand is not None
    model = next(iter(gateway.ctx.ondemand.lifecycle.models.values()))
    while True:
        changed = model.changed  # set at its next change of state
        status = managed(gateway)
        if status["state"] == "loaded" and status["restarts"] == restarts:
            return status
        await changed.wait()


async def managed_gateway(nursery: trio.Nursery, folder: Path, model: ModelConfig,
                          **changes: Any) -> RunningGateway:
    """An in-process gateway in ``folder`` whose one ``models:`` entry is ``model`` (more
    config ``changes`` beside it), once that model's server runs."""
    cfg = gateway_config([], socket_dir=folder / "s")
    cfg = attrs.evolve(cfg, models=(model,), **changes)
    gateway = Gateway(open_settings(folder / "data", cfg))
    await nursery.start(gateway.run)
    with trio.fail_after(120):
        await wait_running(gateway, restarts=0)
    return RunningGateway(gateway)


async def test_chat_with_the_openai_sdk(llama_gateway: RunningGateway, transport: str) -> None:
    def chat() -> tuple[Any, list[Any]]:
        with llama_gateway.openai_client(transport) as client:
            whole = client.chat.completions.create(model=DEMO_MODEL, messages=PROMPT,
                                                   temperature=0, max_tokens=12)
            chunks = list(client.chat.completions.create(
                model=DEMO_MODEL, messages=PROMPT, temperature=0, max_tokens=12, stream=True,
                stream_options={"include_usage": True}))
            return whole, chunks

    with trio.fail_after(60):
        whole, chunks = await trio.to_thread.run_sync(chat)
    assert whole.object == "chat.completion"
    assert whole.model == DEMO_MODEL
    assert isinstance(whole.choices[0].message.content, str)
    assert whole.choices[0].message.content
    assert whole.usage is not None
    assert whole.usage.completion_tokens <= 12
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    assert chunks[-1].choices == []  # the usage chunk
    assert chunks[-1].usage is not None
    # The request log read both usages from the bytes it relayed (SPEC §9.1).
    log = (await request(llama_gateway.unix, "GET", "/api/v1/requests?limit=2")).json()
    streamed, answered = log["requests"]
    assert (answered["stream"], streamed["stream"]) == (False, True)
    assert answered["usage"]["completion_tokens"] == whole.usage.completion_tokens
    assert answered["usage"]["prompt_tokens"] == whole.usage.prompt_tokens
    assert streamed["usage"]["completion_tokens"] == chunks[-1].usage.completion_tokens
    assert streamed["events"] == len(chunks) + 1  # and data: [DONE]
    for entry in (answered, streamed):
        assert entry["servedBy"] == f"local:{DEMO_MODEL}"
        assert entry["outcome"] == "success"
        assert entry["status"] == 200
        assert entry["transport"] == transport
        assert 0 < entry["ttfbMs"] <= entry["durationMs"]


async def test_only_the_configured_id_is_served(llama_gateway: RunningGateway) -> None:
    models = (await request(llama_gateway.tcp, "GET", "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [DEMO_MODEL]
    # llama.cpp itself would answer any model id; the gateway routes only its own name.
    reply = await request(llama_gateway.tcp, "POST", CHAT, chat_body("gpt-4o"))
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "model_not_available"


def normalise(body: bytes) -> bytes:
    """Mask what differs between two runs of the same greedy request: ids, clocks, timings."""
    body = re.sub(rb'"id":"chatcmpl-[^"]*"', b'"id":"X"', body)
    body = re.sub(rb'"created":\d+', b'"created":0', body)
    return re.sub(rb'"timings":\{[^}]*\}', b'"timings":{}', body)


async def test_relayed_stream_equals_the_direct_one(llama_gateway: RunningGateway) -> None:
    body = json.dumps({"model": DEMO_MODEL, "messages": PROMPT, "stream": True,
                       "temperature": 0, "max_tokens": 24, "cache_prompt": False}).encode()
    direct_address = managed(llama_gateway.gateway)["address"]
    assert direct_address.startswith("unix:")
    with trio.fail_after(60):
        direct = await request(direct_address, "POST", CHAT, body)
        relayed = await request(llama_gateway.unix, "POST", CHAT, body)
    assert direct.status == relayed.status == 200
    assert relayed.complete
    assert relayed.header("x-sluice-served-by") == f"local:{DEMO_MODEL}"
    assert relayed.body.endswith(b"data: [DONE]\n\n")
    assert normalise(relayed.body) == normalise(direct.body)
    assert relayed.body.count(b"\n\n") == direct.body.count(b"\n\n") > 3


@pytest.mark.parametrize("llama_gateway", [1], indirect=True)
async def test_client_disconnect_frees_the_slot(llama_gateway: RunningGateway) -> None:
    long = json.dumps({"model": DEMO_MODEL, "messages": PROMPT, "stream": True,
                       "max_tokens": 900, "ignore_eos": True}).encode()
    client = await Client.open(llama_gateway.tcp)
    await client.send_request("POST", CHAT, long)
    with trio.fail_after(30):
        await client.read_head()
        await read_events(client, 4)
    await client.aclose()
    direct = managed(llama_gateway.gateway)["address"]
    with trio.fail_after(10):  # the single slot goes idle, long before 900 tokens are out
        while any(slot["is_processing"]
                  for slot in (await request(direct, "GET", "/slots")).json()):
            await trio.sleep(0.05)
    with trio.fail_after(60):  # and the next request is served
        reply = await request(llama_gateway.tcp, "POST", CHAT,
                              chat_body(DEMO_MODEL, max_tokens=8, temperature=0))
    assert reply.status == 200
    assert reply.json()["usage"]["completion_tokens"] <= 8


async def test_a_killed_model_server_is_loaded_again_by_the_next_request(
        llama_gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import model_state

    # A back-off no busy machine outlasts before the refusal below; ended by hand after it
    # (its 10 s are tests/test_lifecycle.py's, on trio's MockClock), not waited out.
    monkeypatch.setattr(model_state, "RETRY_AFTER_FAILURE", 600.0)
    before = managed(llama_gateway.gateway)
    os.kill(before["pid"], signal.SIGKILL)
    assert llama_gateway.gateway.ctx.ondemand is not None
    model = next(iter(llama_gateway.gateway.ctx.ondemand.lifecycle.models.values()))
    with trio.fail_after(30):  # seen at once, by its process (SPEC §11.1: failed)
        while managed(llama_gateway.gateway)["state"] != "failed":
            await model.changed.wait()
    assert managed(llama_gateway.gateway)["lastError"] == "its server exited"
    # Within the back-off (from the start of the server that died): refused at once.
    reply = await request(llama_gateway.unix, "POST", CHAT, chat_body(DEMO_MODEL))
    assert (reply.status, reply.json()["error"]["code"]) == (503, "model_load_failed")
    assert managed(llama_gateway.gateway)["state"] == "failed"  # no start was tried
    monkeypatch.setattr(model_state, "RETRY_AFTER_FAILURE", 0.0)  # the back-off is over
    with trio.fail_after(60):
        reply = await request(llama_gateway.unix, "POST", CHAT,
                              chat_body(DEMO_MODEL, max_tokens=8, temperature=0))
    assert reply.status == 200
    after = managed(llama_gateway.gateway)
    assert (after["state"], after["restarts"]) == ("loaded", 1)
    assert after["pid"] != before["pid"]
    status = (await request(llama_gateway.tcp, "GET", "/api/v1/inference/status")).json()
    assert status["loadedModels"] == 1
    assert status["llmModels"] == 1
    assert status["models"] == [DEMO_MODEL]
    assert status["managedModels"][0]["restarts"] == 1


async def test_launcher_stops_cleanly_on_sigterm(gguf: Path, short_tmp: Path) -> None:
    import subprocess
    import sys

    sock = short_tmp / "m-direct.sock"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "proxy.models.launcher", "--model", str(gguf), "--alias", "x",
         "--listen", str(sock), "--context", "512", "--parallel", "1", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            line = await proc.stdout.receive_some(4096)
        assert line.decode().strip() == f"listening unix:{sock}"
        assert (await request(f"unix:{sock}", "GET", "/health")).status == 200
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()


async def test_model_server_falls_back_to_loopback_tcp(nursery: trio.Nursery, short_tmp: Path,
                                                       gguf: Path) -> None:
    name = "smollm2-" + "x" * 100  # <socket dir>/m-<name>.sock would pass 103 bytes
    gw = await managed_gateway(nursery, short_tmp, ModelConfig(
        name=name, path=str(gguf), context=512, parallel=1, threads=1, preload=True))
    status = managed(gw.gateway)
    assert status["transport"] == "tcp"
    assert status["address"].startswith("http://127.0.0.1:")
    with trio.fail_after(60):
        reply = await request(gw.unix, "POST", CHAT, chat_body(name, max_tokens=4))
    assert reply.status == 200
    assert reply.header("x-sluice-served-by") == f"local:{name}"
