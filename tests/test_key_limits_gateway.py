"""Access keys with limits through a real gateway in process (SPEC §13): the token bucket on
trio's MockClock (429 with Retry-After, then success after the refill), expiry through the
wall-clock seam (401 key_expired), the models a key may use (ids, patterns, an alias's
target; 403 model_not_allowed in each family's shape, Ollama's load-only requests too), on
every listener whenever the request carries one of our keys; a keyless request and an
unknown token stay unlimited; listings and the admin API are not counted; PATCH applies at
once."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests.client import CHAT, Reply, chat_body, error_of, request
from tests.conftest import RunningGateway, StartGateway, admin, remote_request
from tests.fakeupstream import FakeUpstream, json_completion

KEYS = "/api/v1/access-keys"


async def gateway(nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway,
                  **options: Any) -> tuple[RunningGateway, FakeUpstream]:
    """A gateway with one local model server holding ``small``, ``qwen-7b`` and
    ``qwen-14b``."""
    up = FakeUpstream(models=("small", "qwen-7b", "qwen-14b"),
                      unix_path=str(short_tmp / "up.sock"))
    await nursery.start(up.serve)
    up.on("POST", CHAT, json_completion("hi", model="small"))
    gw = await start_gateway([("local", up.url)], **options)
    # Settings writes (a new key, PATCH) run inline: a worker thread would let the autojump
    # clock move on while the file is written, and refill a bucket mid-test.
    gw.gateway.settings.in_thread = inline
    return gw, up


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


async def make_key(gw: RunningGateway, **limits: Any) -> dict[str, Any]:
    reply = await admin(gw, "POST", KEYS, {"name": "t", **limits})
    assert reply.status == 201, reply.body
    made: dict[str, Any] = reply.json()
    return made


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def chat(gw: RunningGateway, model: str, key: str | None, *, via: str = "unix") -> Reply:
    headers = [] if key is None else bearer(key)
    if via == "remote":
        return await remote_request(gw, "POST", CHAT, chat_body(model), headers)
    return await request(gw.address(via), "POST", CHAT, chat_body(model), headers)


# ------------------------------------------------------------------------- rpm


async def test_rate_limit_on_the_trio_clock(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway)
    key = (await make_key(gw, rpm=2))["key"]
    chats = len(up.requests_to(CHAT))
    for via in ("unix", "tcp"):  # one bucket per key, whatever the listener
        assert (await chat(gw, "small", key, via=via)).status == 200
    refused = await chat(gw, "small", key)
    assert refused.status == 429
    assert refused.header("retry-after") == "30"  # 2 a minute: the next in 30 s
    error = error_of(refused)
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
    assert len(up.requests_to(CHAT)) == chats + 2  # the refused one went nowhere
    await trio.sleep(20)
    assert (await chat(gw, "small", key)).header("retry-after") == "10"
    # Listings and the admin API are not requests for a model: they take nothing.
    for _ in range(5):
        assert (await request(gw.unix, "GET", "/v1/models", None, bearer(key))).status == 200
        assert (await request(gw.unix, "GET", "/api/tags", None, bearer(key))).status == 200
    await trio.sleep(10)
    assert (await chat(gw, "small", key)).status == 200  # exactly one refilled
    assert (await chat(gw, "small", key)).status == 429
    # Keyless requests and other keys are not limited by it.
    for _ in range(5):
        assert (await chat(gw, "small", None)).status == 200
    other = (await make_key(gw))["key"]
    for _ in range(5):
        assert (await chat(gw, "small", other)).status == 200
    # The family's shape: Anthropic's and Ollama's.
    messages = await request(gw.unix, "POST", "/v1/messages", chat_body("small"), bearer(key))
    assert messages.status == 429
    assert messages.header("retry-after") is not None
    assert messages.json()["error"]["type"] == "rate_limit_error"
    assert "rate_limit_exceeded" in messages.json()["error"]["message"]
    ollama = await request(gw.unix, "POST", "/api/chat",
                           json.dumps({"model": "small", "stream": False,
                                       "messages": [{"role": "user", "content": "hi"}]}
                                      ).encode(), bearer(key))
    assert ollama.status == 429
    assert set(ollama.json()) == {"error"}
    assert ollama.header("retry-after") is not None


async def test_patch_applies_live(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    gw, _up = await gateway(nursery, short_tmp, start_gateway)
    made = await make_key(gw, rpm=1, models=["small"])
    key, path = made["key"], f"{KEYS}/{made['id']}"
    assert (await chat(gw, "small", key)).status == 200
    assert (await chat(gw, "small", key)).status == 429
    assert (await chat(gw, "qwen-7b", key)).status == 403
    patched = await admin(gw, "PATCH", path, {"rpm": None, "models": ["qwen-*"]})
    assert patched.status == 200, patched.body
    assert (patched.json()["rpm"], patched.json()["models"]) == (None, ["qwen-*"])
    assert (await chat(gw, "qwen-7b", key)).status == 200
    assert (await chat(gw, "qwen-14b", key)).status == 200
    assert (await chat(gw, "small", key)).status == 403
    assert (await admin(gw, "PATCH", path, {"models": None})).status == 200
    assert (await chat(gw, "small", key)).status == 200


# ------------------------------------------------------------------------- models


async def test_models_a_key_may_use(nursery: trio.Nursery, short_tmp: Path,
                                    start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway)
    aliases = await admin(gw, "PUT", "/api/v1/settings/aliases",
                          {"aliases": {"gpt-4o": "small", "claude-*": "qwen-7b"}})
    assert aliases.status == 200
    key = (await make_key(gw, models=["small", "qwen-1*"], rpm=1000))["key"]
    before = len(up.requests_to(CHAT))
    for model, status in (("small", 200), ("qwen-14b", 200), ("qwen-7b", 403),
                          ("gpt-4o", 200),  # an alias of a model it may use
                          ("claude-haiku", 403),  # an alias of one it may not
                          ("nowhere", 403)):  # refused before routing: no 503 to learn from
        reply = await chat(gw, model, key)
        assert reply.status == status, (model, reply.body)
        if status == 403:
            error = error_of(reply)
            assert (error["code"], error["param"]) == ("model_not_allowed", "model")
            assert repr(model) in error["message"]
    assert len(up.requests_to(CHAT)) == before + 3
    # An alias name the key lists lets it use that alias, whatever the target.
    by_alias = (await make_key(gw, models=["claude-*"]))["key"]
    assert (await chat(gw, "claude-haiku", by_alias)).status == 200
    assert (await chat(gw, "qwen-7b", by_alias)).status == 403
    # Anthropic's shape.
    messages = await request(gw.unix, "POST", "/v1/messages", chat_body("qwen-7b"), bearer(key))
    assert messages.status == 403
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "permission_error"
    assert "model_not_allowed" in messages.json()["error"]["message"]
    # x-api-key counts like Authorization (SPEC §12).
    by_header = await request(gw.unix, "POST", "/v1/messages", chat_body("qwen-7b"),
                              [("x-api-key", key)])
    assert by_header.status == 403
    # Ollama's: a chat and a load-only request.
    for doc in ({"model": "qwen-7b", "messages": [{"role": "user", "content": "hi"}]},
                {"model": "qwen-7b", "messages": []}):
        reply = await request(gw.unix, "POST", "/api/chat", json.dumps(doc).encode(),
                              bearer(key))
        assert reply.status == 403, doc
        assert reply.json() == {"error": "this access key may not use model 'qwen-7b'"}
    loaded = await request(gw.unix, "POST", "/api/generate",
                           json.dumps({"model": "small"}).encode(), bearer(key))
    assert loaded.status == 200
    # The listings show a limited key the models it may use; without a key, all of them.
    async def listed(path: str, field: str, name: str, token: str | None) -> list[str]:
        reply = await request(gw.unix, "GET", path, None, [] if token is None else bearer(token))
        assert reply.status == 200
        return sorted(m[name] for m in reply.json()[field])

    assert await listed("/v1/models", "data", "id", key) == ["gpt-4o", "qwen-14b", "small"]
    assert await listed("/api/tags", "models", "name", key) == ["gpt-4o", "qwen-14b", "small"]
    everything = ["gpt-4o", "qwen-14b", "qwen-7b", "small"]
    assert await listed("/v1/models", "data", "id", None) == everything
    assert await listed("/v1/models", "data", "id", "dummy") == everything
    hidden = await request(gw.unix, "GET", "/v1/models/qwen-7b", None, bearer(key))
    assert hidden.status == 404
    assert (await request(gw.unix, "GET", "/v1/models/qwen-7b")).status == 200


async def test_every_listener_and_tokens_that_are_not_ours(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway,
        remote_seam: None) -> None:
    gw, _up = await gateway(nursery, short_tmp, start_gateway)
    key = (await make_key(gw, models=["small"]))["key"]
    for via in ("unix", "tcp", "remote"):
        assert (await chat(gw, "small", key, via=via)).status == 200, via
        assert (await chat(gw, "qwen-7b", key, via=via)).status == 403, via
    # Where no key is needed, a token that is not one of ours is ignored (apps send dummy
    # keys); from a remote peer it is refused as before.
    for token in ("unused", "sk-sluice-not-a-key", "ollama"):
        for via in ("unix", "tcp"):
            assert (await chat(gw, "qwen-7b", token, via=via)).status == 200, (token, via)
        remote = await chat(gw, "qwen-7b", token, via="remote")
        assert (remote.status, error_of(remote)["code"]) == (401, "invalid_api_key")
    assert (await chat(gw, "qwen-7b", None, via="unix")).status == 200
    assert (await chat(gw, "qwen-7b", None, via="remote")).status == 401
    # A revoked key is unknown again: ignored where none is needed.
    made = gw.gateway.settings.keys.all[0].id
    assert (await admin(gw, "DELETE", f"{KEYS}/{made}")).status == 200
    assert (await chat(gw, "qwen-7b", key)).status == 200
    assert (await chat(gw, "qwen-7b", key, via="remote")).status == 401


# ------------------------------------------------------------------------- expiry


async def test_expiry_through_the_wall_clock_seam(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway,
        remote_seam: None) -> None:
    gw, _up = await gateway(nursery, short_tmp, start_gateway)
    grants = gw.gateway.ctx.key_grants
    end = datetime(2030, 6, 30, 12, 0, 0, tzinfo=UTC).timestamp()
    made = await make_key(gw, expiresAt="2030-06-30T14:00:00+02:00")
    assert made["expiresAt"] == "2030-06-30T12:00:00Z"
    key = made["key"]
    grants.wall = lambda: end - 1
    for via in ("unix", "remote"):
        assert (await chat(gw, "small", key, via=via)).status == 200
    listed = (await request(gw.unix, "GET", KEYS)).json()[0]
    assert (listed["expiresAt"], listed["expired"]) == ("2030-06-30T12:00:00Z", False)
    grants.wall = lambda: end + 1
    for via in ("unix", "tcp", "remote"):
        reply = await chat(gw, "small", key, via=via)
        assert reply.status == 401, via
        error = error_of(reply)
        assert (error["code"], error["type"]) == ("key_expired", "invalid_request_error")
        assert "2030-06-30T12:00:00Z" in error["message"]
        assert key not in reply.body.decode()
    models = await request(gw.unix, "GET", "/v1/models", None, bearer(key))
    assert models.status == 401  # every request that presents it, not only model requests
    anthropic = await request(gw.unix, "POST", "/v1/messages", chat_body("small"),
                              [("x-api-key", key)])
    assert anthropic.json()["error"]["type"] == "authentication_error"
    assert (await request(gw.unix, "GET", KEYS)).json()[0]["expired"] is True
    # Moved later by PATCH: valid again at once.
    patched = await admin(gw, "PATCH", f"{KEYS}/{made['id']}", {"expiresAt": "2031-01-01"})
    assert patched.json()["expiresAt"] == "2031-01-01T23:59:59Z"
    assert (await chat(gw, "small", key, via="remote")).status == 200
    assert (await admin(gw, "PATCH", f"{KEYS}/{made['id']}", {"expiresAt": None})).status == 200
    grants.wall = lambda: end + 10**9
    assert (await chat(gw, "small", key, via="remote")).status == 200
