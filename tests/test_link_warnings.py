"""SPEC §16: one ``plain_node_link`` warning for nodes reached over plain HTTP outside
127.0.0.0/8; raised once per node that becomes one, cleared when none is left."""

from __future__ import annotations

import attrs

from protocol.config import Config, NodeConfig, default_config
from proxy.lan.link_warnings import PLAIN_NODE_LINK, PlainLinks, plain_remote_nodes
from proxy.notifications import Notifications
from tests.conftest import node

PIN = "sha256:" + "ab" * 32


def config(*nodes: NodeConfig, lb: bool = True) -> Config:
    cfg = default_config()
    return attrs.evolve(cfg, nodes=tuple(nodes),
                        load_balancing=attrs.evolve(cfg.load_balancing, enabled=lb))


def warnings(notes: Notifications) -> list[str]:
    return [n["message"] for n in notes.all() if n["code"] == PLAIN_NODE_LINK]


def test_which_nodes_are_plain_and_remote() -> None:
    lan = node("node-lan", "http://192.168.1.50:39080", 3)
    local = node("node-loop", "http://127.0.0.2:39080", 2)
    named = node("node-name", "http://localhost:39080", 1)
    pinned = attrs.evolve(node("node-pin", "http://192.168.1.51:39080", 4), pin=PIN)
    off = node("node-off", "http://192.168.1.52:39080", 5, enabled=False)
    assert plain_remote_nodes([lan, local, named, pinned, off]) == [lan]


def test_raised_once_per_new_node_and_cleared_when_none_is_left() -> None:
    notes = Notifications()
    links = PlainLinks(notes, config())
    assert warnings(notes) == []
    lan = node("node-lan", "http://192.168.1.50:39080", 3)
    links(config(lan))
    [first] = warnings(notes)
    assert "node-lan (http://192.168.1.50:39080)" in first
    assert "--code" in first
    created = notes.all()[0]["createdAt"]
    notes.clear(PLAIN_NODE_LINK)  # seen and dismissed: the same nodes do not raise it again
    links(config(lan))
    assert warnings(notes) == []
    other = node("node-two", "http://10.0.0.9:39080", 2)
    links(config(lan, other))  # a new one does, naming both
    [again] = warnings(notes)
    assert "node-two" in again
    assert "node-lan" in again
    assert notes.all()[0]["createdAt"] >= created
    links(config(lan, other, lb=False))  # nothing goes to nodes with load balancing off
    assert warnings(notes) == []
    links(config(lan, other))
    assert len(warnings(notes)) == 1
    links(config(attrs.evolve(lan, pin=PIN), attrs.evolve(other, enabled=False)))
    assert warnings(notes) == []
