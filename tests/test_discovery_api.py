"""``GET|PUT /api/v1/settings/discovery`` and ``GET /api/v1/nodes/discovered`` (SPEC §14)
on an in-process gateway whose discovery runs on a fake link (tests/test_discovery.py's
:class:`FakeLink`: nothing reaches a network): the shapes, the PUT rules (admin, 422 naming
the path, read-only fields ignored), the file, live start and stop, the ``settings`` and
``discovered`` events, ``added``, and the route not swallowed by ``/api/v1/nodes/{fp}``."""

from __future__ import annotations

import json
import os
from typing import Any

import trio
import trio.testing
import yaml

from protocol.lan.dnssd import announce_packet
from proxy.api.routes import route
from proxy.api.settings_discovery import discovered
from proxy.lan.discovery.link import NO_MDNS
from proxy.lan.discovery_switch import UNAVAILABLE
from tests.client import Reply, request
from tests.conftest import RunningGateway, StartGateway, configure, node
from tests.test_discovery import ETH0, PEER, PEER_AT, FakeLink
from tests.waits import settled

SETTINGS = "/api/v1/settings/discovery"
DISCOVERED = "/api/v1/nodes/discovered"


async def put(gw: RunningGateway, body: Any) -> Reply:
    secret = gw.gateway.settings.secrets.admin_token
    return await request(gw.unix, "PUT", SETTINGS, json.dumps(body).encode(),
                         [("authorization", f"Bearer {secret}")])


def fake_link(gw: RunningGateway) -> list[FakeLink]:
    """Discovery of ``gw`` opens fake links from now on; the list holds them."""
    links: list[FakeLink] = []

    async def open_link() -> FakeLink:
        links.append(FakeLink([ETH0]))
        return links[-1]

    switch = gw.gateway.discovery
    switch.open_link = open_link  # type: ignore[assignment]
    return links


async def get(gw: RunningGateway, path: str) -> Any:
    reply = await request(gw.unix, "GET", path)
    assert reply.status == 200, reply.body
    return reply.json()


async def test_settings_shape_rules_and_file(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    links = fake_link(gw)
    off = {"announce": False, "browse": False, "announcing": False, "browsing": False}
    assert await get(gw, SETTINGS) == off
    assert await get(gw, DISCOVERED) == []
    assert (await request(gw.unix, "PUT", SETTINGS, b'{"browse": true}')).status == 401
    before = (gw.gateway.settings.data_dir / "config.yaml").read_bytes()
    for body, param in (({"browse": "yes"}, "discovery.browse"),
                        ({"announce": 1}, "discovery.announce"),
                        ({"listen": True}, "listen")):
        reply = await put(gw, body)
        assert reply.status == 422, body
        assert reply.json()["error"]["param"] == param
    assert (gw.gateway.settings.data_dir / "config.yaml").read_bytes() == before
    # The GET's own shape is accepted back; the computed fields are ignored.
    reply = await put(gw, {**off, "announce": True, "announcing": True, "browsing": True})
    assert reply.status == 200
    assert reply.json() == {**off, "announce": True}  # no external access: not announcing
    on_disk = yaml.safe_load((gw.gateway.settings.data_dir / "config.yaml").read_text())
    assert on_disk["discovery"] == {"announce": True, "browse": False}
    # Browsing needs load balancing: on, but not in effect, and nothing started.
    assert (await put(gw, {"browse": True})).json()["browsing"] is False
    await trio.testing.wait_all_tasks_blocked()
    assert links == []
    assert gw.gateway.discovery is not None
    assert gw.gateway.discovery.service is None


async def test_browsing_live_on_and_off(start_gateway: StartGateway) -> None:
    gw = await start_gateway([], lb=True)
    links = fake_link(gw)
    events: list[tuple[str, Any]] = []
    gw.gateway.hub.subscribe(lambda kind, _at, data: events.append((kind, data)),
                             ("settings", "discovered"))
    reply = await put(gw, {"browse": True})
    assert reply.json() == {"announce": False, "browse": True, "announcing": False,
                            "browsing": True}
    assert ("settings", {"section": "discovery", "value": reply.json()}) in events
    await settled(lambda: bool(links and links[0].queries()), "the first query")
    link = links[0]
    assert link.joined == [ETH0.address]
    assert link.announcements() == []  # browsing only
    link.deliver(announce_packet(PEER), PEER_AT)
    entry = {"fingerprint": "node-studio", "name": "studio",
             "baseUrl": "http://10.1.0.7:39081", "version": "9.9", "added": False}
    await settled(lambda: ("discovered", {"computers": [entry]}) in events, "the discovery")
    assert await get(gw, DISCOVERED) == [entry]
    assert ("discovered", {"computers": [entry]}) in events
    # Adding it to the config's nodes (the user's action) turns ``added`` on, with an event.
    configure(gw, (node("node-studio", "http://10.1.0.7:39081", 1),))
    await put(gw, {"browse": True})  # any write: the switch looks at the config again
    assert await get(gw, DISCOVERED) == [{**entry, "added": True}]
    assert events[-1] == ("discovered", {"computers": [{**entry, "added": True}]})
    # Load balancing off: browsing stops, the list is emptied, the link closed.
    lb = await request(gw.unix, "PUT", "/api/v1/settings/load-balancing",
                       b'{"enabled": false}', [("authorization", "Bearer "
                                                + gw.gateway.settings.secrets.admin_token)])
    assert lb.status == 200
    await settled(lambda: link.closed, "the link closed")
    assert await get(gw, DISCOVERED) == []
    assert events[-1] == ("discovered", {"computers": []})
    assert (await get(gw, SETTINGS))["browsing"] is False


async def test_the_suite_never_opens_the_real_mdns_socket(start_gateway: StartGateway) -> None:
    # tests/conftest.py sets SLUICE_NO_MDNS for the whole run: a gateway whose discovery is
    # switched on outside a test's network namespace refuses to open UDP 5353 and says so.
    assert os.environ.get(NO_MDNS)
    gw = await start_gateway([], lb=True)
    assert (await put(gw, {"browse": True})).json()["browsing"] is True
    notes = gw.gateway.ctx.notifications
    await settled(lambda: any(n["code"] == UNAVAILABLE for n in notes.all()),
                  f"the {UNAVAILABLE} notification")
    (note,) = [n for n in notes.all() if n["code"] == UNAVAILABLE]
    assert NO_MDNS in note["message"]
    assert gw.gateway.discovery.service is None
    assert await get(gw, DISCOVERED) == []


def test_the_route_is_not_a_node_fingerprint() -> None:
    assert route(b"GET", DISCOVERED) is discovered
