"""The context a server serves, as ``/v1/models`` and the Ollama API tell it (SPEC §17.2):
from a fake llama.cpp's ``/props``, from a vLLM-shaped model list, from a node's entries, and
for a managed model before it is loaded; the upstream's own fields are kept. The pure rules
of protocol/served_context.py first. (The real llama.cpp, a managed model configured with
more context than it serves and the warning: tests/test_e2e_served_context.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing

from protocol.served_context import (
    Served,
    capped_message,
    entry_context,
    props_context,
    with_context,
)
from tests.client import request
from tests.conftest import StartGateway, configure, node
from tests.fakenode import start_node
from tests.fakeupstream import FakeUpstream, ReceivedRequest, ResponseWriter
from tests.waits import published

# -- the rules -----------------------------------------------------------------------------


def test_props_context_is_one_slots_and_counts_the_slots() -> None:
    props = {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1}
    assert props_context(props) == Served(8192, 1)
    assert props_context({"default_generation_settings": {"n_ctx": 1024},
                          "total_slots": 2}).whole == 2048  # type: ignore[union-attr]
    assert props_context({"default_generation_settings": {"n_ctx": 512}}) == Served(512, 1)
    for bad in (None, [], {}, {"default_generation_settings": []},
                {"default_generation_settings": {"n_ctx": "8192"}},
                {"default_generation_settings": {"n_ctx": 0}},
                {"default_generation_settings": {"n_ctx": True}}):
        assert props_context(bad) is None


def test_an_entrys_own_context() -> None:
    assert entry_context({"id": "m", "max_model_len": 32768}) == 32768
    assert entry_context({"id": "m", "meta": {"n_ctx": 4096, "n_ctx_train": 8192}}) == 4096
    assert entry_context({"id": "m", "max_model_len": 100, "meta": {"n_ctx": 5}}) == 100
    assert entry_context({"id": "m", "max_model_len": -1, "meta": {"n_ctx_train": 5}}) is None
    assert entry_context({"id": "m", "meta": "x"}) is None


def test_with_context_copies_or_leaves_the_entry() -> None:
    entry = {"id": "m", "meta": {}}
    out = with_context(entry, 1024)
    assert out == {"id": "m", "meta": {}, "context_length": 1024, "max_model_len": 1024}
    assert entry == {"id": "m", "meta": {}}
    assert with_context(entry, None) is entry
    assert with_context(out, 1024) is out


def test_the_warning_names_both_numbers() -> None:
    text = capped_message([("smol", 32768, 8192), ("big", 65536, 16384)])
    assert "smol is configured with context 32768 but its server serves 8192" in text
    assert "big is configured with context 65536 but its server serves 16384" in text


# -- through a gateway ---------------------------------------------------------------------


def props(n_ctx: int, slots: int) -> Any:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, {"default_generation_settings": {"n_ctx": n_ctx},
                           "total_slots": slots, "chat_template": "x" * 5000})

    return handler


def listing(entries: list[dict[str, Any]]) -> Any:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, {"object": "list", "data": entries})

    return handler


LLAMA_ENTRY = {"id": "llama-m", "object": "model", "created": 1796534294,
               "owned_by": "llamacpp", "aliases": ["llama-m"],
               "architecture": {"input_modalities": ["text"]},
               "meta": {"vocab_type": 2, "n_ctx": 999, "n_ctx_train": 8192}}
VLLM_ENTRY = {"id": "Qwen/Qwen2.5-7B", "object": "model", "created": 1700000000,
              "owned_by": "vllm", "root": "/models/qwen", "parent": None,
              "max_model_len": 32768, "permission": [{"id": "modelperm-1"}]}


async def models_of(gw: Any) -> dict[str, dict[str, Any]]:
    reply = await request(gw.unix, "GET", "/v1/models")
    return {e["id"]: e for e in reply.json()["data"]}


async def test_served_context_from_props_and_from_a_vllm_list(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    """llama.cpp: ``/props``' per-slot n_ctx wins over its list's meta; vLLM (no /props):
    its ``max_model_len``. Every field each upstream sent is still there."""
    llama = FakeUpstream(unix_path=str(short_tmp / "llama.sock"))
    llama.on("GET", "/v1/models", listing([LLAMA_ENTRY]))
    llama.on("GET", "/props", props(4096, 2))
    vllm = FakeUpstream(unix_path=str(short_tmp / "vllm.sock"))
    vllm.on("GET", "/v1/models", listing([VLLM_ENTRY]))
    for up in (llama, vllm):
        await nursery.start(up.serve)
    gw = await start_gateway([("llama", llama.url), ("vllm", vllm.url)])
    backends = gw.gateway.ctx.backends
    await published(backends.changes, lambda: any(
        b.name == "llama" and b.served is not None for b in backends.backends), "llama's /props")
    models = await models_of(gw)
    # the fakes answer 404 to POST /v1/messages and /v1/responses: translated (SPEC §17.1)
    apis = {"messages": "translate", "responses": "translate"}
    assert models["llama-m"] == {**LLAMA_ENTRY, "context_length": 4096, "max_model_len": 4096,
                                 "sluice": {"slots": {"busy": 0, "total": 2}, "apis": apis}}
    assert models["Qwen/Qwen2.5-7B"] == {**VLLM_ENTRY, "context_length": 32768,
                                         "sluice": {"apis": apis}}
    assert len(llama.requests_to("/props")) == 1  # its slots' and its context's at once
    show = await request(gw.unix, "POST", "/api/show",
                         json.dumps({"model": "Qwen/Qwen2.5-7B"}).encode())
    assert show.json()["parameters"] == "num_ctx 32768"


async def test_a_nodes_entries_keep_their_fields(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    extra = [{"id": "far", "object": "model", "created": 5, "owned_by": "llamacpp",
              "context_length": 8192, "max_model_len": 8192, "meta": {"n_ctx": 8192},
              "sluice": {"state": "loaded"}}]
    up = await start_node(nursery, str(short_tmp / "n.sock"), [], extra)
    gw = await start_gateway([])
    configure(gw, (node("n", up.url, 1),), enabled=True)
    await trio.sleep(0.1)
    far = (await models_of(gw))["far"]
    assert far == {"id": "far", "object": "model", "created": 5, "owned_by": "remote",
                   "context_length": 8192, "max_model_len": 8192, "meta": {"n_ctx": 8192}}


# -- the warning ---------------------------------------------------------------------------


def test_the_warning_follows_what_servers_serve_and_the_config() -> None:
    """A bundled model served less context than configured (all slots together) is named
    in the one ``context_capped`` warning, with both numbers; it stays while the model is
    unloaded, and goes when its configured context changes or it leaves. A command model's
    ``context`` is not given to its server, so it is never named."""
    from types import SimpleNamespace

    from protocol.config import BackendConfig
    from protocol.model_spec import Command, ModelSpec
    from proxy.models.context import CONTEXT_CAPPED, ServedContexts
    from proxy.notifications import Notifications
    from proxy.registry.backends import LocalBackend

    def spec(name: str, context: int, parallel: int = 1, command: tuple[str, ...] = ()
             ) -> Any:
        return SimpleNamespace(spec=ModelSpec(
            name=name, path="", estimate=0, keep_alive=0, context=context, parallel=parallel,
            **({"engine": Command(command)} if command else {})))

    def backend(name: str, served: Served | None) -> LocalBackend:
        b = LocalBackend(BackendConfig(name=name, url="http://127.0.0.1:1"), None,
                         pinned_model=name)
        b.online, b.served = True, served
        return b

    lifecycle = SimpleNamespace(models={"smol": spec("smol", 32768),
                                        "pair": spec("pair", 2048, 2),
                                        "own": spec("own", 65536, command=("srv",))})
    backends = {"smol": backend("smol", Served(8192, 1)), "pair": backend("pair", Served(1024, 2)),
                "own": backend("own", Served(4096, 1))}
    notes = Notifications()
    contexts = ServedContexts(lifecycle, backends, notes)  # type: ignore[arg-type]
    assert contexts.planned("pair") == 1024
    assert contexts.planned("own") is None
    contexts.check()
    (item,) = notes.all()
    assert item["code"] == CONTEXT_CAPPED
    assert item["message"].startswith("smol is configured with context 32768 but its server "
                                      "serves 8192 tokens")
    assert "pair" not in item["message"]
    assert "own" not in item["message"]
    backends["smol"].online = False  # unloaded: still true of its configuration
    contexts.check()
    assert [n["code"] for n in notes.all()] == [CONTEXT_CAPPED]
    lifecycle.models["smol"] = spec("smol", 8192)  # the config now asks what is served
    contexts.check()
    assert notes.all() == []
