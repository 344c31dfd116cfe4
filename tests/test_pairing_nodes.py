"""Pairing on the computer that adds (SPEC §14): ``POST /api/v1/nodes {baseUrl,
pairingCode}`` claims the code at the other gateway and keeps the key it gives as that node's
key, never showing it; the other side's 401 is our 422 naming ``pairingCode``, its 429
comes back with its Retry-After, no answer or no connection is 502, a broken answer 502;
``apiKey`` with ``pairingCode`` is 422; a node already there is 409. In-process gateways
over real loopback sockets."""

from __future__ import annotations

import json
import socket

import trio
import yaml

from tests.client import error_of
from tests.conftest import RunningGateway, StartGateway, admin
from tests.fakeupstream import FakeUpstream, status

NODES = "/api/v1/nodes"


async def new_code(gw: RunningGateway) -> str:
    reply = await admin(gw, "POST", "/api/v1/pairing")
    assert reply.status == 200, reply.body
    code: str = reply.json()["code"]
    return code


def node_keys(gw: RunningGateway) -> dict[str, str]:
    text = (gw.gateway.settings.data_dir / "secrets.yaml").read_text()
    keys: dict[str, str] = yaml.safe_load(text).get("node_keys") or {}
    return keys


def wrong(code: str) -> str:
    return "000000" if code != "000000" else "111111"


async def test_adding_a_node_with_a_code(start_gateway: StartGateway) -> None:
    a = await start_gateway([])
    b = await start_gateway([])
    b_fp = b.gateway.settings.node_id
    code = await new_code(b)
    made = await admin(a, "POST", NODES, {"baseUrl": f"http://{b.tcp}",
                                          "pairingCode": f"{code[:3]} {code[3:]}"})
    assert made.status == 201, made.body
    assert made.json() == {"fingerprint": b_fp, "name": "127.0.0.1",
                           "baseUrl": f"http://{b.tcp}", "priority": 255, "enabled": True,
                           "weight": 1, "hasApiKey": True, "pin": None, "link": "plain"}
    key = node_keys(a)[b_fp]
    assert key not in made.body.decode()
    assert key not in (a.gateway.settings.data_dir / "config.yaml").read_text()
    # The key is one of B's access keys, named after A's computer.
    entry = b.gateway.settings.keys.find(key)
    assert entry is not None
    assert entry["name"] == socket.gethostname()[:100]
    listed = (await admin(a, "GET", NODES)).json()
    assert listed == [made.json()]
    # Paired again with a new code: the node is there already (as POST does today).
    again = await admin(a, "POST", NODES, {"baseUrl": f"http://{b.tcp}",
                                           "pairingCode": await new_code(b), "name": "b"})
    assert (again.status, error_of(again)["code"]) == (409, "node_exists")
    assert node_keys(a) == {b_fp: key}


async def test_a_code_the_other_side_refuses(start_gateway: StartGateway) -> None:
    a = await start_gateway([])
    b = await start_gateway([])
    code = await new_code(b)
    url = f"http://{b.tcp}"
    for n in range(5):  # A's claims all come from 127.0.0.1: B allows 5 a minute
        refused = await admin(a, "POST", NODES, {"baseUrl": url, "pairingCode": wrong(code)})
        assert refused.status == 422, refused.body
        assert error_of(refused)["param"] == "pairingCode"
        assert "the code was not accepted: wrong, used or expired" in \
            error_of(refused)["message"]
        assert (await admin(b, "GET", "/api/v1/pairing")).json()["triesLeft"] == 4 - n
    limited = await admin(a, "POST", NODES, {"baseUrl": url, "pairingCode": code})
    assert limited.status == 429, limited.body
    assert limited.header("retry-after") == "12"
    assert "retry in 12 s" in error_of(limited)["message"]
    assert (await admin(a, "GET", NODES)).json() == []
    assert node_keys(a) == {}


async def test_fields_checked_before_asking(start_gateway: StartGateway) -> None:
    a = await start_gateway([])
    b = await start_gateway([])
    code = await new_code(b)
    url = f"http://{b.tcp}"
    for doc in ({"baseUrl": url, "pairingCode": code, "apiKey": "sk-x"},
                {"baseUrl": url, "pairingCode": "12345"},
                {"baseUrl": url, "pairingCode": 123456}):
        reply = await admin(a, "POST", NODES, doc)
        assert (reply.status, error_of(reply)["param"]) == (422, "pairingCode"), reply.body
        assert code not in reply.body.decode()
    assert (await admin(b, "GET", "/api/v1/pairing")).json()["triesLeft"] == 5


async def test_no_answer_is_502(start_gateway: StartGateway, blackhole: str) -> None:
    a = await start_gateway([], connection=0.3)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    reply = await admin(a, "POST", NODES, {"baseUrl": closed, "pairingCode": "123456"})
    assert (reply.status, error_of(reply)["code"]) == (502, "upstream_connection_error")
    assert f"cannot pair with {closed}" in error_of(reply)["message"]
    with trio.fail_after(5):
        hung = await admin(a, "POST", NODES, {"baseUrl": blackhole, "pairingCode": "123456"})
    assert hung.status == 502, hung.body
    assert "no answer within 10s (connect: 0.3s)" in error_of(hung)["message"]
    assert (await admin(a, "GET", NODES)).json() == []


async def test_broken_answers_are_502(start_gateway: StartGateway, nursery: trio.Nursery
                                      ) -> None:
    a = await start_gateway([])
    fake = FakeUpstream()
    await nursery.start(fake.serve)
    url = fake.url.removesuffix("/v1").rstrip("/")
    claim = "/api/v1/pairing/claim"
    for answer, said in (
            (status(200, {"fingerprint": "node-b"}), "not a fingerprint and an access key"),
            (status(403, {"error": {"message": "the Host header names neither localhost"}}),
             "it answered 403: the Host header names neither localhost"),
            (status(500, {"error": {"message": "line\nbreak"}}), "it answered 500")):
        fake.on("POST", claim, answer)
        reply = await admin(a, "POST", NODES, {"baseUrl": url, "pairingCode": "123456"})
        assert (reply.status, error_of(reply)["code"]) == (502, "upstream_protocol_error")
        assert said in error_of(reply)["message"]
        assert "\n" not in error_of(reply)["message"]
    fake._routes.pop(("POST", claim), None)
    reply = await admin(a, "POST", NODES, {"baseUrl": url, "pairingCode": "123456"})
    assert reply.status == 502
    assert "does not offer pairing" in error_of(reply)["message"]
    sent = [r for r in fake.requests if r.path == claim][-1]
    body = json.loads(sent.body)
    assert body == {"code": "123456", "fingerprint": a.gateway.settings.node_id,
                    "name": socket.gethostname()[:100]}
    assert not any(k == b"authorization" for k, _ in sent.headers)
