"""Access keys through the API and the CLI, the settings/api endpoint, notifications, and
the API-key format check at start (SPEC §5, §8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

import proxy.settings.store
from proxy.settings.store import Settings
from tests.client import request
from tests.conftest import (
    RunningGateway,
    StartGateway,
    admin,
    admin_headers,
)

SLUICE = [sys.executable, "-m", "proxy"]


def data_dir(gw: RunningGateway) -> Path:
    return gw.gateway.settings.data_dir


# ------------------------------------------------------------------------- the API


async def test_create_list_revoke(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    made = await admin(gw, "POST", "/api/v1/access-keys", {"name": "laptop"})
    assert made.status == 201
    doc = made.json()
    assert set(doc) == {"id", "name", "key", "createdAt", "models", "rpm", "expiresAt",
                        "priority"}
    assert doc["priority"] == "interactive"
    assert (doc["models"], doc["rpm"], doc["expiresAt"]) == (None, None, None)
    assert doc["name"] == "laptop"
    assert doc["key"].startswith("sk-sluice-")
    unnamed = (await admin(gw, "POST", "/api/v1/access-keys")).json()
    assert unnamed["name"] == ""
    listed = await request(gw.unix, "GET", "/api/v1/access-keys")
    assert listed.status == 200
    unlimited = {"models": None, "rpm": None, "expiresAt": None, "priority": "interactive",
                 "expired": False}
    assert listed.json() == [
        {"id": doc["id"], "name": "laptop", "createdAt": doc["createdAt"], "lastUsedAt": None,
         **unlimited},
        {"id": unnamed["id"], "name": "", "createdAt": unnamed["createdAt"],
         "lastUsedAt": None, **unlimited},
    ]
    assert doc["key"] not in listed.body.decode()
    # secrets.yaml holds the hash only.
    text = (data_dir(gw) / "secrets.yaml").read_text()
    assert doc["key"] not in text
    assert "sha256:" in text
    assert Settings.open(data_dir(gw)).keys.all[0]["id"] == doc["id"]
    gone = await admin(gw, "DELETE", f"/api/v1/access-keys/{doc['id']}")
    assert gone.status == 200
    assert [k["id"] for k in (await request(gw.unix, "GET", "/api/v1/access-keys")).json()] \
        == [unnamed["id"]]
    again = await admin(gw, "DELETE", f"/api/v1/access-keys/{doc['id']}")
    assert again.status == 404
    assert (await admin(gw, "PUT", "/api/v1/access-keys")).status == 405


async def test_create_refuses_bad_input(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    for body in (b"[1]", b"{nope"):
        reply = await request(gw.unix, "POST", "/api/v1/access-keys", body, admin_headers(gw))
        assert reply.status == 400, body
        assert reply.json()["error"]["type"] == "invalid_request_error"
    # A bad field: 422 naming it (SPEC §13).
    for body, param in ((b'{"name": 5}', "name"), (b'{"name": "a\\nb"}', "name"),
                        (b'{"other": 1}', "other")):
        reply = await request(gw.unix, "POST", "/api/v1/access-keys", body, admin_headers(gw))
        assert reply.status == 422, body
        error = reply.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), body
    assert gw.gateway.settings.keys.all == ()


async def test_last_used_is_recorded_once_a_minute(start_gateway: StartGateway) -> None:
    gw = await start_gateway([], require_auth=True)
    key = (await admin(gw, "POST", "/api/v1/access-keys")).json()["key"]
    secrets_file = data_dir(gw) / "secrets.yaml"
    before = secrets_file.stat().st_mtime_ns
    headers = [("authorization", f"Bearer {key}")]
    assert (await request(gw.tcp, "GET", "/v1/models", None, headers)).status == 200
    first = secrets_file.stat().st_mtime_ns
    assert first != before
    used = (await request(gw.unix, "GET", "/api/v1/access-keys")).json()[0]["lastUsedAt"]
    assert used is not None
    assert used.endswith("Z")
    for _ in range(5):
        assert (await request(gw.tcp, "GET", "/v1/models", None, headers)).status == 200
    keys = gw.gateway.settings.keys
    entry = keys.all[0]
    if entry["last_used_at"][:16] == used[:16]:  # same minute: the file was not rewritten
        assert secrets_file.stat().st_mtime_ns == first
    keys.all = (entry.changed(last_used_at="2000-01-01T00:00:00Z"),)  # a minute later:
    await keys.used(entry.id)  # written again
    assert "2000-01-01" not in secrets_file.read_text()


# ------------------------------------------------------------------------- the CLI


async def sluice(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*SLUICE, *args], capture_stdout=True, capture_stderr=True,
                                  check=False)


# ------------------------------------------------------------------------- settings/api


async def test_settings_api(start_gateway: StartGateway, short_tmp: Path) -> None:
    gw = await start_gateway([])
    got = await request(gw.unix, "GET", "/api/v1/settings/api")
    assert got.status == 200
    assert got.json() == {"enabled": True, "port": 0, "allowExternalAccess": False,
                          "requireAuth": False, "socketDir": str(short_tmp / "g1" / "s"),
                          "nodePort": 39443, "restartRequired": False, "identity": None}
    assert (await request(gw.unix, "PUT", "/api/v1/settings/api", b"{}")).status == 401
    # requireAuth applies at once, and needs no restart.
    live = await admin(gw, "PUT", "/api/v1/settings/api", {"requireAuth": True})
    assert live.status == 200
    assert live.json()["requireAuth"] is True
    assert live.json()["restartRequired"] is False
    assert (await request(gw.tcp, "GET", "/v1/models")).status == 401
    config_file = data_dir(gw) / "config.yaml"
    assert "require_auth: true" in config_file.read_text()
    # Port and socket dir apply at restart.
    moved = await admin(gw, "PUT", "/api/v1/settings/api",
                             {"port": 39999, "socketDir": "/tmp/sl-other"})
    assert moved.status == 200
    assert moved.json()["port"] == 39999
    assert moved.json()["restartRequired"] is True
    text = config_file.read_text()
    assert "port: 39999" in text
    assert "/tmp/sl-other" in text
    assert (await request(gw.unix, "GET", "/api/v1/settings/api")).json()["restartRequired"]
    notes = (await request(gw.unix, "GET", "/api/v1/notifications")).json()["notifications"]
    assert any(n["code"] == "restart_required" for n in notes)
    # Invalid values: 422 naming the dotted YAML path, nothing changed.
    before = config_file.read_text()
    for body, param in (({"socketDir": "/tmp/" + "x" * 70}, "local.socket_dir"),
                        ({"port": 70000}, "api.port"),
                        ({"port": "80"}, "api.port"),
                        ({"enabled": "yes"}, "api.enabled"),
                        ({"requireAuth": False, "port": -1}, "api.port"),
                        ({"bogus": 1}, "bogus")):
        reply = await admin(gw, "PUT", "/api/v1/settings/api", body)
        assert reply.status == 422, body
        assert reply.json()["error"]["param"] == param
    assert config_file.read_text() == before
    assert gw.gateway.settings.config.api.require_auth is True
    assert (await admin(gw, "PUT", "/api/v1/settings/api", [1])).status == 400


async def test_settings_put_accepts_the_gets_own_shape(start_gateway: StartGateway) -> None:
    """SPEC §8: read-only fields the GET shows (restartRequired) are ignored when sent back;
    a field the GET never shows is still refused."""
    gw = await start_gateway([])
    for path in ("/api/v1/settings/api", "/api/v1/settings/load-balancing",
                 "/api/v1/settings/timeouts"):
        shown = (await request(gw.unix, "GET", path)).json()
        back = await admin(gw, "PUT", path, shown)
        assert back.status == 200, (path, back.json())
        assert back.json() == shown
    shown = (await request(gw.unix, "GET", "/api/v1/settings/api")).json()
    flipped = await admin(gw, "PUT", "/api/v1/settings/api",
                               {**shown, "requireAuth": True, "restartRequired": True})
    assert flipped.status == 200
    assert flipped.json()["requireAuth"] is True
    assert flipped.json()["restartRequired"] is False  # computed, not taken from the body
    unknown = await admin(gw, "PUT", "/api/v1/settings/api", {**shown, "bogus": 1})
    assert (unknown.status, unknown.json()["error"]["param"]) == (422, "bogus")


async def test_a_failed_write_makes_and_revokes_nothing(
        start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await start_gateway([])
    made = (await admin(gw, "POST", "/api/v1/access-keys", {"name": "kept"})).json()
    secrets_file = data_dir(gw) / "secrets.yaml"
    before = secrets_file.read_bytes()
    listed = gw.gateway.settings.keys.all

    def write(path: Path, data: bytes, mode: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(proxy.settings.store, "atomic_write", write)
    for method, path in (("POST", "/api/v1/access-keys"),
                         ("DELETE", f"/api/v1/access-keys/{made['id']}")):
        reply = await admin(gw, method, path)
        assert reply.status == 500, (method, reply.body)
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "internal_error")
        assert "No space left on device" in error["message"]
    assert gw.gateway.settings.keys.all is listed  # nothing replaced
    assert secrets_file.read_bytes() == before
    missing = await admin(gw, "DELETE", "/api/v1/access-keys/ak-nope")
    assert missing.status == 404
    assert missing.json()["error"]["param"] == "id"
