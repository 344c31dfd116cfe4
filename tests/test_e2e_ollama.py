"""The official ``ollama`` Python client through sluice to the real llama.cpp (the demo
model, managed on demand; a second llama.cpp serving embeddings as a ``backends:``-style
local backend), each answer compared with the same request sent to llama.cpp directly in
OpenAI's API: list, ps, show, chat and generate (whole and streamed, greedy, so the same
text), tools, embed and embeddings, keep_alive, the endpoints sluice refuses, and bad
input in Ollama's error shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import ollama
import pytest
import trio

from protocol.config import ModelConfig
from proxy.demo import DEMO_MODEL
from proxy.server import Gateway
from tests.client import request
from tests.conftest import RunningGateway, gateway_config, inject_backend, open_settings
from tests.llama_server import llama_server
from tests.test_e2e_llama import gguf, llama_gateway, managed  # noqa: F401 (fixtures)
from tests.test_e2e_ondemand import alive

pytest.importorskip("xllamacpp")

EMBED_MODEL = "smollm2-embed"
OPTIONS = {"temperature": 0, "num_predict": 12}
PROMPT = "Name three colours."


@pytest.fixture
async def embedder(short_tmp: Path, gguf: Path) -> AsyncIterator[str]:  # noqa: F811
    """A llama.cpp server for /v1/embeddings (llama.cpp serves no completions then)."""
    async with llama_server(gguf, EMBED_MODEL, str(short_tmp / "embed.sock"), "--context",
                            "512", "--parallel", "1", "--threads", "1",
                            "--embeddings") as (url, _):
        yield url


def client(address: str) -> ollama.Client:
    if address.startswith("unix:"):
        return ollama.Client(host="http://localhost",
                             transport=httpx.HTTPTransport(uds=address[5:]))
    return ollama.Client(host=f"http://{address}")


async def run(fn: Any) -> Any:
    with trio.fail_after(90):
        return await trio.to_thread.run_sync(fn)


async def direct_chat(address: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await request(address, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert reply.status == 200, reply.body
    doc: dict[str, Any] = reply.json()
    return doc


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_chat_and_generate_whole_and_streamed(llama_gateway: RunningGateway,  # noqa: F811
                                                    transport: str) -> None:
    gw = llama_gateway
    address = gw.tcp if transport == "tcp" else gw.unix
    messages = [{"role": "user", "content": PROMPT}]

    def ask() -> tuple[Any, list[Any], Any, list[Any]]:
        with client(address) as c:
            return _ask(c)

    def _ask(c: ollama.Client) -> tuple[Any, list[Any], Any, list[Any]]:
        whole = c.chat(model=DEMO_MODEL, messages=messages, options=OPTIONS, stream=False)
        parts = list(c.chat(model=DEMO_MODEL, messages=messages, options=OPTIONS,
                            stream=True))
        gen = c.generate(model=DEMO_MODEL, prompt=PROMPT, options=OPTIONS, stream=False)
        gen_parts = list(c.generate(model=DEMO_MODEL, prompt=PROMPT, options=OPTIONS,
                                    stream=True))
        return whole, parts, gen, gen_parts

    whole, parts, gen, gen_parts = await run(ask)
    direct = await direct_chat(managed(gw.gateway)["address"], {
        "model": DEMO_MODEL, "messages": messages, "temperature": 0, "max_tokens": 12})
    text = direct["choices"][0]["message"]["content"]
    assert text
    assert whole.message.content == text
    assert whole.done
    assert whole.done_reason == "length"
    assert whole.eval_count == direct["usage"]["completion_tokens"]
    assert whole.prompt_eval_count == direct["usage"]["prompt_tokens"]
    assert whole.total_duration > 0
    assert "".join(p.message.content for p in parts) == text
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == direct["usage"]["completion_tokens"]
    assert gen.response == text  # generate is the prompt as one user message
    assert "".join(p.response for p in gen_parts) == text
    log = (await request(gw.unix, "GET", "/api/v1/requests?limit=4")).json()["requests"]
    assert [r["path"] for r in log] == ["/api/generate", "/api/generate", "/api/chat",
                                        "/api/chat"]
    assert all(r["status"] == 200 and r["model"] == DEMO_MODEL for r in log)
    assert log[2]["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]


async def test_list_ps_show_version_and_refusals(llama_gateway: RunningGateway  # noqa: F811
                                                 ) -> None:
    gw = llama_gateway

    def ask() -> tuple[Any, Any, Any, Exception]:
        with client(gw.tcp) as c:
            try:
                c.pull("llama3")
            except ollama.ResponseError as exc:
                refused = exc
            return c.list(), c.ps(), c.show(DEMO_MODEL), refused

    listed, ps, show, refused = await run(ask)
    assert [m.model for m in listed.models] == [DEMO_MODEL]
    assert listed.models[0].size > 0
    assert [m.model for m in ps.models] == [DEMO_MODEL]  # preloaded: loaded
    assert ps.models[0].size > 50 << 20
    assert show.details.format == "gguf"
    assert refused.status_code == 501
    assert "models folder" in str(refused)
    version = await request(gw.tcp, "GET", "/api/version")
    assert version.json()["version"]


async def test_embed_and_embeddings(llama_gateway: RunningGateway,  # noqa: F811
                                    embedder: str) -> None:
    gw = llama_gateway
    inject_backend(gw, "embedder", embedder, [EMBED_MODEL])

    def ask() -> tuple[Any, Any]:
        with client(gw.unix) as c:
            return (c.embed(model=EMBED_MODEL, input=["hello", "world"]),
                    c.embeddings(model=EMBED_MODEL, prompt="hello"))

    embed, legacy = await run(ask)
    direct = await request(embedder, "POST", "/v1/embeddings",
                           json.dumps({"model": EMBED_MODEL, "input": ["hello", "world"]})
                           .encode())
    vectors = [d["embedding"] for d in direct.json()["data"]]
    assert [list(v) for v in embed.embeddings] == vectors
    assert list(legacy.embedding) == vectors[0]


async def test_tools_are_passed_and_answered(llama_gateway: RunningGateway  # noqa: F811
                                             ) -> None:
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    def ask() -> Any:
        with client(llama_gateway.tcp) as c:
            return c.chat(model=DEMO_MODEL, messages=messages, tools=[tool], options=OPTIONS,
                          stream=False)

    reply = await run(ask)
    direct = await direct_chat(managed(llama_gateway.gateway)["address"], {
        "model": DEMO_MODEL, "messages": messages, "tools": [tool], "temperature": 0,
        "max_tokens": 12})
    said = direct["choices"][0]["message"]
    if said.get("tool_calls"):
        assert [c.function.name for c in reply.message.tool_calls or []] == [
            c["function"]["name"] for c in said["tool_calls"]]
    else:
        assert reply.message.content == said["content"]


async def test_keep_alive_unloads_and_loads(llama_gateway: RunningGateway  # noqa: F811
                                            ) -> None:
    gw = llama_gateway
    pid = managed(gw.gateway)["pid"]

    def unload() -> Any:  # Ollama's way: no messages, keep_alive 0
        with client(gw.unix) as c:
            return c.chat(model=DEMO_MODEL, messages=[], keep_alive=0)

    gone = await run(unload)
    assert gone.done_reason == "unload"
    assert managed(gw.gateway)["state"] == "unloaded"
    assert not alive(pid)

    def short() -> Any:  # a request with keep_alive 1s: loads, answers, unloads after 1 s
        with client(gw.unix) as c:
            return c.generate(model=DEMO_MODEL, prompt="Hi", keep_alive="1s",
                              options={"num_predict": 2})

    answered = await run(short)
    assert answered.done
    assert answered.load_duration > 0  # it waited for the load
    served_by = managed(gw.gateway)["pid"]
    assert alive(served_by)
    with trio.fail_after(30):  # gone 1 s after (then loaded again: the demo is preload)
        while alive(served_by):
            await trio.sleep(0.05)

    def load() -> Any:  # no prompt: load only; keep_alive -1: forever
        with client(gw.unix) as c:
            return c.generate(model=DEMO_MODEL, keep_alive=-1)

    loaded = await run(load)
    assert loaded.done_reason == "load"
    status = managed(gw.gateway)
    assert status["state"] == "loaded"
    assert status["keepAlive"] is None  # forever
    assert status["unloadsAt"] is None


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/api/chat", b"{not json", "JSON"),
    ("/api/chat", b'{"messages": []}', "model"),
    ("/api/chat", b'{"model": "smollm2-135m", "messages": "hi"}', "messages"),
    ("/api/generate", b'{"model": "smollm2-135m", "prompt": "x", "options": [1]}', "options"),
    ("/api/chat", b'{"model": "nowhere", "messages": [{"role": "user", "content": "x"}]}',
     "nowhere"),
])
async def test_bad_input_gets_ollamas_error_shape(unloaded_gateway: RunningGateway,
                                                  path: str, body: bytes, words: str) -> None:
    reply = await request(unloaded_gateway.unix, "POST", path, body)
    assert reply.status in (400, 404, 503)
    doc = reply.json()
    assert set(doc) == {"error"}
    assert isinstance(doc["error"], str)
    assert words in doc["error"]
    assert managed(unloaded_gateway.gateway)["state"] == "unloaded"  # refused before a load


@pytest.fixture
async def unloaded_gateway(nursery: trio.Nursery, short_tmp: Path,
                           gguf: Path) -> RunningGateway:  # noqa: F811
    """The demo model in the config but not loaded (no model server): what is refused
    before routing needs the model's name, not its server."""
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(name=DEMO_MODEL, path=str(gguf), context=1024,
                                                parallel=2, threads=1, preload=False),))
    gateway = Gateway(open_settings(short_tmp / "data", cfg))
    await nursery.start(gateway.run)
    return RunningGateway(gateway)

