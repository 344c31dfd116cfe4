"""``sluice events`` and ``sluice status --watch`` (SPEC §9.3, issue 12): the line of each
frame type and the watched status (pure), then the commands as real processes against a
real trio-websocket server on a Unix socket (tests/fakefeed.py) that plays the gateway's
side of the feed: their lines, their redraws and how they end (exit codes)."""

from __future__ import annotations

import json
from datetime import UTC, timedelta, timezone
from pathlib import Path
from typing import Any

import trio
import trio.testing

from proxy.cli.feed import Ending, follow
from proxy.cli.lines import EVENT_TYPES, frame_line, wall_clock
from proxy.cli.render import show
from proxy.cli.view import CLEAR, Change, WatchView, screen
from proxy.datadir import read_state
from proxy.observe.hub import TYPES
from tests.fakefeed import FakeFeed
from tests.test_status_pool import GPU, SPARE, SUMMARY, health, routing_stats, stats

AT = "2026-12-01T12:00:01.250Z"


def line(kind: str, data: Any = None) -> str:
    frame: dict[str, Any] = {"type": kind, "at": AT}
    if data is not None:
        frame["data"] = data
    return frame_line(frame, UTC)


def entry(**changes: Any) -> dict[str, Any]:
    """A request-log entry (SPEC §9.1)."""
    doc = {"id": "req-0001", "startedAt": "2026-12-01T12:00:00.000Z", "method": "POST",
           "path": "/v1/chat/completions", "model": "smollm2-135m", "stream": True,
           "transport": "unix", "servedBy": "local:llama", "status": 200,
           "outcome": "success", "failover": None, "ttfbMs": 120.0, "durationMs": 2300.0,
           "bytesOut": 9000, "events": 45,
           "usage": {"prompt_tokens": 12, "completion_tokens": 66, "total_tokens": 78},
           "error": None}
    return {**doc, **changes}


# ------------------------------------------------------------------------- one line each


def test_the_cli_knows_the_hubs_event_types() -> None:
    assert EVENT_TYPES == TYPES


def test_request_line() -> None:
    # 66 tokens over the 2.18 s after the first byte: 30 tok/s.
    assert line("request", entry()) == (
        "12:00:01 request      POST /v1/chat/completions smollm2-135m 200 local:llama "
        "ttfb 120ms 2.3s 45 events 66 tok (30 tok/s) [req-0001]")
    whole = entry(stream=False, events=None, ttfbMs=800.5, durationMs=812.0,
                  usage={"input_tokens": 3, "output_tokens": 4})
    # A whole answer's first byte comes when it is all made: the rate is over all of it.
    assert line("request", whole).endswith("ttfb 800ms 812ms 4 tok (4.9 tok/s) [req-0001]")
    failed = entry(servedBy="node:node-77aa", status=502, outcome="failure",
                   failover="node-3f9a", error="upstream_error", ttfbMs=None,
                   durationMs=61_400.0, events=None, usage=None, id=None)
    assert line("request", failed) == (
        "12:00:01 request      POST /v1/chat/completions smollm2-135m 502 node:node-77aa "
        "failure (upstream_error) after node-3f9a failed 1m01s")
    refused = entry(model=None, servedBy=None, status=404, outcome="refused",
                    error="model_not_found", ttfbMs=None, durationMs=0.42, events=None,
                    usage=None)
    assert line("request", refused) == (
        "12:00:01 request      POST /v1/chat/completions - 404 - refused (model_not_found) "
        "0.4ms [req-0001]")
    slow = entry(usage={"prompt_tokens": 1, "completion_tokens": 3}, ttfbMs=100.0,
                 durationMs=1100.0)
    assert "3 tok (3.0 tok/s)" in line("request", slow)
    # A long prompt behind keep-alive comments: the first byte at 30 s, the first token at
    # 95 s; 60 tokens over the 5 s after it, not over the 70 s after the first comment.
    prefill = entry(ttfbMs=30_000.0, ttftMs=95_000.0, durationMs=100_000.0,
                    usage={"prompt_tokens": 7000, "completion_tokens": 60})
    assert line("request", prefill).endswith(
        "ttfb 30.0s ttft 1m35s 1m40s 45 events 60 tok (12 tok/s) [req-0001]")
    same = entry(ttftMs=120.0)  # no comment before the first event: one figure
    assert line("request", same) == line("request", entry())


