"""Your own model servers (SPEC §11.1): managed models whose ``command`` sluice runs, with
every behaviour of models on demand. The servers are real processes (tests/
fake_model_server.py, and the real llama.cpp launcher run as a command), checked by pid; the
gateway runs in this test's trio loop."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from protocol.config import ModelConfig
from protocol.errors import ConfigError
from proxy.models import process
from proxy.server import Gateway
from tests.client import chat_body, error_of, request
from tests.conftest import RunningGateway, admin, alive, gateway_config, open_settings
from tests.workers import demo_model

FAKE = str(Path(__file__).with_name("fake_model_server.py"))
GIB = 1 << 30


def fake(*args: str) -> tuple[str, ...]:
    return (sys.executable, FAKE, "--port", "${PORT}", "--model", "${NAME}", *args)


def read(path: str) -> str:
    return Path(path).read_text()


def is_socket(path: str) -> bool:
    return Path(path).is_socket()


def command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


async def start(nursery: trio.Nursery, folder: Path, models: Sequence[ModelConfig],
                **loading: Any) -> RunningGateway:
    cfg = gateway_config([], socket_dir=folder / "s")
    cfg = attrs.evolve(cfg, models=tuple(models),
                       model_loading=attrs.evolve(cfg.model_loading, **loading))
    gateway = Gateway(open_settings(folder / "data", cfg), drain_timeout=5)
    await nursery.start(gateway.run)
    return RunningGateway(gateway)


async def local(gw: RunningGateway, name: str) -> dict[str, Any]:
    doc = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    return next(m for m in doc["models"] if m["name"] == name)


async def until_state(gw: RunningGateway, name: str, state: str) -> dict[str, Any]:
    with trio.fail_after(30):
        while (entry := await local(gw, name))["state"] != state:
            await trio.sleep(0.05)
    return entry


async def gone(pid: int) -> None:
    with trio.fail_after(30):
        while alive(pid):
            await trio.sleep(0.05)


async def test_a_command_model_loads_on_demand_and_unloads(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    model = ModelConfig(name="mine", command=fake(), env=(("FAKE_GREETING", "from env"),),
                        memory=GIB)
    gw = await start(nursery, short_tmp, [model])
    listed = (await request(gw.unix, "GET", "/v1/models")).json()["data"]
    assert [(m["id"], m["sluice"]["state"]) for m in listed] == [("mine", "unloaded")]
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("mine"))
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == "from env"
    entry = await local(gw, "mine")
    assert (entry["state"], entry["engine"], entry["kind"]) == ("loaded", "command", "llm")
    pid = entry["pid"]
    assert alive(pid)
    argv = command_line(pid)  # the command's own process, its placeholders filled in
    port = argv[argv.index("--port") + 1]
    assert port.isdigit()
    assert entry["address"] == f"http://127.0.0.1:{port}"
    assert argv[argv.index("--model") + 1] == "mine"
    assert entry["estimatedBytes"] == GIB  # the declared memory
    log = read(entry["log"])
    assert f"fake model server pid {pid}" in log
    assert "listening on" in log
    log_entry = (await request(gw.unix, "GET", "/api/v1/requests?limit=1")).json()
    assert log_entry["requests"][0]["loadMs"] is not None
    unloaded = await admin(gw, "POST", "/api/v1/models/local/mine/unload")
    assert unloaded.status == 200
    await gone(pid)
    assert (await local(gw, "mine"))["state"] == "unloaded"
    # The next request starts it again.
    again = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("mine"))
    assert again.status == 200
    assert (await local(gw, "mine"))["pid"] != pid


async def test_ready_only_when_health_answers_200(nursery: trio.Nursery,
                                                  short_tmp: Path) -> None:
    """vLLM's way: it listens at once and answers /health 503 until its model is in."""
    model = ModelConfig(name="slow", command=fake("--ready-after", "1.5", "--busy-health"),
                        memory=GIB)
    gw = await start(nursery, short_tmp, [model])
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("slow"))
    assert reply.status == 200, reply.body
    entry = (await request(gw.unix, "GET", "/api/v1/requests?limit=1")).json()["requests"][0]
    assert entry["loadMs"] >= 1500  # it waited for the 200, not for the first answer


async def test_a_server_over_its_socket(nursery: trio.Nursery, short_tmp: Path) -> None:
    """A command that names ${SOCKET} is reached over that Unix socket."""
    model = ModelConfig(name="sock", command=(sys.executable, FAKE, "--socket", "${SOCKET}",
                                              "--model", "${NAME}"), memory=GIB)
    gw = await start(nursery, short_tmp, [model])
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("sock"))
    assert reply.status == 200, reply.body
    entry = await local(gw, "sock")
    assert entry["address"].startswith("unix:")
    assert entry["transport"] == "unix"
    assert is_socket(entry["address"][len("unix:"):])


