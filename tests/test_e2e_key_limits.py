"""Access keys with limits end to end (SPEC §13): real ``sluice serve`` processes over TCP in
front of a fake model server. The API's 422s name the field, PATCH of an unknown key is 404,
rpm answers 429 with Retry-After and lets the next request through once refilled, a model
outside the key's list is 403 in OpenAI's and Anthropic's shapes, a key past its expiry is
401, PATCH applies at once; a request gateway A forwards to gateway B with B's key is held to
that key's limits; ``sluice keys create|list|update``."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import yaml

from tests.client import CHAT, Reply, chat_body, error_of, request
from tests.fakeupstream import FakeUpstream, json_completion
from tests.gateways import GatewayProcess, Launcher, Node

KEYS = "/api/v1/access-keys"


@pytest.fixture
async def model_server(nursery: trio.Nursery) -> FakeUpstream:
    up = FakeUpstream(models=("small", "qwen-7b"))
    await nursery.start(up.serve)
    up.on("POST", CHAT, json_completion("hi", model="small"))
    up.on("POST", "/v1/messages", json_completion("hi", model="small"))
    return up


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def make_key(gw: GatewayProcess, **fields: Any) -> dict[str, Any]:
    reply = await gw.call("POST", KEYS, fields, admin=True)
    assert reply.status == 201, reply.body
    made: dict[str, Any] = reply.json()
    return made


async def chat(gw: GatewayProcess, model: str, key: str) -> Reply:
    return await gw.chat(model, headers=bearer(key))


async def test_the_api_refuses_bad_limits(launch: Launcher, model_server: FakeUpstream
                                          ) -> None:
    gw = await launch.start("b", backends=[("local", model_server.url)])
    for doc, param in (({"rpm": -1}, "rpm"), ({"rpm": 0}, "rpm"), ({"rpm": 2.5}, "rpm"),
                       ({"rpm": 10**12}, "rpm"), ({"rpm": "5"}, "rpm"),
                       ({"expiresAt": "next week"}, "expiresAt"),
                       ({"expiresAt": "2030-02-30"}, "expiresAt"),
                       ({"expiresAt": "2030-01-01T10:00:00"}, "expiresAt"),
                       ({"models": "small"}, "models"), ({"models": []}, "models"),
                       ({"models": ["small", ""]}, "models[1]"),
                       ({"models": ["a b"]}, "models[0]"), ({"budget": 5}, "budget")):
        reply = await gw.call("POST", KEYS, doc, admin=True)
        assert reply.status == 422, (doc, reply.body)
        assert error_of(reply)["param"] == param, doc
    assert (await gw.get_json(KEYS)) == []
    made = await make_key(gw, name="tablet", models=["small", "qwen*"], rpm=30,
                          expiresAt="2030-06-30T14:00:00+02:00")
    assert (made["models"], made["rpm"], made["expiresAt"]) == (
        ["small", "qwen*"], 30, "2030-06-30T12:00:00Z")
    path = f"{KEYS}/{made['id']}"
    for doc, param in (({"rpm": -5}, "rpm"), ({"expiresAt": "yesterday"}, "expiresAt"),
                       ({"models": [1]}, "models[0]"), ({"key": "x"}, "key"),
                       ({"createdAt": "2020-01-01T00:00:00Z"}, "createdAt")):
        reply = await gw.call("PATCH", path, doc, admin=True)
        assert reply.status == 422, (doc, reply.body)
        assert error_of(reply)["param"] == param, doc
    missing = await gw.call("PATCH", f"{KEYS}/ak-nope", {"rpm": 5}, admin=True)
    assert (missing.status, error_of(missing)["param"]) == (404, "id")
    assert (await gw.call("PATCH", path, {"rpm": 5})).status == 401  # admin only
    listed = (await gw.get_json(KEYS))[0]
    assert (listed["models"], listed["rpm"], listed["expiresAt"], listed["expired"]) == (
        ["small", "qwen*"], 30, "2030-06-30T12:00:00Z", False)
    # secrets.yaml keeps them snake_case beside the hash; never the key.
    text = (gw.data_dir / "secrets.yaml").read_text()
    stored = yaml.safe_load(text)["access_keys"][0]
    assert (stored["models"], stored["rpm"], stored["expires_at"]) == (
        ["small", "qwen*"], 30, "2030-06-30T12:00:00Z")
    assert made["key"] not in text
    assert made["key"] not in gw.log()
    cleared = await gw.call("PATCH", path, {"models": None, "rpm": None, "expiresAt": None},
                            admin=True)
    assert cleared.status == 200
    assert set(yaml.safe_load((gw.data_dir / "secrets.yaml").read_text())["access_keys"][0]) \
        == {"id", "name", "hash", "created_at", "last_used_at"}


async def test_limits_over_tcp(launch: Launcher, model_server: FakeUpstream) -> None:
    """Loopback TCP needs no key here (require_auth off), yet a request that carries one is
    held to its limits."""
    gw = await launch.start("b", backends=[("local", model_server.url)])
    made = await make_key(gw, models=["small"], rpm=2)
    key = made["key"]
    assert (await chat(gw, "small", key)).status == 200
    # A model it may not use: 403 before the bucket is touched, in each family's shape.
    denied = await chat(gw, "qwen-7b", key)
    assert denied.status == 403
    assert (error_of(denied)["code"], error_of(denied)["param"]) == ("model_not_allowed",
                                                                     "model")
    messages = await request(gw.address, "POST", "/v1/messages", chat_body("qwen-7b"),
                             [("x-api-key", key), ("content-type", "application/json")])
    assert messages.status == 403
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "permission_error"
    assert (await chat(gw, "small", key)).status == 200
    limited = await chat(gw, "small", key)
    assert limited.status == 429
    assert limited.header("retry-after") == "30"
    assert error_of(limited)["code"] == "rate_limit_exceeded"
    assert len(model_server.requests_to(CHAT)) == 2
    # PATCH applies at once.
    patched = await gw.call("PATCH", f"{KEYS}/{made['id']}", {"rpm": None, "models": ["*"]},
                            admin=True)
    assert patched.status == 200
    assert (await chat(gw, "qwen-7b", key)).status == 200
    # Expiry: a moment in the past.
    past = await gw.call("PATCH", f"{KEYS}/{made['id']}",
                         {"expiresAt": "2001-01-01T00:00:00Z"}, admin=True)
    assert past.json()["expired"] is True
    expired = await chat(gw, "small", key)
    assert (expired.status, error_of(expired)["code"]) == (401, "key_expired")
    assert (await gw.call("PATCH", f"{KEYS}/{made['id']}", {"expiresAt": None},
                          admin=True)).status == 200
    assert (await chat(gw, "small", key)).status == 200
    # Without the key: no limit at all.
    for _ in range(4):
        assert (await gw.chat("qwen-7b")).status == 200


async def test_the_bucket_refills(launch: Launcher, model_server: FakeUpstream) -> None:
    """60 a minute: the first 60 at once (and what refills meanwhile, one a second), then
    429 with Retry-After 1, then one more after that second."""
    gw = await launch.start("b", backends=[("local", model_server.url)])
    key = (await make_key(gw, rpm=60))["key"]
    began = trio.current_time()
    served = 0
    while True:
        reply = await chat(gw, "small", key)
        if reply.status != 200:
            break
        served += 1
        assert served <= 200, "never limited"
    elapsed = trio.current_time() - began
    assert reply.status == 429
    assert reply.header("retry-after") == "1"
    assert 60 <= served <= 60 + int(elapsed) + 1, (served, elapsed)
    await trio.sleep(1.05)
    assert (await chat(gw, "small", key)).status == 200


async def test_forwarded_requests_keep_the_receivers_limits(
        launch: Launcher, model_server: FakeUpstream) -> None:
    """A forwards to B with B's key (SPEC §5): B holds it to that key's limits, and tells A
    only the models that key may use."""
    b = await launch.start("b", backends=[("local", model_server.url)])
    made = await make_key(b, name="from a", models=["small"], rpm=2)
    a = await launch.start("a", nodes=[Node(b.fingerprint, b.base_url, 1, made["key"])])
    await a.wait_nodes({b.fingerprint: ["small"]})
    assert ("small", "remote") in await a.model_ids()
    assert all(model != "qwen-7b" for model, _ in await a.model_ids())
    for _ in range(2):
        reply = await a.chat("small")
        assert reply.status == 200, reply.body
        assert reply.header("x-sluice-served-by") == f"node:{b.fingerprint}"
    limited = await a.chat("small")
    assert limited.status == 429  # B's answer, relayed
    assert limited.header("retry-after") == "30"
    assert error_of(limited)["code"] == "rate_limit_exceeded"
    # The key's other limits lifted on B: A learns qwen-7b at its next check, and may use it.
    assert (await b.call("PATCH", f"{KEYS}/{made['id']}", {"models": None, "rpm": None},
                         admin=True)).status == 200
    await a.wait_nodes({b.fingerprint: ["small", "qwen-7b"]})
    reply = await a.chat("qwen-7b")
    assert reply.status == 200, reply.body
    assert reply.header("x-sluice-served-by") == f"node:{b.fingerprint}"


# ------------------------------------------------------------------------- the CLI


async def sluice(gw: GatewayProcess, *args: str) -> tuple[int, str, str]:
    done = await trio.run_process([sys.executable, "-m", "proxy", "keys", *args,
                                   "--data-dir", str(gw.data_dir)],
                                  capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_keys_cli_with_limits(launch: Launcher, model_server: FakeUpstream) -> None:
    gw = await launch.start("b", backends=[("local", model_server.url)])
    code, out, err = await sluice(gw, "create", "--name", "tablet", "--models", "small, qwen*",
                                  "--rpm", "30", "--expires", "30d")
    assert code == 0, err
    key = out.strip()
    assert key.startswith("sk-sluice-")
    assert "models small, qwen*; 30 requests a minute; expires 20" in err
    stored = (await gw.get_json(KEYS))[0]
    assert (stored["models"], stored["rpm"]) == (["small", "qwen*"], 30)
    expires = datetime.strptime(stored["expiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    days = (expires - datetime.now(UTC)).total_seconds() / 86400
    assert 29.9 < days <= 30
    code, out, err = await sluice(gw, "list")
    assert code == 0, err
    head, row = out.splitlines()
    assert head.split() == ["ID", "NAME", "MODELS", "RPM", "EXPIRES", "LAST", "USED"]
    assert row.split()[:6] == [stored["id"], "tablet", "small,qwen*", "30",
                               stored["expiresAt"], "never"]
    assert key not in out
    code, out, err = await sluice(gw, "update", stored["id"], "--all-models", "--no-rpm",
                                  "--expires", "2031-01-31")
    assert code == 0, err
    assert out.strip() == (f"access key {stored['id']}: models all; no rate limit; "
                           "expires 2031-01-31T23:59:59Z")
    code, out, err = await sluice(gw, "update", stored["id"], "--no-expiry", "--json")
    assert code == 0, err
    assert json.loads(out)["expiresAt"] is None
    assert (await sluice(gw, "list"))[1].splitlines()[1].split()[2:5] == ["all", "-", "never"]
    # Refusals: the gateway's (422 naming rpm; 404), the CLI's own (--expires unreadable,
    # nothing to change), argparse's (both --rpm and --no-rpm).
    code, _, err = await sluice(gw, "update", stored["id"], "--rpm", "0")
    assert code == 1
    assert "422" in err
    assert "rpm:" in err
    code, _, err = await sluice(gw, "update", "ak-nope", "--rpm", "5")
    assert code == 1
    assert "404" in err
    code, _, err = await sluice(gw, "update", stored["id"], "--expires", "someday")
    assert code == 2
    assert "expires" in err
    code, _, err = await sluice(gw, "update", stored["id"])
    assert code == 1
    assert "nothing to change" in err
    code, _, err = await sluice(gw, "update", stored["id"], "--rpm", "5", "--no-rpm")
    assert code == 2
    assert "not allowed with" in err