def test_node_and_circuit_lines() -> None:
    up = health(GPU, "online", 12, 3, 2)
    assert line("node", up) == (f"12:00:01 node         {GPU} (http://192.168.1.50:39080) "
                                "online, 12ms, 3 models, priority 2")
    down = {**health(SPARE, "offline", None, 0, 1), "lastError": "connection refused"}
    assert line("node", down).endswith("offline, 0 models, priority 1: connection refused")
    assert line("circuit", {"fingerprint": GPU, "state": "open", "consecutiveFailures": 3}) \
        == f"12:00:01 circuit      {GPU} open (3 consecutive failures)"
    assert line("circuit", {"fingerprint": GPU, "state": "half_open",
                            "consecutiveFailures": 1}).endswith("half-open (1 consecutive failure)")
    assert line("circuit", {"fingerprint": GPU, "state": "closed",
                            "consecutiveFailures": 0}).endswith(f"{GPU} closed")


def test_settings_line_never_shows_a_secret() -> None:
    lb = {"enabled": True, "strategy": "priority", "failoverEnabled": True,
          "healthCheckInterval": "10s"}
    assert line("settings", {"section": "loadBalancing", "value": lb}) == (
        "12:00:01 settings     loadBalancing: enabled true, strategy priority, "
        "failoverEnabled true, healthCheckInterval 10s")
    timeouts = {"connection": "10s", "request": {"streaming": {"total": "30m"}}}
    assert line("settings", {"section": "timeouts", "value": timeouts}).endswith(
        "timeouts: connection 10s, request.streaming.total 30m")
    nodes = [{"fingerprint": GPU, "hasApiKey": True, "apiKey": "node-secret-1"},
             {"fingerprint": SPARE, "note": "sk-sluice-abcdefabcdef"}]
    text = line("settings", {"section": "nodes", "value": nodes})
    assert "node-secret-1" not in text
    assert "sk-sluice-" not in text
    assert '"hasApiKey":true' in text
    tokens = line("settings", {"section": "api", "value": {"adminToken": "t0p-secret",
                                                           "requireAuth": True}})
    assert tokens.endswith("api: adminToken (hidden), requireAuth true")


def test_notification_stats_model_and_feed_lines() -> None:
    note = {"code": "socket_fallback", "level": "warning",
            "message": "no socket folder works; listening on loopback TCP"}
    assert line("notification", note) == (
        "12:00:01 notification warning: no socket folder works; listening on loopback TCP "
        "(socket_fallback)")
    assert line("notification", {"code": "socket_fallback", "cleared": True}) == \
        "12:00:01 notification cleared socket_fallback"
    body = routing_stats(stats(GPU, "gpu-box", (1, 117, 2, 0), 85.3),
                         stats(SPARE, "spare", (0, 5, 4, 0), 1534.2, "open", 3), failovers=2)
    assert line("stats", body) == (
        "12:00:01 stats        requests 169, successes 161, failures 6, aborted 1, "
        f"failovers 2, in flight 1, circuit not closed: {SPARE}")
    backend = {"source": "backend", "name": "llama", "kind": "llm", "online": False,
               "models": [], "lastError": "connection refused"}
    assert line("model", backend) == \
        "12:00:01 model        backend llama: offline, 0 models: connection refused"
    server = {"source": "managed", "name": "smollm2-135m", "state": "running", "pid": 4242,
              "address": "127.0.0.1:41000", "restarts": 1, "lastError": None}
    assert line("model", server).endswith(
        "model server smollm2-135m: running, pid 4242, 127.0.0.1:41000, 1 restart")
    assert line("model", {"name": "x", "online": True}).endswith("model        x: online")
    hello = {"fingerprint": "node-aa11", "version": "0.4.0",
             "status": {"models": ["a", "b"], "distributed": SUMMARY},
             "notifications": [note], "pool": {}, "stats": {}, "settings": {}}
    assert line("hello", hello) == ("12:00:01 hello        connected to node-aa11 (sluice 0.4.0):"
                                    " 2 local models, 1 of 2 nodes online, 1 notification")
    assert line("resync").startswith("12:00:01 resync       fell behind:")
    assert line("later", {"x": 1, "token": "abc"}) == \
        '12:00:01 later        {"x":1,"token":"(hidden)"}'