async def test_a_server_ignoring_sigterm_is_killed_with_what_it_started(
        nursery: trio.Nursery, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "STOP_TIMEOUT", 1.0)
    model = ModelConfig(name="stubborn", command=fake("--ignore-sigterm", "--child"),
                        memory=GIB)
    gw = await start(nursery, short_tmp, [model])
    assert (await request(gw.unix, "POST", "/v1/chat/completions",
                          chat_body("stubborn"))).status == 200
    entry = await local(gw, "stubborn")
    log = read(entry["log"])
    worker = int(log.split("worker pid ")[1].split()[0])
    assert alive(entry["pid"])
    assert alive(worker)
    assert (await admin(gw, "POST", "/api/v1/models/local/stubborn/unload")).status == 200
    await gone(entry["pid"])  # SIGTERM ignored: SIGKILL after STOP_TIMEOUT
    await gone(worker)  # and the worker it started goes with it


async def test_stop_signal_is_what_stops_it(nursery: trio.Nursery, short_tmp: Path) -> None:
    """stop_signal SIGINT: the fake ignores SIGTERM but dies of SIGINT (Python's default),
    so it is gone at once rather than after the 10 s escalation."""
    model = ModelConfig(name="int", command=fake("--ignore-sigterm"), memory=GIB,
                        stop_signal="SIGINT")
    gw = await start(nursery, short_tmp, [model])
    assert (await request(gw.unix, "POST", "/v1/chat/completions",
                          chat_body("int"))).status == 200
    pid = (await local(gw, "int"))["pid"]
    with trio.fail_after(5):  # well under STOP_TIMEOUT (10 s): SIGINT did it
        assert (await admin(gw, "POST", "/api/v1/models/local/int/unload")).status == 200
        await gone(pid)


async def test_a_crash_while_loaded_ends_its_requests_and_the_model_is_failed(
        nursery: trio.Nursery, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import model_state
    # A back-off no busy machine outlasts before the refusal below (10 s of real time was
    # passed by the time the request came, beside other test workers).
    monkeypatch.setattr(model_state, "RETRY_AFTER_FAILURE", 600.0)
    model = ModelConfig(name="frail", command=fake(), memory=GIB)
    gw = await start(nursery, short_tmp, [model])
    assert (await request(gw.unix, "POST", "/v1/chat/completions",
                          chat_body("frail"))).status == 200
    pid = (await local(gw, "frail"))["pid"]
    body = json.dumps({"model": "frail", "stream": True,
                       "messages": [{"role": "user", "content": "crash now"}]}).encode()
    reply = await request(gw.unix, "POST", "/v1/chat/completions", body)
    assert reply.status == 200  # committed at its first event...
    assert b'"content": "hello"' in reply.body
    assert b"error" in reply.body.split(b"hello", 1)[1]  # ...then the dialect's error event
    assert b"[DONE]" not in reply.body
    entry = await until_state(gw, "frail", "failed")
    assert entry["lastError"] == "its server exited"
    assert not alive(pid)
    whole = await request(gw.unix, "POST", "/v1/messages", json.dumps(
        {"model": "frail", "max_tokens": 8,
         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        [("anthropic-version", "2023-06-01")])
    # Within the back-off (from the start of the server that died): refused at once, in
    # Anthropic's shape.
    assert whole.status == 503, whole.body
    assert whole.json()["type"] == "error"
    monkeypatch.setattr(model_state, "RETRY_AFTER_FAILURE", 0.0)  # the back-off is over
    whole = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("frail"))
    assert whole.status == 200
    entry = await local(gw, "frail")
    assert (entry["state"], entry["restarts"]) == ("loaded", 1)
    assert entry["pid"] != pid


async def test_an_embedding_server(nursery: trio.Nursery, short_tmp: Path) -> None:
    model = ModelConfig(name="embed", command=fake("--kind", "embedding"), memory=GIB,
                        kind="embedding")
    gw = await start(nursery, short_tmp, [model])
    reply = await request(gw.unix, "POST", "/v1/embeddings",
                          json.dumps({"model": "embed", "input": "hi"}).encode())
    assert reply.status == 200, reply.body
    assert reply.json()["data"][0]["embedding"] == [0.25, -0.5, 1.0]
    assert (await local(gw, "embed"))["kind"] == "embedding"
    status = (await request(gw.unix, "GET", "/api/v1/inference/status")).json()
    assert "embed" in status["models"]


async def test_declared_memory_counts_in_the_budget(nursery: trio.Nursery,
                                                    short_tmp: Path) -> None:
    """Two servers of 3 GiB each in a 4 GiB budget: loading one unloads the other, whatever
    their (small) RSS says."""
    models = [ModelConfig(name=n, command=fake(), memory=3 * GIB) for n in ("a", "b")]
    gw = await start(nursery, short_tmp, models, memory_budget=4 * GIB)
    assert (await request(gw.unix, "POST", "/v1/chat/completions", chat_body("a"))).status \
        == 200
    a = await local(gw, "a")
    budget = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    assert budget["memoryInUse"] == 3 * GIB
    assert (await request(gw.unix, "POST", "/v1/chat/completions", chat_body("b"))).status \
        == 200
    await gone(a["pid"])
    assert (await local(gw, "a"))["state"] == "unloaded"
    assert (await local(gw, "b"))["state"] == "loaded"


async def test_load_errors_name_the_field_and_the_servers_last_words(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    models = [
        ModelConfig(name="missing", command=("no-such-model-server", "--port", "${PORT}"),
                    memory=GIB),
        ModelConfig(name="dies", command=fake("--fail-start", "CUDA error: out of memory"),
                    memory=GIB),
        # Listens on a port of its own, not on ${PORT}: never healthy where sluice looks.
        ModelConfig(name="elsewhere", command=(sys.executable, FAKE, "--port", "0"),
                    memory=GIB),
    ]
    gw = await start(nursery, short_tmp, models)
    gw.gateway.settings.config = attrs.evolve(
        gw.gateway.settings.config, timeouts=attrs.evolve(
            gw.gateway.settings.config.timeouts, model_load=2.0))
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("missing"))
    assert (reply.status, error_of(reply)["code"]) == (503, "model_load_failed")
    assert "models[0].command: 'no-such-model-server' was not found" in \
        error_of(reply)["message"]
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("dies"))
    assert (reply.status, error_of(reply)["code"]) == (503, "model_load_failed")
    assert "CUDA error: out of memory" in error_of(reply)["message"]
    reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body("elsewhere"))
    assert (reply.status, error_of(reply)["code"]) == (504, "model_load_timeout")
    message = error_of(reply)["message"]
    assert "GET /health at http://127.0.0.1:" in message
    assert "listening on 127.0.0.1:0" in message  # its last log line says where it went
    entry = await until_state(gw, "elsewhere", "failed")  # its own load's deadline, too
    assert "waited for GET /health at http://127.0.0.1:" in entry["lastError"]


