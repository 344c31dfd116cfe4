"""config.yaml edited by hand under a real ``sluice serve`` process (SPEC §13), with real
file edits, real model servers (fakes on 127.0.0.1) and the real CLI.

The sequence: a hand edit that replaces a backend and a timeout is applied live while a
stream to the removed backend runs on to its end; the removed backend takes no new request,
the new one does; an invalid edit keeps the running settings and says so (notification and
WARNING, naming the field and the limit) until it is fixed; the gateway's own write is not
read back; each applied change is in the history, which the CLI lists and restores; SIGHUP
reads at once; a field that needs a restart says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from protocol.config import BackendConfig, dump_config_yaml, parse_config_text
from tests.client import CHAT, Client, chat_body, read_events
from tests.fakeupstream import FakeUpstream, json_completion, sse_events, sse_stream
from tests.gateways import GatewayProcess, Launcher

EVENTS = 12


def rename_over(path: Path, text: str) -> None:
    tmp = path.with_name(".config.yaml.edit")
    tmp.write_text(text)
    os.replace(tmp, path)


async def notes(gw: GatewayProcess) -> dict[str, str]:
    doc = await gw.get_json("/api/v1/notifications")
    return {n["code"]: n["message"] for n in doc["notifications"]}


async def wait_note(gw: GatewayProcess, code: str, present: bool = True) -> str:
    found = ""

    async def check() -> bool:
        nonlocal found
        found = (await notes(gw)).get(code, "")
        return bool(found) == present

    await gw.wait_until(check, f"notification {code} {'raised' if present else 'cleared'}")
    return found


async def connection_timeout(gw: GatewayProcess) -> Any:
    return (await gw.get_json("/api/v1/settings/timeouts"))["connection"]


def cli(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(gw.folder / "run")}
    env.pop("SLUICE_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "proxy", *args, "--data-dir",
                           str(gw.data_dir)], capture_output=True, text=True, timeout=30,
                          env=env, check=False)


async def test_hand_edits_are_applied_live(launch: Launcher, nursery: trio.Nursery) -> None:
    a = FakeUpstream(models=("m-a",))
    a.on("POST", CHAT, sse_stream(sse_events(EVENTS, "m-a"), gap=0.15))
    b = FakeUpstream(models=("m-b",))
    b.on("POST", CHAT, json_completion("from b", "m-b"))
    await nursery.start(a.serve)
    await nursery.start(b.serve)
    gw = await launch.start("live", backends=[("a", a.url)], lb=False)
    path = gw.data_dir / "config.yaml"
    original = path.read_text()

    # A stream to backend a is running ...
    client = await Client.open(gw.address)
    await client.send_request("POST", CHAT, chat_body("m-a", stream=True),
                              [("content-type", "application/json")])
    head = await client.read_head()
    assert head.status_code == 200
    first = await read_events(client, 2)

    # ... when a hand edit replaces backend a by b and changes a timeout.
    cfg = parse_config_text(original)
    edited = attrs.evolve(cfg, backends=(BackendConfig(name="b", url=b.url, kind="llm"),),
                          timeouts=attrs.evolve(cfg.timeouts, connection=7.0))
    rename_over(path, dump_config_yaml(edited))
    assert await wait_note(gw, "config_reloaded") == "config.yaml reloaded: backends, timeouts"
    assert await connection_timeout(gw) == "7s"

    rest = await client.read_reply(head)  # the stream runs on to its end
    await client.aclose()
    assert rest.complete
    body = first + rest.body
    assert body.count(b"data: ") == EVENTS + 1
    assert body.endswith(b"data: [DONE]\n\n")

    gone = await gw.chat("m-a")  # backend a takes no new request
    assert gone.status == 503
    assert gone.json()["error"]["code"] == "model_not_available"

    async def b_serves() -> bool:
        return (await gw.chat("m-b")).status == 200

    await gw.wait_until(b_serves, "the new backend b serving m-b")
    assert len(a.requests_to(CHAT)) == 1

    # An invalid edit keeps the running settings, and says so until it is fixed.
    good = path.read_text()
    path.write_text(good.replace("connection: 7s", "connection: 99s"))
    message = await wait_note(gw, "config_invalid")
    assert "timeouts.connection" in message
    assert "15s" in message
    assert await connection_timeout(gw) == "7s"

    async def warned() -> bool:
        return any("WARNING" in line and "config.yaml was not applied" in line
                   and "timeouts.connection" in line for line in gw.log().splitlines())

    await gw.wait_until(warned, "the WARNING line in the log")
    path.write_text(good.replace("connection: 7s", "connection: 6s"))
    await wait_note(gw, "config_invalid", present=False)
    assert await connection_timeout(gw) == "6s"

    # The gateway's own write is not read back as an edit.
    async def logged_twice() -> bool:  # the two reloads so far, each one INFO line
        return gw.log().count("config.yaml reloaded") == 2

    await gw.wait_until(logged_twice, "two reloads in the log")
    reply = await gw.call("PUT", "/api/v1/settings/timeouts", {"connection": "5s"},
                          admin=True)
    assert reply.status == 200, reply.body
    # Two looks at the file since that write, asked for at once by SIGHUP (which reads a
    # changed file without waiting for it to settle): the second begins only once the
    # first is done, so had the first read the write back, its line would be logged first.
    assert gw.proc is not None
    for looks in (1, 2):
        os.kill(gw.proc.pid, signal.SIGHUP)

        async def heard(looks: int = looks) -> bool:
            return gw.log().count("SIGHUP: reading config.yaml") == looks

        await gw.wait_until(heard, f"SIGHUP {looks} in the log")
    assert gw.log().count("config.yaml reloaded") == 2
    assert "connection: 5s" in path.read_text()

    # Every applied change kept the file it replaced.
    history = await gw.get_json("/api/v1/settings/history", admin=True)
    assert [(h["source"], h["sections"]) for h in history] == [
        ("api", ["timeouts"]), ("file", ["timeouts"]), ("file", ["backends", "timeouts"])]
    listed = await trio.to_thread.run_sync(cli, gw, "config", "history")
    assert listed.returncode == 0, listed.stderr
    assert history[-1]["id"] in listed.stdout
    assert "a hand edit" in listed.stdout

    # Restoring the oldest version brings backend a back, live.
    done = await trio.to_thread.run_sync(cli, gw, "config", "restore", history[-1]["id"])
    assert done.returncode == 0, done.stderr
    assert "changed: backends, timeouts" in done.stdout
    assert path.read_text() == original
    assert await connection_timeout(gw) == "10s"

    async def a_serves() -> bool:
        return (await gw.chat("m-a")).status == 200

    await gw.wait_until(a_serves, "backend a serving m-a again")
    after = await gw.get_json("/api/v1/settings/history", admin=True)
    assert after[0]["source"] == "restore"
    missing = await gw.call("POST", "/api/v1/settings/history/20000101T000000.000Z-api/restore",
                            admin=True)
    assert missing.status == 404
    assert (await gw.call("POST", f"/api/v1/settings/history/{after[0]['id']}/restore")
            ).status == 401


async def test_sighup_and_restart_fields(launch: Launcher) -> None:
    gw = await launch.start("hup", lb=False)
    path = gw.data_dir / "config.yaml"
    cfg = parse_config_text(path.read_text())
    port = cfg.ollama_api.port
    rename_over(path, dump_config_yaml(attrs.evolve(
        cfg, ollama_api=attrs.evolve(cfg.ollama_api, port=port + 11434),
        timeouts=attrs.evolve(cfg.timeouts, connection=4.0))))
    assert gw.proc is not None
    os.kill(gw.proc.pid, signal.SIGHUP)
    message = await wait_note(gw, "config_reloaded")
    assert message == ("config.yaml reloaded: ollama_api, timeouts (ollama_api.port apply at "
                       "the next start)")
    assert "ollama_api.port" in (await notes(gw))["restart_required"]
    assert await connection_timeout(gw) == "4s"

    async def logged() -> bool:  # INFO lines reach the log within 0.2 s
        return "config.yaml reloaded" in gw.log()

    await gw.wait_until(logged, "the reload in the log")
    log = gw.log()
    assert log.index("SIGHUP: reading config.yaml") < log.index("config.yaml reloaded")
    gw.proc.poll()
    assert gw.proc.returncode is None  # SIGHUP does not stop it

    # A file removed keeps the settings, and says so.
    path.unlink()
    assert "the file is gone" in await wait_note(gw, "config_missing")
    assert await connection_timeout(gw) == "4s"
