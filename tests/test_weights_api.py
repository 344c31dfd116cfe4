"""Node weights through the API and ``sluice nodes`` (SPEC §8, §13): ``weight`` in the
registry's entries, set on ``POST`` and ``PATCH`` (422 naming ``weight`` for anything but a
whole number in 1..100, nothing changed), written to config.yaml with each node and live at
once; the strategy ``weighted`` through the load-balancing settings; ``weight`` in the
distributed status; ``sluice nodes list`` (WEIGHT), ``nodes weight FP N``, ``add --weight``."""

from __future__ import annotations

from typing import Any

import yaml

from tests.conftest import RunningGateway, StartGateway
from tests.test_nodes_api import admin, closed_port_url

LB = "/api/v1/settings/load-balancing"


def file_nodes(gw: RunningGateway) -> list[dict[str, Any]]:
    text = (gw.gateway.settings.data_dir / "config.yaml").read_text()
    nodes: list[dict[str, Any]] = yaml.safe_load(text)["nodes"] or []
    return nodes


def live_weights(gw: RunningGateway) -> dict[str, int]:
    return {n.fingerprint: n.weight for n in gw.gateway.ctx.config.nodes}


async def test_weight_through_post_get_and_patch(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    plain = await admin(gw, "POST", "/api/v1/nodes", {"baseUrl": closed_port_url()})
    assert plain.status == 201, plain.body
    assert plain.json()["weight"] == 1  # the default
    heavy = await admin(gw, "POST", "/api/v1/nodes",
                        {"baseUrl": closed_port_url(), "name": "big", "weight": 40})
    assert heavy.status == 201, heavy.body
    fp1, fp2 = plain.json()["fingerprint"], heavy.json()["fingerprint"]
    assert heavy.json()["weight"] == 40
    assert [(n["fingerprint"], n["weight"]) for n in file_nodes(gw)] == [(fp1, 1), (fp2, 40)]
    listed = await admin(gw, "GET", "/api/v1/nodes")
    assert [(n["fingerprint"], n["weight"]) for n in listed.json()] == [(fp1, 1), (fp2, 40)]
    # PATCH: the weight alone, then with another field; applied live and written.
    for weight in (100, 1, 7):
        patched = await admin(gw, "PATCH", f"/api/v1/nodes/{fp1}", {"weight": weight})
        assert patched.status == 200, patched.body
        assert patched.json()["weight"] == weight
        assert live_weights(gw)[fp1] == weight
        assert file_nodes(gw)[0]["weight"] == weight
    both = await admin(gw, "PATCH", f"/api/v1/nodes/{fp2}", {"weight": 3, "enabled": False})
    assert (both.json()["weight"], both.json()["enabled"]) == (3, False)
    assert live_weights(gw) == {fp1: 7, fp2: 3}


async def test_bad_weights_are_refused_naming_the_field(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    fp = (await admin(gw, "POST", "/api/v1/nodes",
                      {"baseUrl": closed_port_url(), "weight": 5})).json()["fingerprint"]
    text = (gw.gateway.settings.data_dir / "config.yaml").read_text()
    for bad, says in ((0, "between 1 and 100, got 0"), (101, "between 1 and 100, got 101"),
                      (-1, "between 1 and 100, got -1"), ("3", "whole number"),
                      (2.5, "whole number"), (True, "whole number"), (None, "whole number"),
                      ([3], "whole number")):
        refused = await admin(gw, "PATCH", f"/api/v1/nodes/{fp}", {"weight": bad})
        assert refused.status == 422, bad
        error = refused.json()["error"]
        assert error["param"] == "weight", (bad, error)
        assert says in error["message"], (bad, error)
        added = await admin(gw, "POST", "/api/v1/nodes",
                            {"baseUrl": closed_port_url(), "weight": bad})
        if bad is None:  # POST: null is "not given" (as for name and apiKey)
            assert added.status == 201
            assert added.json()["weight"] == 1
            deleted = await admin(gw, "DELETE", f"/api/v1/nodes/{added.json()['fingerprint']}")
            assert deleted.status == 200
            continue
        assert added.status == 422, bad
        assert added.json()["error"]["param"] == "weight"
    assert (gw.gateway.settings.data_dir / "config.yaml").read_text() == text
    assert live_weights(gw) == {fp: 5}


async def test_the_weighted_strategy_and_the_status(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    fp = (await admin(gw, "POST", "/api/v1/nodes",
                      {"baseUrl": closed_port_url(), "weight": 9})).json()["fingerprint"]
    put = await admin(gw, "PUT", LB, {"enabled": True, "strategy": "weighted"})
    assert put.status == 200, put.body
    assert put.json()["strategy"] == "weighted"
    assert gw.gateway.ctx.config.load_balancing.strategy == "weighted"
    doc = yaml.safe_load((gw.gateway.settings.data_dir / "config.yaml").read_text())
    assert doc["load_balancing"]["strategy"] == "weighted"
    wrong = await admin(gw, "PUT", LB, {"strategy": "weight"})
    assert wrong.status == 422
    assert wrong.json()["error"]["param"] == "load_balancing.strategy"
    assert "weighted" in wrong.json()["error"]["message"]
    status = await admin(gw, "GET", "/api/v1/pool/distributed-status")
    assert status.json()["strategy"] == "weighted"
    assert [(e["fingerprint"], e["weight"]) for e in status.json()["endpoints"]] == [(fp, 9)]
    await admin(gw, "PATCH", f"/api/v1/nodes/{fp}", {"weight": 2})
    status = await admin(gw, "GET", "/api/v1/pool/distributed-status")
    assert status.json()["endpoints"][0]["weight"] == 2
    summary = await admin(gw, "GET", "/api/v1/inference/status")
    assert summary.json()["distributed"]["strategy"] == "weighted"


