"""Models on demand through a real ``sluice serve`` process and real llama.cpp servers: the
catalogue of a models folder (links of the real SmolLM2 GGUF, a broken file), the API, the
``sluice ps|load|unload`` commands run as processes, ``max_loaded: 1``, a config entry's
``keep_alive: 2s``, the rescan, ``loadMs``, the metrics, and a client that leaves mid-load.
Model servers are checked by pid (see tests/test_e2e_ondemand.alive)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from protocol.config import ModelConfig, dump_config_yaml, parse_config_text
from tests.client import Client, Reply, chat_body, connect
from tests.gateways import GatewayProcess
from tests.test_e2e_llama import gguf  # noqa: F401 (a fixture)
from tests.test_e2e_ondemand import alive

pytest.importorskip("xllamacpp")

LOAD_LIMIT = 60.0  # seconds: a load here takes 1-3 s, the suite may share two cores


async def ask(gw: GatewayProcess, model: str) -> Reply:
    """A short chat for ``model`` over the Unix socket: eight tokens at most (an answer
    without ``max_tokens`` may fill the model's context, many seconds on one core)."""
    return await gw.chat(model, via="unix", body=chat_body(model, max_tokens=8))


@pytest.fixture
async def gateway(short_tmp: Path, gguf: Path) -> AsyncIterator[GatewayProcess]:  # noqa: F811
    gw = GatewayProcess(short_tmp / "gw", "models")
    models = gw.data_dir / "models"
    models.mkdir(parents=True)
    for name in ("one", "two"):
        os.symlink(gguf, models / f"{name}.gguf")
    (models / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    cfg = gw.config
    gw.config = attrs.evolve(
        cfg,
        model_loading=attrs.evolve(cfg.model_loading, keep_alive=300.0, max_loaded=1),
        models=(ModelConfig(name="one", path="models/one.gguf", keep_alive=2.0, context=512,
                            parallel=1, threads=1),))
    gw.launch()
    try:
        yield await gw.ready()
    finally:
        await gw.astop()


async def sluice(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``sluice`` command as a user runs it, against this gateway's data folder."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(gw.folder / "run")}
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "proxy", *args, "--data-dir", str(gw.data_dir)],
        capture_output=True, text=True, timeout=120, env=env))


async def local(gw: GatewayProcess) -> dict[str, Any]:
    doc: dict[str, Any] = await gw.get_json("/api/v1/models/local")
    return doc


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in doc["models"]}


async def wait_state(gw: GatewayProcess, name: str, state: str,
                     timeout: float = LOAD_LIMIT) -> dict[str, Any]:
    async def there() -> bool:
        return by_name(await local(gw)).get(name, {}).get("state") == state

    await gw.wait_until(there, f"{name} {state}", timeout)
    return by_name(await local(gw))[name]


async def test_ps_load_unload_and_a_request_through_the_gateway(
        gateway: GatewayProcess) -> None:
    gw = gateway
    doc = await local(gw)
    models = by_name(doc)
    assert sorted(models) == ["broken", "one", "two"]
    assert {m["state"] for m in models.values()} == {"unloaded"}
    assert (models["one"]["source"], models["two"]["source"]) == ("config", "folder")
    assert models["one"]["keepAlive"] == 2.0
    assert doc["maxLoaded"] == 1
    assert doc["memoryInUse"] == 0
    assert doc["memoryBudget"] > 0
    listed = {m["id"]: m for m in (await gw.get_json("/v1/models"))["data"]}
    native = {"messages": "native", "responses": "native"}  # bundled llama.cpp (SPEC §17.1)
    assert listed["two"]["sluice"] == {"state": "unloaded", "apis": native}
    assert models["two"]["apis"] == native

    before = await sluice(gw, "ps")
    assert before.returncode == 0, before.stderr
    # CONTEXT: 2048 over 2 slots, planned until llama.cpp says (SPEC §17.2); then WAITING
    assert re.search(r"^two\s+unloaded\s+~\S+ MiB\s+1024\s+\S+\s+-$", before.stdout, re.M), \
        before.stdout

    # A request for an unloaded model loads it, waits, then is answered; loadMs says so.
    reply = await ask(gw, "two")
    assert reply.status == 200, reply.body
    again = await ask(gw, "two")
    assert again.status == 200
    records = [r for r in (await gw.get_json("/api/v1/requests?model=two"))["requests"]]
    assert len(records) == 2
    assert records[1]["loadMs"] > 0  # newest first: the first request waited for the load
    assert records[0]["loadMs"] is None
    two = by_name(await local(gw))["two"]
    assert two["state"] == "loaded"
    assert alive(two["pid"])
    assert 50 << 20 < two["memoryBytes"] < 1 << 30  # the server's RSS

    after = await sluice(gw, "ps")
    assert re.search(r"^two\s+loaded\s+\d+\.\d MiB\s+1024\s+\S+\s+4 minutes from now$",
                     after.stdout, re.M), after.stdout

    # max_loaded 1: loading one unloads two (idle), whose process goes.
    loaded = await sluice(gw, "load", "one")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("one: loaded (")
    assert not alive(two["pid"])
    one = by_name(await local(gw))["one"]
    assert one["state"] == "loaded"
    assert alive(one["pid"])
    assert by_name(await local(gw))["two"]["state"] == "unloaded"

    # one's keep_alive is 2 s: it goes by itself, and its memory is counted free.
    idle = await wait_state(gw, "one", "unloaded", timeout=20)
    assert idle["pid"] is None
    assert not alive(one["pid"])
    assert (await local(gw))["memoryInUse"] == 0

    # The API's unload, through the CLI.
    assert (await sluice(gw, "load", "two")).returncode == 0
    pid = by_name(await local(gw))["two"]["pid"]
    unloaded = await sluice(gw, "unload", "two")
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout.strip() == "two: unloaded"
    assert not alive(pid)

    # A broken file: a clear error, exit 1; the gateway serves the others all the same.
    broken = await sluice(gw, "load", "broken")
    assert broken.returncode == 1
    assert "503" in broken.stderr
    assert "broken.gguf" in broken.stderr
    unknown = await sluice(gw, "load", "nope")
    assert unknown.returncode == 1
    assert "404" in unknown.stderr
    assert (await ask(gw, "two")).status == 200

    metrics = (await gw.call("GET", "/metrics")).body.decode()
    assert 'sluice_model_loads_total{model="two",outcome="success"} 3' in metrics
    assert 'sluice_model_loads_total{model="one",outcome="success"} 1' in metrics
    assert 'sluice_model_loads_total{model="broken",outcome="failure"} 1' in metrics
    assert 'sluice_model_loaded{model="two"} 1' in metrics
    assert 'sluice_model_loaded{model="one"} 0' in metrics
    assert re.search(r'sluice_model_memory_bytes\{model="two"\} [1-9]\d+', metrics)
    assert re.search(r'sluice_model_load_seconds_count\{model="two"\} 3', metrics)


