"""``/api/v1/settings/load-balancing`` and ``/api/v1/settings/timeouts`` (SPEC §8): shapes,
partial PUTs with strings and numbers, every §3.1 limit one step over (422 naming the dotted
YAML path, file unchanged), and the regenerated ``timeouts.health_check`` (§3.2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import proxy.settings.config_file
import proxy.settings.store
from tests.client import Reply, request
from tests.conftest import RunningGateway, StartGateway

LB = "/api/v1/settings/load-balancing"
TIMEOUTS = "/api/v1/settings/timeouts"


async def put(gw: RunningGateway, path: str, body: Any) -> Reply:
    secret = gw.gateway.settings.secrets.admin_token
    return await request(gw.unix, "PUT", path, json.dumps(body).encode(),
                         [("authorization", f"Bearer {secret}")])


def config_file(gw: RunningGateway) -> Path:
    return gw.gateway.settings.data_dir / "config.yaml"


def on_disk(gw: RunningGateway) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(config_file(gw).read_text())
    return doc


AFFINITY = {"block_chars": 512, "max_blocks": 200000, "load_bound": 1}


async def test_load_balancing(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    got = await request(gw.unix, "GET", LB)
    assert got.status == 200
    assert got.json() == {"enabled": False, "strategy": "cache-aware", "failoverEnabled": True,
                          "preferLoaded": True, "spillOver": False, "affinity": AFFINITY,
                          "healthCheckInterval": "5s"}
    assert (await request(gw.unix, "PUT", LB, b'{"enabled": true}')).status == 401
    on = await put(gw, LB, {"enabled": True, "strategy": "fastest"})
    assert on.status == 200
    assert on.json() == {"enabled": True, "strategy": "fastest", "failoverEnabled": True,
                         "preferLoaded": True, "spillOver": False, "affinity": AFFINITY,
                         "healthCheckInterval": "5s"}
    assert on_disk(gw)["load_balancing"] == {"enabled": True, "strategy": "fastest",
                                             "failover_enabled": True, "prefer_loaded": True,
                                             "spill_over": False, "affinity": AFFINITY}
    off = await put(gw, LB, {"preferLoaded": False})
    assert off.json()["preferLoaded"] is False
    assert on_disk(gw)["load_balancing"]["prefer_loaded"] is False
    assert gw.gateway.ctx.config.load_balancing.prefer_loaded is False
    assert (await put(gw, LB, {"preferLoaded": True})).status == 200
    assert gw.gateway.ctx.config.load_balancing.strategy == "fastest"  # live
    # The interval as a number of seconds, then as a string; health_check is regenerated.
    assert (await put(gw, LB, {"healthCheckInterval": 10})).json()["healthCheckInterval"] \
        == "10s"
    doc = on_disk(gw)
    assert doc["health_checks"] == {"interval": "10s", "timeout": "4s"}
    assert doc["timeouts"]["health_check"] == {"timeout": "4s", "interval": "10s"}
    short = await put(gw, LB, {"healthCheckInterval": "3s", "failoverEnabled": False})
    assert short.json()["healthCheckInterval"] == "3s"
    assert short.json()["failoverEnabled"] is False
    assert on_disk(gw)["timeouts"]["health_check"] == {"timeout": "2s", "interval": "3s"}
    assert gw.gateway.ctx.config.timeouts.health_check.timeout == 2.0
    before = config_file(gw).read_bytes()
    for body, param in (({"strategy": "random"}, "load_balancing.strategy"),
                        ({"enabled": "yes"}, "load_balancing.enabled"),
                        ({"failoverEnabled": 1}, "load_balancing.failover_enabled"),
                        ({"healthCheckInterval": 0}, "health_checks.interval"),
                        ({"healthCheckInterval": "soon"}, "health_checks.interval"),
                        ({"healthCheckInterval": True}, "health_checks.interval"),
                        ({"strategy": "round-robin", "healthCheckInterval": -1},
                         "health_checks.interval"),
                        ({"weights": {}}, "weights")):
        reply = await put(gw, LB, body)
        assert reply.status == 422, body
        assert reply.json()["error"]["param"] == param, body
    assert config_file(gw).read_bytes() == before
    assert gw.gateway.ctx.config.load_balancing.strategy == "fastest"


async def test_cache_aware_settings(start_gateway: StartGateway) -> None:
    """SPEC §15's keys through the settings API: spillOver and the affinity tree (YAML keys,
    as the timeouts tree), a partial affinity write keeps the rest; limits are 422s that
    name the dotted path and change nothing."""
    gw = await start_gateway([])
    changed = await put(gw, LB, {"spillOver": True, "affinity": {"block_chars": 1024}})
    assert changed.status == 200, changed.body
    assert changed.json()["spillOver"] is True
    assert changed.json()["affinity"] == {**AFFINITY, "block_chars": 1024}
    lb = gw.gateway.ctx.config.load_balancing
    assert (lb.spill_over, lb.affinity.block_chars, lb.affinity.max_blocks) == (True, 1024,
                                                                               200000)
    assert on_disk(gw)["load_balancing"]["affinity"]["block_chars"] == 1024
    before = config_file(gw).read_bytes()
    for body, param in (({"affinity": {"block_chars": 32}}, "load_balancing.affinity.block_chars"),
                        ({"affinity": {"max_blocks": -1}}, "load_balancing.affinity.max_blocks"),
                        ({"affinity": {"load_bound": -1}}, "load_balancing.affinity.load_bound"),
                        ({"affinity": {"blocks": 3}}, "load_balancing.affinity.blocks"),
                        ({"spillOver": "yes"}, "load_balancing.spill_over")):
        reply = await put(gw, LB, body)
        assert reply.status == 422, body
        assert reply.json()["error"]["param"] == param, (body, reply.json())
    assert config_file(gw).read_bytes() == before


async def test_timeouts_get_and_partial_put(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    got = await request(gw.unix, "GET", TIMEOUTS)
    assert got.status == 200
    assert got.json() == {
        "connection": "10s",
        "request": {"standard": {"first_byte": "30s", "total": "5m"},
                    "streaming": {"first_byte": "2m", "chunk_interval": "30s", "total": "10m"},
                    "image_generation": {"first_byte": "1m", "total": "3m"},
                    "queue": "10m"},
        "model_load": "2m",
        "health_check": {"timeout": "4s", "interval": "5s"},
    }
    changed = await put(gw, TIMEOUTS, {"connection": 12,
                                       "request": {"streaming": {"total": "15m"},
                                                   "standard": {"total": 90.5}}})
    assert changed.status == 200, changed.body
    doc = changed.json()
    assert doc["connection"] == "12s"
    assert doc["request"]["streaming"] == {"first_byte": "2m", "chunk_interval": "30s",
                                           "total": "15m"}
    assert doc["request"]["standard"] == {"first_byte": "30s", "total": "90.5s"}
    assert on_disk(gw)["timeouts"] == doc
    live = gw.gateway.ctx.config.timeouts
    assert (live.connection, live.request.streaming.total) == (12.0, 900.0)
    # At each limit exactly: accepted.
    edge = await put(gw, TIMEOUTS, {"connection": "15s", "request": {
        "standard": {"total": "9m"},
        "streaming": {"total": "20m", "first_byte": "8m", "chunk_interval": "60s"}}})
    assert edge.status == 200, edge.body
    assert (await put(gw, TIMEOUTS, {"request": {"streaming": {"chunk_interval": "1s"}}})
            ).status == 200
    # health_check is generated from health_checks: values given for it go there.
    hc = await put(gw, TIMEOUTS, {"health_check": {"interval": "2s"}})
    assert hc.status == 200
    assert hc.json()["health_check"] == {"timeout": "1s", "interval": "2s"}
    assert on_disk(gw)["health_checks"] == {"interval": "2s", "timeout": "4s"}
    assert (await request(gw.unix, "GET", LB)).json()["healthCheckInterval"] == "2s"
    assert (await request(gw.unix, "PUT", TIMEOUTS, b"{}")).status == 401


@pytest.mark.parametrize(("body", "param"), [
    ({"request": {"standard": {"total": "541s"}}}, "timeouts.request.standard.total"),
    ({"request": {"streaming": {"total": "1201s"}}}, "timeouts.request.streaming.total"),
    ({"request": {"streaming": {"first_byte": "481s"}}},
     "timeouts.request.streaming.first_byte"),
    ({"request": {"streaming": {"chunk_interval": 61}}},
     "timeouts.request.streaming.chunk_interval"),
    ({"request": {"streaming": {"chunk_interval": "999ms"}}},
     "timeouts.request.streaming.chunk_interval"),
    ({"connection": "15001ms"}, "timeouts.connection"),
    ({"connection": 0}, "timeouts.connection"),
    ({"request": {"image_generation": {"total": -1}}},
     "timeouts.request.image_generation.total"),
    ({"request": {"standard": {"first_byte": "0s"}}}, "timeouts.request.standard.first_byte"),
    ({"request": {"standard": {"first_byte": "later"}}},
     "timeouts.request.standard.first_byte"),
    ({"request": {"standard": {"first_byte": False}}},
     "timeouts.request.standard.first_byte"),
    ({"request": {"standard": {"first_byte": None}}},
     "timeouts.request.standard.first_byte"),
    ({"request": {"standard": {"slow": "1s"}}}, "timeouts.request.standard.slow"),
    ({"request": {"streaming": "30s"}}, "timeouts.request.streaming"),
    ({"overall": "1s"}, "timeouts.overall"),
    ({"health_check": {"interval": 0}}, "timeouts.health_check.interval"),
    ({"health_check": {"timeout": "-2s"}}, "timeouts.health_check.timeout"),
    # A valid change alongside an invalid one changes nothing either.
    ({"connection": "5s", "request": {"streaming": {"total": "21m"}}},
     "timeouts.request.streaming.total"),
])
async def test_timeouts_one_step_over(start_gateway: StartGateway, body: dict[str, Any],
                                      param: str) -> None:
    gw = await start_gateway([])
    before = config_file(gw).read_bytes()
    config = gw.gateway.ctx.config
    reply = await put(gw, TIMEOUTS, body)
    assert reply.status == 422, reply.body
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(param)
    assert config_file(gw).read_bytes() == before
    assert gw.gateway.ctx.config is config


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every settings write fails from now on, as on a full disk."""
    def write(path: Path, data: bytes, mode: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(proxy.settings.store, "atomic_write", write)

    monkeypatch.setattr(proxy.settings.config_file, "atomic_write", write)


@pytest.mark.parametrize(("path", "body"), [
    (LB, {"enabled": True}),
    (TIMEOUTS, {"connection": "5s"}),
    ("/api/v1/settings/api", {"port": 4242}),
])
async def test_a_failed_write_answers_500_and_changes_nothing(
        start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch, path: str,
        body: dict[str, Any]) -> None:
    gw = await start_gateway([])
    before, config = config_file(gw).read_bytes(), gw.gateway.settings.config
    disk_full(monkeypatch)
    reply = await put(gw, path, body)
    assert reply.status == 500
    assert reply.json() == {"error": {
        "message": "cannot save the settings: No space left on device", "type": "server_error",
        "code": "internal_error", "param": None}}
    assert config_file(gw).read_bytes() == before
    assert gw.gateway.settings.config is config
    notes = (await request(gw.unix, "GET", "/api/v1/notifications")).json()["notifications"]
    assert not any(n["code"] == "restart_required" for n in notes)
    assert (await request(gw.unix, "GET", LB)).status == 200  # the connection still serves
