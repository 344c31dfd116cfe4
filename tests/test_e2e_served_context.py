"""The served context of a real managed llama.cpp (SPEC §17.2): the demo model (SmolLM2-135M,
trained for 8192 tokens) configured with ``context: 32768`` on one slot. Before it is loaded,
``/v1/models`` says the configured context; once loaded, what llama.cpp serves (it caps the
slot at 8192), and a warning names both numbers. ``sluice ps``, the local models API and
Ollama's ``/api/show`` say the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from protocol.config import ModelConfig
from proxy.cli.models import show_models
from proxy.demo import DEMO_MODEL
from proxy.server import Gateway
from tests.client import CHAT, chat_body, request
from tests.conftest import RunningGateway, admin_headers, gateway_config, open_settings
from tests.test_e2e_llama import gguf  # noqa: F401 (fixture)

pytest.importorskip("xllamacpp")

CONFIGURED, SERVED = 32768, 8192  # SmolLM2-135M's training context


async def entry_of(gw: RunningGateway) -> dict[str, Any]:
    reply = await request(gw.unix, "GET", "/v1/models")
    return next(e for e in reply.json()["data"] if e["id"] == DEMO_MODEL)


async def test_a_context_above_what_llama_serves_is_a_warning(
        nursery: trio.Nursery, short_tmp: Path, gguf: Path) -> None:  # noqa: F811
    cfg = gateway_config([], socket_dir=short_tmp / "s")
    cfg = attrs.evolve(cfg, models=(ModelConfig(
        name=DEMO_MODEL, path=str(gguf), context=CONFIGURED, parallel=1, threads=1),))
    gateway = Gateway(open_settings(short_tmp / "data", cfg))
    await nursery.start(gateway.run)
    gw = RunningGateway(gateway)
    before = await entry_of(gw)
    assert (before["sluice"]["state"], before["context_length"], before["max_model_len"]) == (
        "unloaded", CONFIGURED, CONFIGURED)  # its configuration's, until llama.cpp says

    with trio.fail_after(120):
        reply = await request(gw.unix, "POST", CHAT, chat_body(DEMO_MODEL, max_tokens=2))
        assert reply.status == 200, reply.body[:300]
        while (entry := await entry_of(gw))["context_length"] != SERVED:
            await trio.sleep(0.05)
    assert entry["max_model_len"] == SERVED
    assert entry["meta"]["n_ctx"] == SERVED  # llama.cpp's own fields are kept
    assert entry["owned_by"] == "llamacpp"

    notes = (await request(gw.unix, "GET", "/api/v1/notifications",
                           headers=admin_headers(gw))).json()
    notes = notes["notifications"] if isinstance(notes, dict) else notes
    capped = [n for n in notes if n["code"] == "context_capped"]
    assert len(capped) == 1
    assert capped[0]["level"] == "warning"
    assert f"{DEMO_MODEL} is configured with context {CONFIGURED} but its server serves " \
           f"{SERVED} tokens" in capped[0]["message"]

    local = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    assert local["models"][0]["contextLength"] == SERVED
    table = show_models(local).splitlines()
    assert table[0].split()[:4] == ["NAME", "STATE", "SIZE", "CONTEXT"]
    row = table[1].split()
    assert (row[0], row[1]) == (DEMO_MODEL, "loaded")
    assert row[row.index("MiB") + 1] == str(SERVED)  # CONTEXT, after SIZE

    show = (await request(gw.unix, "POST", "/api/show",
                          json.dumps({"model": DEMO_MODEL}).encode())).json()
    assert show["model_info"] == {"general.architecture": "llama",
                                  "llama.context_length": SERVED}
    assert show["parameters"] == f"num_ctx {SERVED}"
