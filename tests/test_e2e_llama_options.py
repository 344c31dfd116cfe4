"""The bundled llama.cpp's options (SPEC §11.1) with the real demo model, supervised by the
gateway: a model with gpu_layers, flash_attn, cache_type_k/v and batch loads and answers on
these CPU-only machines (what reaches llama.cpp's fields: tests/test_llama_options.py), and a
value the wheel refuses fails the load with the launcher's one line as the model's error."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

from protocol.config import ModelConfig
from proxy.server import Gateway
from tests.client import chat_body, request
from tests.conftest import RunningGateway, gateway_config, open_settings
from tests.test_e2e_llama import gguf  # noqa: F401 (the fixture)

pytest.importorskip("xllamacpp")


async def test_options_load_and_answer_and_a_refused_value_says_why(
        nursery: trio.Nursery, short_tmp: Path, gguf: Path) -> None:  # noqa: F811
    common = {"path": str(gguf), "context": 512, "parallel": 1, "threads": 1}
    tuned = ModelConfig(name="tuned", gpu_layers=0, flash_attn=False, cache_type_k="q8_0",
                        cache_type_v="f16", batch=256, **common)
    refused = ModelConfig(name="refused", batch=1 << 40, **common)
    cfg = attrs.evolve(gateway_config([], socket_dir=short_tmp / "s"), models=(tuned, refused))
    gateway = Gateway(open_settings(short_tmp / "data", cfg))
    await nursery.start(gateway.run)
    gw = RunningGateway(gateway)

    with trio.fail_after(120):
        reply = await request(gw.unix, "POST", "/v1/chat/completions",
                              chat_body("tuned", max_tokens=4))
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"]

    with trio.fail_after(60):
        reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("refused"))
    assert reply.status == 503
    error = reply.json()["error"]
    assert error["code"] == "model_load_failed"
    assert "batch: llama.cpp refuses 1099511627776" in error["message"]
    local = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    entries = {m["name"]: m for m in local["models"]}
    assert entries["tuned"]["state"] == "loaded"
    assert entries["refused"]["state"] == "failed"
    assert "batch: llama.cpp refuses 1099511627776" in entries["refused"]["lastError"]
    assert "Traceback" not in await trio.Path(entries["refused"]["log"]).read_text()
    assert "cpu" in local["llamaBackends"]