async def test_a_command_model_without_a_size_stops_the_start(short_tmp: Path) -> None:
    (short_tmp / "weights.bin").write_bytes(b"not a gguf")
    model = ModelConfig(name="big", path=str(short_tmp / "weights.bin"),
                        command=fake("--weights", "${MODEL}"))
    cfg = attrs.evolve(gateway_config([], socket_dir=short_tmp / "s"), models=(model,))
    # The settings refuse it as they open (SPEC §3.1: as check-config and every write do).
    with pytest.raises(ConfigError, match=r"models\[0\]\.memory: required"):
        open_settings(short_tmp / "data", cfg)
    # sluice serve says so and exits 2 (SPEC §3), with nothing left listening.
    done = await trio.run_process(
        [sys.executable, "-m", "proxy", "serve", "--data-dir", str(short_tmp / "data")],
        capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 2
    assert b"models[0].memory: required" in done.stderr


async def test_the_bundled_llama_cpp_run_as_a_command(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    """The launcher of the bundled engine as a user's command: ${MODEL}, ${NAME}, ${PORT}."""
    pytest.importorskip("xllamacpp")
    gguf = demo_model()
    model = ModelConfig(name="smol", path=str(gguf), command=(
        sys.executable, "-m", "proxy.models.launcher", "--model", "${MODEL}",
        "--alias", "${NAME}", "--listen", "127.0.0.1:${PORT}", "--context", "512",
        "--parallel", "1", "--threads", "1"))
    gw = await start(nursery, short_tmp, [model])
    with trio.fail_after(120):
        reply = await request(gw.unix, "POST", "/v1/chat/completions",
                              chat_body("smol", max_tokens=4, temperature=0))
    assert reply.status == 200, reply.body
    entry = await local(gw, "smol")
    assert entry["engine"] == "command"
    assert entry["estimatedBytes"] > gguf.stat().st_size  # read from the GGUF: file + KV
    assert command_line(entry["pid"])[-6:-4] == ["--context", "512"]
    os.kill(entry["pid"], signal.SIGTERM)
    await until_state(gw, "smol", "failed")
