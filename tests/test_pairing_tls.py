"""SPEC §16 between two in-process gateways on loopback (external access bound to 127.0.0.1
only): A pairs with B by B's code over B's node listener (SPAKE2, the code never sent), B
makes a key bound to A's certificate and lists A as a paired peer, A pins B's certificate
and from then on reaches B only over that TLS link (the model list and a streamed chat,
byte for byte, on one pooled connection). A wrong code costs one of B's tries and pins
nothing. B with a new certificate is refused by A (offline, ``node_identity_changed``, one
warning); pairing again pins the new one. Unpairing on B closes A's link."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from proxy.link.identity import Identity
from proxy.server import Gateway
from proxy.settings.store import Settings
from tests.client import CHAT, chat_body, error_of, request
from tests.conftest import RunningGateway, StartGateway, admin, free_port
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.test_node_listener import loopback_only  # noqa: F401 (fixture)
from tests.tls_certs import identities
from tests.waits import published, until

pytestmark = pytest.mark.usefixtures("loopback_only", "remote_seam")  # 127.0.0.2: remote

NODES = "/api/v1/nodes"


async def start_b(start_gateway: StartGateway, upstream: FakeUpstream, identity: Identity,
                  port: int, node_port: int) -> RunningGateway:
    return await start_gateway([("fake", upstream.url)], identity=identity, port=port,
                               allow_external_access=True, node_port=node_port)


async def code_of(b: RunningGateway) -> str:
    made = await admin(b, "POST", "/api/v1/pairing")
    assert made.status == 200, made.body
    code: str = made.json()["code"]
    return code


async def pair(a: RunningGateway, b: RunningGateway, code: str) -> Any:
    return await admin(a, "POST", NODES, {"baseUrl": f"http://{b.tcp}", "pairingCode": code})


async def node_state(a: RunningGateway, fingerprint: str) -> dict[str, Any]:
    pool = (await admin(a, "GET", "/api/v1/pool/distributed-status")).json()
    entry: dict[str, Any] = next(e for e in pool["endpoints"] if e["fingerprint"] == fingerprint)
    return entry


async def node_is(a: RunningGateway, fingerprint: str, what: str, **state: Any) -> None:
    """Until A's node ``fingerprint`` has ``state`` (NodeEndpoint attributes), looked at
    after each change A's node index publishes; then A's API says so too."""
    nodes = a.gateway.ctx.nodes

    def holds() -> bool:
        endpoint = nodes.endpoint(fingerprint)
        return endpoint is not None and all(getattr(endpoint, name) == value
                                            for name, value in state.items())

    await published(nodes.changes, holds, what)
    entry = await node_state(a, fingerprint)
    assert entry["status"] == nodes.endpoint(fingerprint).status, entry  # type: ignore[union-attr]


@pytest.fixture
def ids(short_tmp: Path) -> list[Identity]:
    return identities(short_tmp / "ids", "a", "b", "b2")


async def test_pair_pin_and_chat_over_the_tls_link(
        start_gateway: StartGateway, upstream: FakeUpstream, ids: list[Identity],
        nursery: trio.Nursery) -> None:
    id_a, id_b, id_b2 = ids
    port, node_port = free_port(), free_port()
    events = sse_events(8)
    upstream.on("POST", CHAT, sse_stream(events))
    b = await start_b(start_gateway, upstream, id_b, port, node_port)
    a = await start_gateway([], identity=id_a, lb=True, interval=0.3, hc_timeout=2.0)
    assert (await request(b.tcp, "GET", "/health")).json() == {
        "status": "ok", "identity": id_b.fingerprint, "nodePort": node_port}
    settings = (await admin(b, "GET", "/api/v1/settings/api")).json()
    assert (settings["identity"], settings["nodePort"]) == (id_b.fingerprint, node_port)

    # A wrong code: one of B's 5 tries, nothing pinned, nothing made.
    code = await code_of(b)
    wrong = await pair(a, b, "000000" if code != "000000" else "111111")
    assert (wrong.status, error_of(wrong)["param"]) == (422, "pairingCode"), wrong.body
    assert (await admin(b, "GET", "/api/v1/pairing")).json()["triesLeft"] == 4
    assert (await admin(a, "GET", NODES)).json() == []
    assert (await admin(b, "GET", "/api/v1/pairing/peers")).json() == []

    made = await pair(a, b, code)
    assert made.status == 201, made.body
    node = made.json()
    b_fp = b.gateway.settings.node_id
    assert (node["fingerprint"], node["pin"], node["link"]) == (b_fp, id_b.fingerprint,
                                                                 "pinned")
    assert node["hasApiKey"] is True
    [peer] = (await admin(b, "GET", "/api/v1/pairing/peers")).json()
    assert peer["fingerprint"] == id_a.fingerprint
    assert b.gateway.ctx.node_peers is not None
    assert b.gateway.ctx.node_peers.key_id_for(id_a.fingerprint) == peer["keyId"]
    assert (await admin(b, "GET", "/api/v1/pairing")).json()["state"] == "claimed"
    # The key made for A counts only with A's certificate: on B's API port it is no key.
    key = a.gateway.settings.secrets.node_keys[b_fp]
    over_api = await request(b.tcp, "GET", "/v1/models", None,
                             [("authorization", f"Bearer {key}")], source="127.0.0.2")
    assert (over_api.status, error_of(over_api)["code"]) == (401, "invalid_api_key")
    text = (a.gateway.settings.data_dir / "config.yaml").read_text()
    assert f"pin: {id_b.fingerprint}" in text

    await node_is(a, b_fp, "B online over TLS", status="online")
    handshakes = a.gateway.connections.handshakes
    assert handshakes >= 1
    direct = await request(b.unix, "POST", CHAT, chat_body("fake-model", stream=True))
    for _ in range(3):
        reply = await request(a.unix, "POST", CHAT, chat_body("fake-model", stream=True))
        assert (reply.status, reply.header("x-sluice-served-by")) == (200, f"node:{b_fp}")
        assert reply.body == direct.body  # byte for byte through the pinned link
    assert a.gateway.connections.handshakes <= handshakes + 1  # pooled, not per request

    # B comes back with another certificate on the same ports: A refuses it.
    b.gateway.shutdown()
    await until(lambda: _closed(port), "B stopped")
    b2 = RunningGateway(Gateway(Settings.open(b.gateway.settings.data_dir), drain_timeout=1,
                                identity=id_b2))  # its data folder, a new certificate
    await nursery.start(b2.gateway.run)

    await node_is(a, b_fp, "A refuses B's new certificate", last_error="node_identity_changed")
    assert (await node_state(a, b_fp)).get("lastError") == "node_identity_changed"
    assert (await node_state(a, b_fp))["status"] == "offline"
    notes = (await admin(a, "GET", "/api/v1/notifications")).json()["notifications"]
    [changed] = [n for n in notes if n["code"] == "node_identity_changed"]
    assert id_b2.fingerprint in changed["message"]
    assert id_b.fingerprint in changed["message"]
    failed = await request(a.unix, "POST", CHAT, chat_body("fake-model"))
    assert failed.status != 200  # nothing goes to a certificate that is not pinned
    # Pairing again pins the new certificate; the notification goes.
    again = await pair(a, b2, await code_of(b2))
    assert again.status == 200, again.body
    assert again.json()["pin"] == id_b2.fingerprint
    await node_is(a, b_fp, "B online again", status="online")
    notes = (await admin(a, "GET", "/api/v1/notifications")).json()["notifications"]
    assert not [n for n in notes if n["code"] == "node_identity_changed"]
    assert (await request(a.unix, "POST", CHAT, chat_body("fake-model"))).status == 200

    # Unpairing on B: A's link closes, its next handshake is refused.
    gone = await admin(b2, "DELETE", f"/api/v1/pairing/peers/{id_a.fingerprint}")
    assert gone.json() == {"fingerprint": id_a.fingerprint, "unpaired": True}
    assert (await admin(b2, "GET", "/api/v1/pairing/peers")).json() == []

    await node_is(a, b_fp, "A cut off", status="offline")
    missing = await admin(b2, "DELETE", f"/api/v1/pairing/peers/{id_a.fingerprint}")
    assert missing.status == 404


async def _closed(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


async def test_the_exchange_is_served_on_the_node_port_only(
        start_gateway: StartGateway, upstream: FakeUpstream, ids: list[Identity]) -> None:
    b = await start_b(start_gateway, upstream, ids[1], free_port(), free_port())
    body = json.dumps({"step": 1, "message": "x", "fingerprint": ids[0].fingerprint}).encode()
    reply = await request(b.tcp, "POST", "/api/v1/pairing/exchange", body,
                          [("content-type", "application/json")])
    assert (reply.status, error_of(reply)["code"]) == (404, "not_found")
    assert "node port" in error_of(reply)["message"]
