"""Model aliases through a real gateway (SPEC §12), in process, with fake model servers that
keep the bodies they received: the bytes forwarded are the client's, byte for byte, but for
the model value (Content-Length following); ``/v1/models`` lists exact aliases; the request
log has ``model`` and ``servedModel``; a model that exists is never aliased; patterns;
a target that does not exist is a 503 naming both and nothing is forwarded; streams; a
target on a network node; and ``GET|PUT /api/v1/settings/aliases`` (order kept, the file
written, 422 naming ``aliases.<name>``, applied live, a ``settings`` event)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from protocol.aliases import AliasTable
from proxy import aliasing
from tests.client import CHAT, chat_body, request
from tests.conftest import RunningGateway, StartGateway, admin, configure, node
from tests.fakenode import start_node
from tests.fakeupstream import FakeUpstream, json_completion, sse_events, sse_stream

ALIASES = "/api/v1/settings/aliases"
TABLE = {"gpt-4o": "small", "claude-3-*": "other", "claude-*": "small", "ghost": "nobody",
         "small-*": "other"}


async def gateway(nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway,
                  aliases: dict[str, str] | None = None) -> tuple[RunningGateway, FakeUpstream]:
    """A gateway with one local model server holding ``small`` and ``other``, its aliases
    set through the settings API."""
    up = FakeUpstream(models=("small", "other"), unix_path=str(short_tmp / "up.sock"))
    await nursery.start(up.serve)
    up.on("POST", CHAT, json_completion("hi", model="small"))
    gw = await start_gateway([("local", up.url)])
    if aliases is not None:
        reply = await admin(gw, "PUT", ALIASES, {"aliases": aliases})
        assert reply.status == 200, reply.body
    return gw, up


async def log_entries(gw: RunningGateway) -> list[dict[str, Any]]:
    reply = await request(gw.unix, "GET", "/api/v1/requests")
    assert reply.status == 200
    found: list[dict[str, Any]] = reply.json()["requests"]
    return found


def spliced(body: bytes, old: str, new: str) -> bytes:
    """``body`` with its one ``"old"`` value (written plainly) replaced by ``"new"``."""
    quoted = json.dumps(old).encode()
    assert body.count(quoted) == 1
    return body.replace(quoted, json.dumps(new).encode())


async def test_exact_alias_rewrites_only_the_model(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway, TABLE)
    body = (b'{ "messages" : [{"role":"user","content":"say \\"model\\": \\"gpt-4o\\" \\u00e9'
            b' \xc3\xa9"}],\n "model":"gpt-4o", "metadata": {"model": "gpt-4o"},'
            b' "temperature":0.5 }')
    reply = await request(gw.unix, "POST", CHAT, body)
    assert reply.status == 200, reply.body
    assert reply.header("x-sluice-served-by") == "local:local"
    (got,) = up.requests_to(CHAT)
    expected = body.replace(b'"model":"gpt-4o"', b'"model":"small"')
    assert got.body == expected  # byte for byte, but the model value
    assert got.header("content-length") == str(len(expected))
    assert json.loads(got.body) == {**json.loads(body), "model": "small"}
    (entry,) = await log_entries(gw)
    assert (entry["model"], entry["servedModel"], entry["servedBy"], entry["outcome"]) == (
        "gpt-4o", "small", "local:local", "success")


async def test_existing_models_are_never_aliased(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway,
                           {"small": "other", "*": "other", "oth*": "small"})
    for model in ("small", "other"):
        body = chat_body(model)
        assert (await request(gw.unix, "POST", CHAT, body)).status == 200
        assert up.requests_to(CHAT)[-1].body == body
    entries = await log_entries(gw)
    assert [(e["model"], e["servedModel"]) for e in entries] == [("other", "other"),
                                                                 ("small", "small")]


async def test_patterns_in_file_order(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway, TABLE)
    for asked, target in (("claude-3-5-sonnet-20241022", "other"),
                          ("claude-sonnet-4-5", "small"), ("small-v2", "other")):
        body = json.dumps({"max_tokens": 5, "model": asked, "system": "be \"model\"-like é",
                           "messages": [{"role": "user", "content": asked}]},
                          indent=2, ensure_ascii=False).encode()
        assert (await request(gw.unix, "POST", CHAT, body)).status == 200
        old, new = f'"model": "{asked}"'.encode(), f'"model": "{target}"'.encode()
        assert body.count(old) == 1
        assert up.requests_to(CHAT)[-1].body == body.replace(old, new)
    entries = await log_entries(gw)
    assert [(e["model"], e["servedModel"]) for e in reversed(entries)] == [
        ("claude-3-5-sonnet-20241022", "other"), ("claude-sonnet-4-5", "small"),
        ("small-v2", "other")]


async def test_a_missing_target_is_a_clear_503(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway, TABLE)
    reply = await request(gw.unix, "POST", CHAT, chat_body("ghost"))
    assert reply.status == 503
    error = reply.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("model_not_available",
                                                              "server_error", "model")
    assert "'ghost'" in error["message"]
    assert "'nobody'" in error["message"]
    unknown = await request(gw.unix, "POST", CHAT, chat_body("no-alias-for-this"))
    assert unknown.status == 503
    assert "'no-alias-for-this'" in unknown.json()["error"]["message"]
    assert up.requests_to(CHAT) == []  # nothing was forwarded
    second, first = await log_entries(gw)
    assert (first["model"], first["servedModel"], first["servedBy"], first["error"]) == (
        "ghost", None, None, "model_not_available")
    assert (second["model"], second["servedModel"]) == ("no-alias-for-this", None)


async def test_streamed_answers(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway, TABLE)
    events = [*sse_events(3, model="small")]
    up.on("POST", CHAT, sse_stream(events))
    body = chat_body("claude-opus-4", stream=True, stream_options={"include_usage": True})
    reply = await request(gw.unix, "POST", CHAT, body)
    assert reply.status == 200
    assert reply.body == b"".join(events)
    assert up.requests_to(CHAT)[0].body == spliced(body, "claude-opus-4", "small")
    (entry,) = await log_entries(gw)
    assert (entry["model"], entry["servedModel"], entry["stream"], entry["events"]) == (
        "claude-opus-4", "small", True, len(events))


async def test_the_model_list_shows_exact_aliases(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    gw, _ = await gateway(nursery, short_tmp, start_gateway,
                          {**TABLE, "small": "other", "o1": "other"})
    listed = (await request(gw.unix, "GET", "/v1/models")).json()["data"]
    by_id = {entry["id"]: entry for entry in listed}
    assert [entry["id"] for entry in listed] == ["small", "other", "gpt-4o", "o1"]
    apis = by_id["small"]["sluice"]["apis"]  # the backend's APIs (SPEC §17.1)
    assert by_id["gpt-4o"] == {**by_id["small"], "id": "gpt-4o",
                               "sluice": {"apis": apis, "aliasOf": "small"}}
    assert by_id["o1"]["owned_by"] == by_id["other"]["owned_by"]
    assert by_id["small"]["sluice"] == {"apis": apis}  # a model that exists stays itself
    one = await request(gw.unix, "GET", "/v1/models/gpt-4o")
    assert one.status == 200
    assert one.json() == by_id["gpt-4o"]
    assert (await request(gw.unix, "GET", "/v1/models/ghost")).status == 404


async def test_a_target_on_a_network_node(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Path,
        start_gateway: StartGateway) -> None:
    gw, _up = await gateway(nursery, short_tmp, start_gateway)
    far = await start_node(nursery, str(short_tmp / "node-far.sock"), ["far-model"])
    configure(gw, (node("node-far", far.url, 1),), enabled=True)
    await trio.sleep(0.1)
    settings = gw.gateway.settings  # the node's Unix URL would not pass a settings write
    settings.config = attrs.evolve(settings.config,
                                   aliases=AliasTable([("claude-*", "far-model")]))
    body = chat_body("claude-haiku")
    reply = await request(gw.unix, "POST", CHAT, body)
    assert reply.status == 200
    assert reply.header("x-sluice-served-by") == "node:node-far"
    assert far.chats()[0].body == spliced(body, "claude-haiku", "far-model")
    listed = [e["id"] for e in (await request(gw.unix, "GET", "/v1/models")).json()["data"]]
    assert "far-model" in listed
    assert "claude-haiku" not in listed
    configure(gw, enabled=False)  # load balancing off: the node's model is gone
    off = await request(gw.unix, "POST", CHAT, body)
    assert off.status == 503
    assert "'far-model'" in off.json()["error"]["message"]
    assert len(far.chats()) == 1


async def test_no_aliases_no_call(nursery: trio.Nursery, short_tmp: Path,
                                  start_gateway: StartGateway,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: Any) -> Any:
        raise AssertionError("aliasing.apply called without aliases")

    gw, _up = await gateway(nursery, short_tmp, start_gateway)
    monkeypatch.setattr(aliasing, "apply", never)
    assert (await request(gw.unix, "POST", CHAT, chat_body("small"))).status == 200
    assert (await request(gw.unix, "POST", CHAT, chat_body("gpt-4o"))).status == 503


# ------------------------------------------------------------------- the settings API


def on_disk(gw: RunningGateway) -> Any:
    return yaml.safe_load((gw.gateway.settings.data_dir / "config.yaml").read_text())


async def test_settings_api(nursery: trio.Nursery, short_tmp: Path,
                            start_gateway: StartGateway) -> None:
    gw, up = await gateway(nursery, short_tmp, start_gateway)
    events: list[Any] = []
    gw.gateway.hub.subscribe(lambda kind, at, data: events.append(data), {"settings"})
    assert (await request(gw.unix, "GET", ALIASES)).json() == {"aliases": {}}
    assert (await request(gw.unix, "PUT", ALIASES, b'{"aliases": {}}')).status == 401
    assert (await request(gw.unix, "POST", CHAT, chat_body("gpt-4o"))).status == 503

    table = {"z-*": "other", "gpt-4o": "small", "*": "small", "claude-*": "other"}
    reply = await admin(gw, "PUT", ALIASES, {"aliases": table})
    assert reply.status == 200
    assert list(reply.json()["aliases"].items()) == list(table.items())  # the order kept
    assert list(on_disk(gw)["aliases"].items()) == list(table.items())
    assert (await request(gw.unix, "GET", ALIASES)).json() == reply.json()
    gw.gateway.hub.drain()
    assert {"section": "aliases", "value": reply.json()} in events
    assert (await request(gw.unix, "POST", CHAT, chat_body("gpt-4o"))).status == 200  # live
    assert json.loads(up.requests_to(CHAT)[-1].body)["model"] == "small"

    before = (gw.gateway.settings.data_dir / "config.yaml").read_bytes()
    for doc, param in (({"aliases": {"ok": "small", "bad one": "small"}}, "aliases.bad one"),
                       ({"aliases": {"gpt-4o": "qwen-*"}}, "aliases.gpt-4o"),
                       ({"aliases": {"gpt-4o": 5}}, "aliases.gpt-4o"),
                       ({"aliases": {"gpt-4o": "gpt-4o"}}, "aliases.gpt-4o"),
                       ({"aliases": {"": "small"}}, "aliases."),
                       ({"aliases": ["gpt-4o"]}, "aliases"),
                       ({}, "aliases"),
                       ({"aliases": {}, "patterns": []}, "patterns")):
        refused = await admin(gw, "PUT", ALIASES, doc)
        assert refused.status == 422, doc
        assert refused.json()["error"]["param"] == param, (doc, refused.json())
        assert refused.json()["error"]["message"].startswith(param), refused.json()
    assert (gw.gateway.settings.data_dir / "config.yaml").read_bytes() == before
    assert list(gw.gateway.ctx.config.aliases) == list(table.items())

    cleared = await admin(gw, "PUT", ALIASES, {"aliases": None})
    assert cleared.json() == {"aliases": {}}
    assert on_disk(gw)["aliases"] == {}
    assert not gw.gateway.ctx.config.aliases


async def test_an_ollama_request_for_an_alias(
        nursery: trio.Nursery, short_tmp: Path, start_gateway: StartGateway) -> None:
    """The Ollama API's requests are translated, then aliased like any other."""
    gw, up = await gateway(nursery, short_tmp, start_gateway, TABLE)
    body = json.dumps({"model": "claude-haiku", "stream": False,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    reply = await request(gw.unix, "POST", "/api/chat", body)
    assert reply.status == 200, reply.body
    assert reply.json()["message"]["content"] == "hi"
    (sent,) = up.requests_to(CHAT)
    assert json.loads(sent.body)["model"] == "small"
    (entry,) = await log_entries(gw)
    assert (entry["model"], entry["servedModel"]) == ("claude-haiku", "small")
