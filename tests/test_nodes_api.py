"""The node registry (SPEC §8 "Nodes", §5 node keys) through the API and ``sluice nodes``:
config.yaml and secrets.yaml after every change, fingerprints from the node's identity or
derived from its URL, the order as priorities N..1, and keys that never come back out."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

import proxy.settings.config_file
import proxy.settings.store
from protocol.config import NodeConfig
from protocol.upstream_url import parse_upstream_url
from proxy.api.nodes import derived_fingerprint
from tests.client import request
from tests.conftest import RunningGateway, StartGateway, admin

KEY = "sk-node-key-0123456789-SECRETVALUE"


def token(gw: RunningGateway) -> str:
    return gw.gateway.settings.secrets.admin_token


def files(gw: RunningGateway) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """config.yaml's nodes, secrets.yaml's node_keys, and config.yaml's whole text."""
    folder = gw.gateway.settings.data_dir
    text = (folder / "config.yaml").read_text()
    secrets = yaml.safe_load((folder / "secrets.yaml").read_text())
    return yaml.safe_load(text)["nodes"] or [], secrets.get("node_keys") or {}, text


def closed_port_url() -> str:
    """A loopback URL nobody listens on: the identity lookup fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_identity(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    reply = await request(gw.unix, "GET", "/api/v1/node/identity")
    assert reply.status == 200
    assert reply.json() == {"fingerprint": gw.gateway.settings.node_id, "version": "0.1.0",
                            "identity": None}


async def test_add_uses_the_nodes_identity_and_sends_its_key(
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    node = await start_gateway([], require_auth=True)  # its loopback clients need a key
    node_fp = node.gateway.settings.node_id
    node_key = token(node)  # the node's admin token is a key it accepts
    url = f"http://{node.tcp}"
    # Without the key the node answers 401: the fingerprint is derived from the URL.
    unkeyed = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url})
    assert unkeyed.status == 201, unkeyed.body
    derived = derived_fingerprint(parse_upstream_url(url))
    assert unkeyed.json()["fingerprint"] == derived
    assert derived.startswith("node-")
    assert len(derived) == 5 + 16
    assert (await admin(gw, "DELETE", f"/api/v1/nodes/{derived}")).status == 200
    # With it, the node says who it is.
    made = await admin(gw, "POST", "/api/v1/nodes",
                       {"baseUrl": url + "/", "apiKey": node_key, "name": "studio"})
    assert made.status == 201, made.body
    assert made.json() == {"fingerprint": node_fp, "name": "studio", "baseUrl": url,
                           "priority": 255, "enabled": True, "weight": 1, "hasApiKey": True,
                           "pin": None, "link": "plain"}
    nodes, keys, text = files(gw)
    assert nodes == [{"fingerprint": node_fp, "name": "studio", "base_url": url,
                      "priority": 255, "enabled": True, "weight": 1}]
    assert keys == {node_fp: node_key}
    assert node_key not in text
    listed = await request(gw.unix, "GET", "/api/v1/nodes")
    assert listed.json() == [made.json()]
    assert node_key not in listed.body.decode()
    assert node_key not in repr(gw.gateway.settings)
    # The same node again, and this gateway itself, are refused.
    again = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url, "apiKey": node_key})
    assert again.status == 409
    assert again.json()["error"]["code"] == "node_exists"
    me = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": f"http://{gw.tcp}"})
    assert me.status == 422
    assert me.json()["error"]["param"] == "baseUrl"
    assert len(files(gw)[0]) == 1


async def test_derived_fingerprint_is_stable(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    url = closed_port_url()
    made = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url})
    assert made.status == 201
    assert made.json()["fingerprint"] == derived_fingerprint(parse_upstream_url(url))
    assert made.json()["name"] == "127.0.0.1"  # the host when no name is given
    assert made.json()["hasApiKey"] is False
    # The same address written differently is the same node.
    assert (await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url + "/"})).status == 409


async def test_order_patch_delete(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    fps = []
    for i in range(3):
        made = await admin(gw, "POST", "/api/v1/nodes",
                           {"baseUrl": closed_port_url(), "name": f"n{i}", "apiKey": f"{KEY}{i}"})
        assert made.status == 201
        fps.append(made.json()["fingerprint"])
    nodes, keys, _ = files(gw)
    assert [(n["fingerprint"], n["priority"]) for n in nodes] == list(zip(fps, [255, 254, 253],
                                                                          strict=True))
    assert set(keys) == set(fps)
    # Reorder: priorities N..1, top first.
    order = [fps[2], fps[0], fps[1]]
    moved = await admin(gw, "PUT", "/api/v1/nodes/order", {"order": order})
    assert moved.status == 200
    assert [(n["fingerprint"], n["priority"]) for n in moved.json()] == \
        list(zip(order, [3, 2, 1], strict=True))
    assert [n["fingerprint"] for n in (await request(gw.unix, "GET", "/api/v1/nodes")).json()] \
        == order
    assert [(n["fingerprint"], n["priority"]) for n in files(gw)[0]] == \
        list(zip(order, [3, 2, 1], strict=True))
    before = files(gw)[2]
    for bad in ({"order": order[:2]}, {"order": [*order, order[0]]}, {"order": "x"},
                {"order": [*order[:2], "node-unknown"]}, {"order": [1, 2, 3]}, {}):
        refused = await admin(gw, "PUT", "/api/v1/nodes/order", bad)
        assert refused.status == 422, bad
        assert refused.json()["error"]["param"] == "order", bad
    assert files(gw)[2] == before
    # Patch: name, routing switch, key, URL.
    path = f"/api/v1/nodes/{fps[0]}"
    patched = await admin(gw, "PATCH", path, {"name": "renamed", "enabled": False})
    assert patched.status == 200
    assert patched.json()["name"] == "renamed"
    assert patched.json()["enabled"] is False
    assert patched.json()["priority"] == 2
    new_url = closed_port_url()
    assert (await admin(gw, "PATCH", path, {"baseUrl": new_url})).json()["baseUrl"] == new_url
    cleared = await admin(gw, "PATCH", path, {"apiKey": None})
    assert cleared.json()["hasApiKey"] is False
    nodes, keys, _ = files(gw)
    assert fps[0] not in keys
    assert {"fingerprint": fps[0], "name": "renamed", "base_url": new_url, "priority": 2,
            "enabled": False, "weight": 1} in nodes
    assert (await admin(gw, "PATCH", path, {"apiKey": "sk-new"})).json()["hasApiKey"] is True
    assert files(gw)[1][fps[0]] == "sk-new"
    for bad, param in (({"baseUrl": "ftp://x"}, "baseUrl"), ({"enabled": "no"}, "enabled"),
                       ({"colour": 1}, "colour"), ({"name": 5}, "name")):
        refused = await admin(gw, "PATCH", path, bad)
        assert refused.status == 422, bad
        assert refused.json()["error"]["param"] == param
    assert (await admin(gw, "PATCH", "/api/v1/nodes/node-nope", {"enabled": True})).status \
        == 404
    # Delete removes the key too.
    gone = await admin(gw, "DELETE", f"/api/v1/nodes/{fps[1]}")
    assert gone.status == 200
    nodes, keys, _ = files(gw)
    assert fps[1] not in {n["fingerprint"] for n in nodes}
    assert fps[1] not in keys
    assert (await admin(gw, "DELETE", f"/api/v1/nodes/{fps[1]}")).status == 404
    # Live: the gateway's config is the file's.
    assert [n.fingerprint for n in gw.gateway.ctx.config.nodes] == \
        [n["fingerprint"] for n in nodes]


async def test_added_last_renumbers_when_needed(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    settings = gw.gateway.settings
    low = NodeConfig(fingerprint="node-low", name="low", base_url=closed_port_url(),
                     priority=1)
    high = attrs.evolve(low, fingerprint="node-high", name="high", priority=7)
    await settings.update(attrs.evolve(settings.config, nodes=(low, high)))
    made = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": closed_port_url()})
    assert made.status == 201
    listed = (await request(gw.unix, "GET", "/api/v1/nodes")).json()
    assert [(n["fingerprint"], n["priority"]) for n in listed] == \
        [("node-high", 3), ("node-low", 2), (made.json()["fingerprint"], 1)]


async def test_writes_need_the_admin_token(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    url = closed_port_url()
    fp = (await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url})).json()["fingerprint"]
    calls = [("POST", "/api/v1/nodes", {"baseUrl": closed_port_url()}),
             ("PATCH", f"/api/v1/nodes/{fp}", {"enabled": False}),
             ("DELETE", f"/api/v1/nodes/{fp}", None),
             ("PUT", "/api/v1/nodes/order", {"order": [fp]})]
    for method, path, body in calls:
        data = None if body is None else json.dumps(body).encode()
        assert (await request(gw.unix, method, path, data)).status == 401, path
        wrong = [("authorization", "Bearer not-the-token")]
        assert (await request(gw.unix, method, path, data, wrong)).status == 403, path
    assert [n["fingerprint"] for n in files(gw)[0]] == [fp]
    assert gw.gateway.ctx.config.nodes[0].enabled is True


async def test_bad_input_is_refused_without_echoing_keys(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    url = closed_port_url()
    for key in ("sk-with space-SECRETVALUE", "sk-SECRETVALUE\n", "", 12345):
        reply = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": url, "apiKey": key})
        assert reply.status == 422, key
        assert reply.json()["error"]["param"] == "apiKey"
        assert "SECRETVALUE" not in reply.body.decode()
    for body, param in (({"baseUrl": "unix:/tmp/x.sock"}, "baseUrl"),
                        ({"baseUrl": "http://"}, "baseUrl"), ({}, "baseUrl"),
                        ({"baseUrl": "http://u:pw@h:1"}, "baseUrl"),
                        ({"baseUrl": url, "name": "a\nb"}, "name"),
                        ({"baseUrl": url, "extra": 1}, "extra")):
        reply = await admin(gw, "POST", "/api/v1/nodes", body)
        assert reply.status == 422, body
        assert reply.json()["error"]["param"] == param, body
    assert (await admin(gw, "POST", "/api/v1/nodes", [1])).status == 400
    assert files(gw)[0] == []
    assert files(gw)[1] == {}


# ------------------------------------------------------------------------------ the CLI


async def test_a_failed_config_write_keeps_the_old_key(
        start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """secrets.yaml is written first; when config.yaml then cannot be, secrets.yaml is put
    back: the answer is a clean 500 and both files, and the gateway, are as they were."""
    gw = await start_gateway([])
    fp = (await admin(gw, "POST", "/api/v1/nodes",
                      {"baseUrl": closed_port_url(), "apiKey": KEY})).json()["fingerprint"]
    folder = gw.gateway.settings.data_dir
    secrets_before = (folder / "secrets.yaml").read_bytes()
    config_before = (folder / "config.yaml").read_bytes()
    real = proxy.settings.store.atomic_write
    tried: list[str] = []

    def write(path: Path, data: bytes, mode: int) -> None:
        tried.append(path.name)
        if path.name == "config.yaml":
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(proxy.settings.store, "atomic_write", write)

    monkeypatch.setattr(proxy.settings.config_file, "atomic_write", write)
    reply = await admin(gw, "PATCH", f"/api/v1/nodes/{fp}",
                        {"apiKey": KEY + "-NEW", "enabled": False})
    assert reply.status == 500
    assert reply.json()["error"] == {
        "message": "cannot save the node registry: No space left on device",
        "type": "server_error", "code": "internal_error", "param": None}
    assert KEY not in reply.body.decode()
    assert tried == ["secrets.yaml", "config.yaml", "secrets.yaml"]
    assert (folder / "secrets.yaml").read_bytes() == secrets_before
    assert (folder / "config.yaml").read_bytes() == config_before
    assert gw.gateway.settings.secrets.node_keys == {fp: KEY}
    assert [n.enabled for n in gw.gateway.settings.config.nodes] == [True]
    gone = await admin(gw, "DELETE", f"/api/v1/nodes/{fp}")
    assert gone.status == 500
    assert [n.fingerprint for n in gw.gateway.settings.config.nodes] == [fp]
