"""Pairing's API on the computer to add (SPEC §14), on an in-process gateway over real
sockets: ``/api/v1/pairing`` needs the admin token; ``/api/v1/pairing/claim`` needs neither
the token nor an access key (from a remote peer, and on loopback with ``require_auth``),
gives a key that works as an access key; wrong codes, the void code after 5, used and
expired codes are one 401; 422 names the field; 429 with Retry-After per peer address; a
large body is 413; neither the code nor the key reaches a log line (at DEBUG), the request
log, a notification or an event."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
import trio
import trio.testing
import yaml

import proxy.lan.pairing
from tests.client import Reply, error_of, request
from tests.conftest import RunningGateway, StartGateway, admin

PAIRING = "/api/v1/pairing"
CLAIM = "/api/v1/pairing/claim"


async def new_code(gw: RunningGateway) -> str:
    reply = await admin(gw, "POST", PAIRING)
    assert reply.status == 200, reply.body
    code: str = reply.json()["code"]
    return code


async def state(gw: RunningGateway) -> dict[str, Any]:
    reply = await admin(gw, "GET", PAIRING)
    assert reply.status == 200, reply.body
    found: dict[str, Any] = reply.json()
    return found


async def from_ip(gw: RunningGateway, ip: str, method: str, path: str, doc: Any = None,
                  headers: list[tuple[str, str]] | None = None,
                  body: bytes | None = None) -> Reply:
    """A request over TCP from the loopback address ``ip`` (127.0.0.2 is a remote peer
    under the ``remote_seam`` fixture)."""
    data = body if body is not None else (None if doc is None else json.dumps(doc).encode())
    hdrs = [*(headers or []), *([("content-type", "application/json")] if data else [])]
    return await request(gw.tcp, method, path, data, hdrs, source=ip)


def claim_doc(code: str, **fields: Any) -> dict[str, Any]:
    return {"code": code, "fingerprint": "node-laptop-1", "name": "laptop", **fields}


def other_than(code: str) -> str:
    return "000000" if code != "000000" else "111111"


async def test_codes_need_the_admin_token(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    for method in ("GET", "POST", "DELETE"):
        bare = await request(gw.unix, method, PAIRING)
        assert bare.status == 401, (method, bare.body)
        wrong = await request(gw.unix, method, PAIRING, None,
                              [("authorization", "Bearer not-the-token")])
        assert wrong.status == 403, (method, wrong.body)
    assert await state(gw) == {"active": False, "state": "none", "expiresAt": None,
                               "triesLeft": None, "name": None}
    made = await admin(gw, "POST", PAIRING)
    assert made.status == 200
    first = made.json()
    assert set(first) == {"code", "expiresAt", "replaced"}
    assert len(first["code"]) == 6
    assert first["code"].isdigit()
    assert first["replaced"] is False
    shown = await state(gw)
    assert shown == {"active": True, "state": "active", "expiresAt": first["expiresAt"],
                     "triesLeft": 5, "name": None}
    again = (await admin(gw, "POST", PAIRING)).json()
    assert again["replaced"] is True
    assert (await admin(gw, "POST", PAIRING, body=b'{"x": 1}')).status == 400
    cancelled = await admin(gw, "DELETE", PAIRING)
    assert cancelled.json() == {"active": False, "state": "cancelled",
                                "expiresAt": again["expiresAt"], "triesLeft": 0,
                                "name": None, "cancelled": True}
    assert (await admin(gw, "DELETE", PAIRING)).json()["cancelled"] is False
    refused = await request(gw.unix, "POST", CLAIM, json.dumps(claim_doc(again["code"])).encode())
    assert refused.status == 401  # a cancelled code


@pytest.mark.usefixtures("remote_seam")
async def test_a_claim_needs_no_token_and_gives_an_access_key(
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([], require_auth=True)
    events: list[dict[str, Any]] = []
    gw.gateway.ctx.hub.subscribe(lambda kind, at, data: events.append(data), ("pairing",))
    # A claim needs no token, and nothing else is opened: other writes need the admin token.
    for path in (PAIRING, CLAIM + "/", "/api/v1/access-keys"):
        refused = await from_ip(gw, "127.0.0.2", "POST", path, {})
        assert (refused.status, error_of(refused)["code"]) == (401, "admin_token_required")
    code = await new_code(gw)
    # SPEC §16: over the network a code is proved by the exchange on the node port; the
    # claim that answers with a key in clear is served to this machine only.
    remote = await from_ip(gw, "127.0.0.2", "POST", CLAIM, claim_doc(code))
    assert (remote.status, error_of(remote)["code"]) == (403, "claim_local_only")
    assert (await state(gw))["triesLeft"] == 5  # refused before the code was looked at
    reply = await from_ip(gw, "127.0.0.1", "POST", CLAIM, claim_doc(code))
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert set(answer) == {"fingerprint", "accessKey"}
    assert answer["fingerprint"] == gw.gateway.settings.node_id
    key = answer["accessKey"]
    assert key.startswith("sk-sluice-")
    # Made as POST /api/v1/access-keys makes a key: listed by name, stored hashed.
    [listed] = (await admin(gw, "GET", "/api/v1/access-keys")).json()
    assert listed["name"] == "laptop"
    stored = yaml.safe_load((gw.gateway.settings.data_dir / "secrets.yaml").read_text())
    assert [e["name"] for e in stored["access_keys"]] == ["laptop"]
    assert key not in (gw.gateway.settings.data_dir / "secrets.yaml").read_text()
    # The key works as an access key: loopback needs one here (require_auth).
    assert (await from_ip(gw, "127.0.0.1", "GET", "/v1/models")).status == 401
    bearer = [("authorization", f"Bearer {key}")]
    assert (await from_ip(gw, "127.0.0.1", "GET", "/v1/models", headers=bearer)).status == 200
    assert (await from_ip(gw, "127.0.0.2", "GET", "/v1/models", headers=bearer)).status == 200
    # The console showing the code is told; the user gets a notification.
    assert events[-1] == {"active": False, "state": "claimed", "expiresAt": events[0]["expiresAt"],
                          "triesLeft": 0, "name": "laptop"}
    notes = (await admin(gw, "GET", "/api/v1/notifications")).json()["notifications"]
    assert {"code": "pairing_claimed", "level": "info",
            "message": "laptop connected with a pairing code"}.items() <= notes[-1].items()
    assert (await state(gw))["state"] == "claimed"
    # One use.
    again = await from_ip(gw, "127.0.0.3", "POST", CLAIM, claim_doc(code))
    assert again.status == 401
    # A claim over loopback with require_auth needs no key either; named after the
    # fingerprint when no name is given.
    code = await new_code(gw)
    nameless = await from_ip(gw, "127.0.0.1", "POST", CLAIM,
                             {"code": code, "fingerprint": "node-desk-2"})
    assert nameless.status == 200, nameless.body
    names = [k["name"] for k in (await admin(gw, "GET", "/api/v1/access-keys")).json()]
    assert names == ["laptop", "node-desk-2"]


async def test_wrong_codes_void_the_code(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    code = await new_code(gw)
    wrong = other_than(code)
    for n in range(5):  # from five addresses: the rate limit is per address
        reply = await from_ip(gw, f"127.0.1.{n + 1}", "POST", CLAIM, claim_doc(wrong))
        assert reply.status == 401
        assert error_of(reply) == {
            "message": "the pairing code was not accepted: it is wrong, used or expired "
                       "(make a new one with 'sluice pair')",
            "type": "invalid_request_error", "code": "invalid_pairing_code", "param": "code"}
        shown = await state(gw)
        assert shown["triesLeft"] == (4 - n if n < 4 else 0)
    assert (await state(gw))["state"] == "void"
    right = await from_ip(gw, "127.0.1.9", "POST", CLAIM, claim_doc(code))
    assert right.status == 401  # even the right code
    assert (await admin(gw, "GET", "/api/v1/access-keys")).json() == []


async def test_an_expired_code(start_gateway: StartGateway,
                               autojump_clock: trio.testing.MockClock) -> None:
    gw = await start_gateway([])
    code = await new_code(gw)
    await trio.sleep(proxy.lan.pairing.CODE_LIFETIME + 1)  # the mock clock's seconds
    assert (await state(gw))["state"] == "expired"
    reply = await request(gw.unix, "POST", CLAIM, json.dumps(claim_doc(code)).encode())
    assert (reply.status, error_of(reply)["code"]) == (401, "invalid_pairing_code")


async def test_bad_fields_and_the_rate_limit(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    code = await new_code(gw)
    bad = [({"fingerprint": "node-x"}, "code"), (claim_doc("12345"), "code"),
           (claim_doc(code, fingerprint="no spaces"), "fingerprint"),
           (claim_doc(code, name=["x"]), "name"), (claim_doc(code, admin=True), "admin")]
    for doc, param in bad:  # five claims from one address...
        reply = await from_ip(gw, "127.0.0.4", "POST", CLAIM, doc)
        assert (reply.status, error_of(reply)["param"]) == (422, param), reply.body
    limited = await from_ip(gw, "127.0.0.4", "POST", CLAIM, claim_doc(code))
    assert limited.status == 429  # ...and the sixth waits, however right it is
    assert limited.header("retry-after") == "12"
    assert error_of(limited)["code"] == "rate_limit_exceeded"
    assert (await state(gw))["triesLeft"] == 5  # neither 422s nor the 429 cost a try
    # The Unix socket counts as one peer.
    for _ in range(5):
        assert (await request(gw.unix, "POST", CLAIM, b"{}")).status == 422
    assert (await request(gw.unix, "POST", CLAIM, b"{}")).status == 429
    # Another address claims the code.
    assert (await from_ip(gw, "127.0.0.5", "POST", CLAIM, claim_doc(code))).status == 200


async def test_a_large_claim_is_not_read(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    await new_code(gw)
    reply = await from_ip(gw, "127.0.0.6", "POST", CLAIM, body=b"{" + b" " * 5000 + b"}")
    assert (reply.status, error_of(reply)["code"]) == (413, "request_too_large")


async def test_no_code_or_key_in_any_log(start_gateway: StartGateway,
                                         caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A fixed code, looked for as a number of its own: a random one could be part of
    # another number (a port, a pid) by chance.
    monkeypatch.setattr(proxy.lan.pairing, "new_code", lambda: "480213")
    caplog.set_level(logging.DEBUG)
    gw = await start_gateway([])
    seen: list[tuple[str, Any]] = []
    gw.gateway.ctx.hub.subscribe(lambda kind, at, data: seen.append((kind, data)))
    code = await new_code(gw)
    wrong = await from_ip(gw, "127.0.0.7", "POST", CLAIM, claim_doc(other_than(code)))
    assert wrong.status == 401
    reply = await from_ip(gw, "127.0.0.7", "POST", CLAIM, claim_doc(code))
    assert reply.status == 200
    key = reply.json()["accessKey"]
    assert (await from_ip(gw, "127.0.0.7", "GET", "/v1/models",
                          headers=[("authorization", f"Bearer {key}")])).status == 200
    await trio.testing.wait_all_tasks_blocked()  # every request's record handed over
    gw.gateway.hub.drain()  # and the access log's batch written now
    assert "pairing code claimed by laptop (node-laptop-1) from 127.0.0.7" in caplog.text
    assert "/api/v1/pairing/claim" in caplog.text  # the access log's line of the claim
    outputs = [caplog.text, json.dumps(seen, default=str),
               (await admin(gw, "GET", "/api/v1/requests")).body.decode(),
               (await admin(gw, "GET", "/api/v1/notifications")).body.decode(),
               (await admin(gw, "GET", "/api/v1/access-keys")).body.decode(),
               json.dumps(await state(gw)), repr(gw.gateway.ctx.pairing)]
    assert code == "480213"
    for text in outputs:
        assert re.search(r"(?<![0-9])480213(?![0-9])", text) is None, text
        assert key not in text
        assert key[len("sk-sluice-"):][:12] not in text