def test_lines_are_one_printable_line() -> None:
    evil = entry(model="m\x1b[2J\nnext", path="/v1/\r\x07x")
    text = line("request", evil)
    assert not {"\x1b", "\n", "\r"} & set(text)
    assert "m?[2J?next" in text
    long = line("notification", {"message": "x" * 5000})
    assert len(long) < 450
    assert long.endswith("…")
    assert frame_line({"type": "resync"}, UTC).startswith("--:--:-- resync ")
    assert frame_line({"type": "node", "at": "yesterday", "data": "nope"}, UTC) == \
        "--:--:-- node         - -"


def test_wall_clock_is_shown_in_the_given_zone() -> None:
    assert wall_clock("2026-12-01T23:59:58.9Z", UTC) == "23:59:58"
    assert wall_clock("2026-12-01T23:59:58+00:00", timezone(timedelta(hours=2))) == "01:59:58"
    assert wall_clock("2026-12-01T23:59:58", UTC) == "23:59:58"  # no zone: UTC
    assert wall_clock(None) == "--:--:--"


# ------------------------------------------------------------------------ the watched view


def hello_data() -> dict[str, Any]:
    status = {"socketPath": "/run/sluice.sock", "routerPort": 39080, "models": ["m"],
              "loadedModels": 1, "backends": [], "managedModels": [], "distributed": SUMMARY}
    pool = {"enabled": True, "strategy": "priority", "totalNodes": 2, "onlineNodes": 1,
            "models": [], "endpoints": [health(GPU, "online", 12, 3, 2),
                                        health(SPARE, "offline", None, 0, 1)]}
    body = routing_stats(stats(GPU, "gpu-box", (1, 117, 2, 0), 85.34),
                         stats(SPARE, "spare", (0, 5, 4, 0), 1534.2, "open", 3), failovers=2)
    return {"fingerprint": "node-aa11", "version": "0.4.0", "status": status, "pool": pool,
            "stats": body, "settings": {}, "notifications": [
                {"code": "c1", "level": "warning", "message": "first"}]}


def frame(kind: str, data: Any = None) -> dict[str, Any]:
    return {"type": kind, "at": AT, "data": data}


def as_fetched(hello: dict[str, Any]) -> dict[str, Any]:
    """The document ``sluice status`` would have fetched for the same gateway."""
    return {**hello["status"], "notifications": hello["notifications"],
            "pool": {"distributedStatus": hello["pool"], "routingStats": hello["stats"],
                     "nodes": None}}


def row(view: WatchView, fingerprint: str) -> list[str]:
    """The cells of one node's row of the table, split at spaces."""
    return next(text for text in view.text().splitlines() if f"({fingerprint})" in text).split()


def test_hello_draws_what_sluice_status_prints() -> None:
    view = WatchView()
    assert view.apply(frame("stats", {})) == Change()  # nothing before hello
    assert view.text() == ""
    assert view.apply(frame("hello", hello_data())) == Change(redraw=True)
    assert view.text() == show(as_fetched(hello_data()))
    assert "   2 gpu-box (node-3f9a1c0b5e2d7a41) online" in view.text()


