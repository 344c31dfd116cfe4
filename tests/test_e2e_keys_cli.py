"""API keys through the ``sluice keys`` and ``sluice status`` CLI as a child process against an
in-process gateway, and ``sluice serve`` refusing a malformed key (the rest: tests/test_keys.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.client import request
from tests.conftest import (
    StartGateway,
    gateway_config,
    open_settings,
)
from tests.test_keys import SLUICE, data_dir, sluice


async def test_keys_cli(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    folder = str(data_dir(gw))
    made = await sluice("keys", "create", "--name", "phone", "--data-dir", folder)
    assert made.returncode == 0, made.stderr
    key = made.stdout.decode().strip()
    assert key.startswith("sk-sluice-")
    assert "shown only once" in made.stderr.decode()
    stored = gw.gateway.settings.keys.all
    assert len(stored) == 1
    assert stored[0]["name"] == "phone"
    listed = await sluice("keys", "list", "--data-dir", folder)
    assert listed.returncode == 0, listed.stderr
    assert stored[0]["id"] in listed.stdout.decode()
    assert "phone" in listed.stdout.decode()
    assert key not in listed.stdout.decode()
    as_json = await sluice("keys", "list", "--json", "--data-dir", folder)
    assert json.loads(as_json.stdout)[0]["id"] == stored[0]["id"]
    batch = await sluice("keys", "create", "--name", "job", "--priority", "batch",
                         "--data-dir", folder)  # SPEC §18
    assert batch.returncode == 0, batch.stderr
    assert "batch priority" in batch.stderr.decode()
    assert gw.gateway.settings.keys.all[1]["priority"] == "batch"
    assert gw.gateway.settings.keys.all[1].limits.priority == "batch"
    back = await sluice("keys", "update", gw.gateway.settings.keys.all[1].id, "--priority",
                        "interactive", "--data-dir", folder)
    assert back.returncode == 0, back.stderr
    assert "priority" not in gw.gateway.settings.keys.all[1]
    await sluice("keys", "revoke", gw.gateway.settings.keys.all[1].id, "--data-dir", folder)
    revoked = await sluice("keys", "revoke", stored[0]["id"], "--data-dir", folder)
    assert revoked.returncode == 0, revoked.stderr
    assert gw.gateway.settings.keys.all == ()
    missing = await sluice("keys", "revoke", "ak-nope", "--data-dir", folder)
    assert missing.returncode == 1
    assert "404" in missing.stderr.decode()


async def test_cli_without_a_gateway(short_tmp: Path) -> None:
    result = await sluice("keys", "list", "--data-dir", str(short_tmp))
    assert result.returncode == 1
    assert "no gateway is running" in result.stderr.decode()


async def test_status_shows_notifications(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    gw.gateway.ctx.notifications.raise_("test_note", "something to know about")
    reply = await request(gw.unix, "GET", "/api/v1/notifications")
    assert reply.status == 200
    notes = reply.json()["notifications"]
    assert [n["code"] for n in notes] == ["test_note"]
    assert set(notes[0]) == {"code", "level", "message", "createdAt"}
    shown = await sluice("status", "--data-dir", str(data_dir(gw)))
    assert shown.returncode == 0, shown.stderr
    assert "warning: something to know about" in shown.stdout.decode()


def test_serve_refuses_a_malformed_backend_key(short_tmp: Path) -> None:
    data = short_tmp / "data"
    open_settings(data, gateway_config([], socket_dir=short_tmp / "s"))
    secret = "sk-abc DEF-do-not-print"
    doc = yaml.safe_load((data / "secrets.yaml").read_text())
    doc["backend_keys"] = {"llama": secret}
    (data / "secrets.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run([*SLUICE, "serve", "--data-dir", str(data)], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert "backend_keys.llama" in result.stderr
    assert "do-not-print" not in result.stderr + result.stdout

