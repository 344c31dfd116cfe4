"""``sluice events`` and ``sluice status --watch`` as child processes against in-process
gateways and feeds (their rendering, in process: tests/test_cli_events.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from proxy.cli.render import show
from proxy.datadir import GatewayState, write_state
from tests.client import chat_body, request
from tests.conftest import StartGateway
from tests.fakefeed import FakeFeed
from tests.fakeupstream import FakeUpstream, json_completion
from tests.gateways import reap
from tests.test_cli_events import as_fetched, entry, hello_data
from tests.test_status_pool import GPU, SPARE, health, routing_stats, stats


class Cli:
    """A ``sluice`` process whose stdout is read as it comes."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.out = ""

    @classmethod
    async def start(cls, *args: str) -> Cli:
        proc = await trio.lowlevel.open_process([sys.executable, "-m", "proxy", *args],
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return cls(proc)

    async def until(self, text: str, count: int = 1) -> None:
        assert self.proc.stdout is not None
        with trio.fail_after(15):
            while self.out.count(text) < count:
                data = await self.proc.stdout.receive_some(1 << 16)
                assert data, f"stdout ended before {text!r}: {self.out!r}"
                self.out += data.decode()

    async def finish(self) -> tuple[int, str, str]:
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        err = b""
        with trio.fail_after(15):
            while data := await self.proc.stdout.receive_some(1 << 16):
                self.out += data.decode()
            while data := await self.proc.stderr.receive_some(1 << 16):
                err += data
            code = await self.proc.wait()
        await self.kill()  # closes the pipes
        return code, self.out, err.decode()

    async def kill(self) -> None:
        """Kill it if it still runs, reap it and close its pipes, even while cancelled
        (a process left to the garbage collector warns in whichever test runs next)."""
        await reap(self.proc)
        with trio.CancelScope(shield=True):
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    await pipe.aclose()


@pytest.fixture
async def feed(nursery: trio.Nursery, short_tmp: Path) -> FakeFeed:
    fake = FakeFeed(short_tmp)
    await nursery.start(fake.serve)
    return fake


async def test_events_prints_a_line_per_frame_and_ends_when_the_gateway_stops(
        feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await feed.send("request", entry())
        await feed.send("circuit", {"fingerprint": GPU, "state": "open",
                                    "consecutiveFailures": 3})
        await feed.send("resync")
        await feed.send_text("not json")
        await feed.close(1001)
        code, out, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 5
    assert lines[0].endswith(" hello        connected to node-aa11 (sluice 0.4.0): "
                             "1 local model, 1 of 2 nodes online, 1 notification")
    assert lines[1].endswith(" request      POST /v1/chat/completions smollm2-135m 200 "
                             "local:llama ttfb 120ms 2.3s 45 events 66 tok (30 tok/s) [req-0001]")
    assert lines[2].endswith(f" circuit      {GPU} open (3 consecutive failures)")
    assert " resync       fell behind" in lines[3]
    assert lines[4] == "gateway stopped"
    assert "skipped a frame that is not a JSON object" in err


async def test_events_json_prints_the_frames_as_sent(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--json", "--types", "request,node",
                          "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await feed.send("request", entry())
        await feed.send("stats", routing_stats())
        await feed.send("node", health(GPU, "offline", None, 0, 2))
        await feed.close(1001)
        code, out, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 0, err
    frames = [json.loads(text) for text in out.splitlines()]
    assert [f["type"] for f in frames] == ["request", "node"]
    assert frames[0] == {"type": "request", "at": "2026-12-01T12:00:01.000Z", "data": entry()}
    assert err.strip() == "gateway stopped"  # stdout holds frames only


async def test_events_types_still_shows_the_feeds_own_frames(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--types", "stats", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await feed.send("request", entry())
        await feed.send("resync")
        await feed.close(1001)
        code, out, _ = await cli.finish()
    finally:
        await cli.kill()
    assert code == 0
    assert [text.split()[1] for text in out.splitlines()[:-1]] == ["hello", "resync"]


async def test_a_lost_connection_is_exit_1(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await cli.until("connected to node-aa11")
        await feed.drop()
        code, out, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 1
    assert "gateway stopped" not in out
    assert "sluice: lost the connection to the gateway" in err


async def test_another_close_code_is_exit_1(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.close(1011)
        code, _, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 1
    assert "the gateway closed the events feed (code 1011)" in err


async def test_ctrl_c_closes_the_feed_and_is_exit_0(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await cli.until("connected to node-aa11")
        cli.proc.send_signal(signal.SIGINT)
        code, _, err = await cli.finish()
        with trio.fail_after(5):
            await feed.client_gone.wait()
    finally:
        await cli.kill()
    assert code == 0, err
    assert err == ""  # no traceback, no KeyboardInterrupt
    assert feed.closed_by_client == 1000  # it said goodbye with a close frame


async def test_a_reader_that_goes_away_ends_it_quietly(feed: FakeFeed) -> None:
    cli = await Cli.start("events", "--json", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await cli.until("\n")
        assert cli.proc.stdout is not None
        await cli.proc.stdout.aclose()  # as `| head -1` does
        for _ in range(64):  # until a write fails (the pipe may hold a few)
            await feed.send("stats", routing_stats())
        with trio.fail_after(15):
            code = await cli.proc.wait()
        assert cli.proc.stderr is not None
        err = await cli.proc.stderr.receive_some(1 << 16)
    finally:
        await cli.kill()
    assert code == 0
    assert err == b""  # no traceback, no "Exception ignored"


async def test_no_gateway_and_no_feed(nursery: trio.Nursery, short_tmp: Path) -> None:
    cli = await Cli.start("events", "--data-dir", str(short_tmp / "nothing"))
    code, _, err = await cli.finish()
    assert code == 1
    assert "no gateway is running for" in err
    old = FakeFeed(short_tmp, reject=404)
    await nursery.start(old.serve)
    cli = await Cli.start("status", "--watch", "--data-dir", str(old.data_dir))
    code, _, err = await cli.finish()
    assert code == 1
    assert "this gateway has no live events (GET /api/v1/events: 404)" in err
    (short_tmp / "f").mkdir()
    foreign = FakeFeed(short_tmp / "f", reject=403)
    await nursery.start(foreign.serve)
    cli = await Cli.start("events", "--data-dir", str(foreign.data_dir))
    code, _, err = await cli.finish()
    assert code == 1
    assert "sluice: GET /api/v1/events: 403 no events here" in err
    old.socket_path = str(short_tmp / "gone.sock")  # state.json names a socket nobody has
    write_state(old.data_dir, GatewayState(pid=1, socket_path=old.socket_path))
    cli = await Cli.start("events", "--data-dir", str(old.data_dir))
    code, _, err = await cli.finish()
    assert code == 1
    assert f"cannot reach the gateway for {old.data_dir}" in err


def fetched_bodies(models: list[str], counts: dict[str, Any]) -> dict[str, Any]:
    """What the fake answers to the GETs of ``sluice status`` (admin API)."""
    hello = hello_data()
    return {"/api/v1/inference/status": {**hello["status"], "models": models},
            "/api/v1/notifications": {"notifications": hello["notifications"]},
            "/api/v1/pool/distributed-status": hello["pool"],
            "/api/v1/pool/routing-stats": counts,
            "/api/v1/nodes": [
                {"fingerprint": GPU, "name": "gpu-box", "baseUrl": "http://192.168.1.50:39080",
                 "priority": 2, "enabled": True, "hasApiKey": True},
                {"fingerprint": SPARE, "name": "spare", "baseUrl": "http://192.168.1.51:39080",
                 "priority": 1, "enabled": True, "hasApiKey": False}]}


async def test_status_watch_redraws_the_table(feed: FakeFeed) -> None:
    counts = routing_stats(stats(GPU, "gpu-box", (0, 200, 2, 0), 80.0),
                           stats(SPARE, "spare", (0, 5, 4, 0), 1534.2, "open", 3))
    feed.http = fetched_bodies(["m", "fetched-model"], counts)
    cli = await Cli.start("status", "--watch", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await cli.until("totals: requests 169")  # the first table, from hello alone
        assert cli.out == show(as_fetched(hello_data())) + "\n"
        await feed.send("stats", counts)  # counters change in place
        await cli.until("totals: requests 251")
        await feed.send("settings", {"section": "loadBalancing", "value": {"enabled": True}})
        await cli.until("models: m, fetched-model")  # fetched again over the admin API
        assert feed.gets == list(feed.http)
        await feed.send("circuit", {"fingerprint": GPU, "state": "open",
                                    "consecutiveFailures": 5})
        await cli.until(" open (5) ")
        await feed.close(1001)
        code, out, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 0, err
    assert "\x1b" not in out  # not a terminal: no screen clearing
    tables = out.split("\ngateway: running")
    assert len(tables) == 4  # hello, stats, the fetch, circuit: one table each
    assert all(t.endswith("\n") for t in tables[:-1])  # a blank line between tables
    assert out.endswith("warning: first\ngateway stopped\n")


async def test_status_watch_json_fetches_again_on_resync(feed: FakeFeed) -> None:
    feed.http = fetched_bodies(["m", "after-resync"], routing_stats())
    cli = await Cli.start("status", "--watch", "--json", "--data-dir", str(feed.data_dir))
    try:
        await feed.connected.wait()
        await feed.send("hello", hello_data())
        await cli.until("\n")
        await feed.send("resync")
        await cli.until("after-resync")
        await feed.close(1001)
        code, out, err = await cli.finish()
    finally:
        await cli.kill()
    assert code == 0, err
    first, second = (json.loads(text) for text in out.splitlines())
    assert first == as_fetched(hello_data())
    assert second["models"] == ["m", "after-resync"]
    assert second["pool"]["nodes"][0]["name"] == "gpu-box"
    assert "gateway stopped" in err


async def test_both_commands_follow_a_real_gateway(start_gateway: StartGateway,
                                                   upstream: FakeUpstream,
                                                   short_tmp: Path) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)])
    folder = str(gw.gateway.settings.data_dir)
    # A state.json that names only the TCP port (as when no socket folder works).
    tcp_only = short_tmp / "tcp-only"
    tcp_only.mkdir()
    write_state(tcp_only, GatewayState(pid=os.getpid(), tcp_port=gw.gateway.ctx.tcp_port))
    events = await Cli.start("events", "--data-dir", folder)
    watch = await Cli.start("status", "--watch", "--data-dir", folder)
    over_tcp = await Cli.start("events", "--types", "request", "--data-dir", str(tcp_only))
    try:
        await events.until(" hello ")
        await watch.until("load balancing: off")
        await over_tcp.until(" hello ")
        reply = await request(gw.unix, "POST", "/v1/chat/completions", chat_body())
        assert reply.status == 200
        await events.until(" request ")
        gw.gateway.shutdown()  # the gateway stops: close code 1001
        code, out, err = await events.finish()
        assert code == 0, err
        watched, drawn, watch_err = await watch.finish()
        assert watched == 0, watch_err
        tcp_code, tcp_out, tcp_err = await over_tcp.finish()
        assert tcp_code == 0, tcp_err
    finally:
        for cli in (events, watch, over_tcp):
            await cli.kill()
    lines = out.splitlines()
    fingerprint = gw.gateway.settings.node_id
    assert f" hello        connected to {fingerprint} (sluice " in lines[0]
    request_id = reply.header("x-sluice-request-id")
    served = next(t for t in lines if " request " in t)
    assert " request      POST /v1/chat/completions fake-model 200 local:fake ttfb " in served
    assert " 1 tok (" in served  # the upstream's usage: 1 completion token
    assert served.endswith(f" tok/s) [{request_id}]")
    assert lines[-1] == "gateway stopped"
    assert drawn.startswith(f"gateway: running; local socket {gw.gateway.ctx.socket_path}")
    assert "models: fake-model" in drawn
    assert drawn.endswith("gateway stopped\n")
    tcp_lines = tcp_out.splitlines()
    assert [t.split()[1] for t in tcp_lines[:-1]] == ["hello", "request"]
    assert tcp_lines[-1] == "gateway stopped"
    token = gw.gateway.settings.secrets.admin_token
    assert token not in out + err + drawn + watch_err