def test_events_change_the_table_in_place() -> None:
    view = WatchView()
    view.apply(frame("hello", hello_data()))
    up = health(SPARE, "online", 40, 2, 1)
    assert view.apply(frame("node", up)) == Change(redraw=True, refetch=True)
    assert "2 of 2 nodes online" in view.text()
    assert row(view, SPARE)[3:8] == ["online", "40ms", "2", "open", "(3)"]
    assert view.apply(frame("circuit", {"fingerprint": SPARE, "state": "closed",
                                        "consecutiveFailures": 0})) == Change(redraw=True)
    assert row(view, SPARE)[3:7] == ["online", "40ms", "2", "closed"]
    counts = routing_stats(stats(GPU, "gpu-box", (0, 200, 2, 0), 80.0),
                           stats(SPARE, "spare", (0, 5, 4, 0), 1534.2))
    view.apply(frame("stats", counts))
    assert "totals: requests 251" in view.text()
    view.apply(frame("notification", {"code": "c2", "level": "error", "message": "second"}))
    view.apply(frame("notification", {"code": "c1", "level": "warning", "message": "again"}))
    assert view.text().splitlines()[-2:] == ["warning: again", "error: second"]
    view.apply(frame("notification", {"code": "c1", "cleared": True}))
    assert view.text().splitlines()[-1] == "error: second"
    for kind in ("settings", "model"):
        assert view.apply(frame(kind, {"section": "api", "value": {}})) == \
            Change(refetch=True)
    assert view.apply({"type": "resync", "at": AT}) == Change(refetch=True)
    # A node it does not list yet: nothing to patch, the fetch shows it.
    assert view.apply(frame("node", health("node-new", "online", 1, 1, 3))) == \
        Change(refetch=True)


def test_a_fetch_keeps_the_events_that_came_while_it_ran() -> None:
    view = WatchView()
    view.apply(frame("hello", hello_data()))
    view.fetch_started()
    view.apply(frame("circuit", {"fingerprint": SPARE, "state": "half_open",
                                 "consecutiveFailures": 3}))
    older = as_fetched(hello_data())  # the answer was made before the event
    older["models"] = ["m", "fetched"]
    assert view.fetch_done(older) is False
    assert "models: m, fetched" in view.text()
    assert "half-open (3)" in view.text()  # the event, applied again on the answer
    view.fetch_started()
    view.apply(frame("settings", {"section": "loadBalancing", "value": {}}))
    assert view.fetch_done(None, "GET /api/v1/inference/status: 500 boom") is True
    assert view.text().endswith("(not refreshed: GET /api/v1/inference/status: 500 boom)")


def test_screen() -> None:
    assert screen("table", None, tty=False) == "table\n"
    assert screen("table", "table", tty=False) is None
    assert screen("table 2", "table", tty=False) == "\ntable 2\n"
    assert screen("table", None, tty=True, footer="Ctrl-C") == CLEAR + "table\n\nCtrl-C\n"
    assert screen("", None, tty=True) is None


# -------------------------------------------------------------------- the real commands


async def test_a_gateway_that_stops_answering_pings_is_lost(
        nursery: trio.Nursery, short_tmp: Path, autojump_clock: trio.testing.MockClock) -> None:
    silent = FakeFeed(short_tmp, silent=True)
    await nursery.start(silent.serve)
    seen: list[str] = []
    state = read_state(silent.data_dir)
    assert state is not None

    async def hello() -> None:
        await silent.connected.wait()
        await silent.send("hello", hello_data())

    nursery.start_soon(hello)
    ending = await follow(state, silent.data_dir, seen.append)
    assert ending == Ending("lost", reason="no answer to a ping in 15s")
    assert json.loads(seen[0])["type"] == "hello"
    assert trio.current_time() >= 45  # a ping after 30 s, 15 s for its pong


# ------------------------------------------------------------------------- a real gateway