async def test_the_api_needs_the_admin_token_to_load(gateway: GatewayProcess) -> None:
    gw = gateway
    refused = await gw.call("POST", "/api/v1/models/local/two/load", via="unix")
    assert refused.status == 401
    assert by_name(await local(gw))["two"]["state"] == "unloaded"
    wrong = await gw.call("POST", "/api/v1/models/local/two/reload", via="unix", admin=True)
    assert wrong.status == 404


async def test_a_rescan_finds_new_files_and_forgets_gone_ones(
        gateway: GatewayProcess, gguf: Path) -> None:  # noqa: F811
    gw = gateway
    link = gw.data_dir / "models" / "Three Q4.gguf"
    os.symlink(gguf, link)
    found = await gw.call("POST", "/api/v1/models/local/rescan", via="unix", admin=True)
    assert found.status == 200
    assert found.json()["added"] == ["three-q4"]
    assert "three-q4" in by_name(found.json())
    reply = await ask(gw, "three-q4")
    assert reply.status == 200
    link.unlink()
    # Loaded when its file went: it leaves once idle (now), its server stopped.
    pid = by_name(await local(gw))["three-q4"]["pid"]
    gone = await gw.call("POST", "/api/v1/models/local/rescan", via="unix", admin=True)
    assert gone.json()["removed"] == ["three-q4"]

    async def forgotten() -> bool:
        return "three-q4" not in by_name(await local(gw))

    await gw.wait_until(forgotten, "three-q4 forgotten", 20)
    assert not alive(pid)
    missing = await ask(gw, "three-q4")
    assert missing.status in (404, 503)


async def test_a_client_that_leaves_mid_load_does_not_cancel_it(
        gateway: GatewayProcess) -> None:
    gw = gateway
    stream = await connect(gw.unix)
    client = Client(stream)
    await client.send_request("POST", "/v1/chat/completions", chat_body("two", stream=True))
    await wait_state(gw, "two", "loading")
    await client.aclose()  # gone while two loads
    two = await wait_state(gw, "two", "loaded")
    assert alive(two["pid"])
    assert (await ask(gw, "two")).status == 200


async def test_a_models_entry_edited_in_by_hand_comes_and_goes(
        gateway: GatewayProcess) -> None:
    """SPEC §13: a ``models:`` entry added to config.yaml by hand is a model at the next look
    at the file; removed again, it stops once idle (its server by pid). Each edit is followed
    by SIGHUP ("I am done: read now"), as a user may send: the watcher's own looks, every
    2 s, are tests/test_e2e_config_live.py's and tests/test_config_watch.py's."""
    gw = gateway
    path = gw.data_dir / "config.yaml"
    cfg = parse_config_text(path.read_text())
    extra = ModelConfig(name="four", path="models/two.gguf", context=512, parallel=1,
                        threads=1)
    path.write_text(dump_config_yaml(attrs.evolve(cfg, models=(*cfg.models, extra))))
    assert gw.proc is not None
    os.kill(gw.proc.pid, signal.SIGHUP)

    async def listed() -> bool:
        return "four" in by_name(await local(gw))

    await gw.wait_until(listed, "four in the catalogue", 20)
    assert (await ask(gw, "four")).status == 200
    pid = (await wait_state(gw, "four", "loaded"))["pid"]
    assert alive(pid)
    path.write_text(dump_config_yaml(cfg))  # the entry removed by hand
    os.kill(gw.proc.pid, signal.SIGHUP)

    async def forgotten() -> bool:
        return "four" not in by_name(await local(gw))

    await gw.wait_until(forgotten, "four forgotten", 30)
    assert not alive(pid)
    assert (await ask(gw, "one")).status == 200  # the others serve on
