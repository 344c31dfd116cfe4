"""The settings API's one field table (protocol/config/fields.py) and its one JSON-to-config
path (protocol/config/writes.py), pure: every field of every section round-trips (GET view
-> PUT body -> the same config), the restart flags are the one restart rule, and an unknown
field or a wrong type is refused in one wording naming the right param."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import proxy.registry.nodes
from protocol.aliases import AliasTable
from protocol.config import Config, NodeConfig, default_config, rebuild_health_check
from protocol.config.changes import RESTART_FIELDS
from protocol.config.fields import (
    ALIASES,
    API,
    DISCOVERY,
    LOAD_BALANCING,
    NODES,
    SETTINGS_SECTIONS,
    TIMEOUTS,
    Section,
    check_fields,
    schema_type,
    unknown_field,
)
from protocol.config.writes import apply_write, structure_field
from protocol.errors import ConfigError
from protocol.lan.pairing import parse_claim
from protocol.views import (
    PAUSED,
    UNCHECKED,
    aliases_view,
    api_view,
    discovery_view,
    load_balancing_view,
    node_entry,
    registry_view,
    timeouts_view,
)


def changed_everywhere() -> Config:
    """A config whose every settings field differs from its default."""
    cfg = default_config()
    t = cfg.timeouts
    return rebuild_health_check(attrs.evolve(
        cfg,
        api=attrs.evolve(cfg.api, enabled=False, port=4242, allow_external_access=True,
                         require_auth=True),
        local=attrs.evolve(cfg.local, socket_dir="/tmp/sl-x"),
        load_balancing=attrs.evolve(cfg.load_balancing, enabled=True, strategy="weighted",
                                    failover_enabled=False, prefer_loaded=False),
        health_checks=attrs.evolve(cfg.health_checks, interval=7.0, timeout=3.0),
        timeouts=attrs.evolve(
            t, connection=12.0, model_load=90.0,
            request=attrs.evolve(t.request,
                                 standard=attrs.evolve(t.request.standard, total=90.5),
                                 streaming=attrs.evolve(t.request.streaming,
                                                        chunk_interval=45.0))),
        discovery=attrs.evolve(cfg.discovery, announce=True, browse=True),
        aliases=AliasTable([("gpt-4o", "small"), ("claude-*", "big")]),
        nodes=(NodeConfig("node-a", "a", "http://192.0.2.1:39080", 2, enabled=False, weight=9),
               NodeConfig("node-b", "b", "http://192.0.2.2", 1)),
    ))


def views(cfg: Config) -> dict[str, dict[str, Any]]:
    return {"api": api_view(cfg, False), "loadBalancing": load_balancing_view(cfg),
            "timeouts": timeouts_view(cfg), "discovery": discovery_view(cfg, True),
            "aliases": aliases_view(cfg)}


def test_every_section_field_round_trips() -> None:
    target = changed_everywhere()
    cfg = attrs.evolve(default_config(), nodes=target.nodes)
    shown = views(target)
    for section in (API, LOAD_BALANCING, TIMEOUTS, DISCOVERY, ALIASES):
        body = shown[section.name]
        assert [k for k in body if k not in section.read_only] == list(section.names)
        cfg = apply_write(section, body, cfg)  # the GET's own shape, read-only fields too
        assert views(cfg)[section.name] == body
    assert cfg == target
    # Each field alone changes that field alone.
    for section in (API, LOAD_BALANCING, TIMEOUTS, DISCOVERY, ALIASES):
        for name in section.names:
            one = apply_write(section, {name: shown[section.name][name]}, default_config())
            assert views(one)[section.name][name] == shown[section.name][name]


def test_node_fields_round_trip() -> None:
    cfg = changed_everywhere()
    keys = {"node-a": "k"}
    listed = registry_view(cfg, keys)
    assert [e["fingerprint"] for e in listed] == ["node-a", "node-b"]
    for node, entry in zip(cfg.nodes, listed, strict=True):
        assert entry == {**node_entry(node, keys)}
        assert entry["hasApiKey"] is (node.fingerprint in keys)
        assert list(entry) == [*NODES.names, *NODES.read_only]
        again = {f.key: structure_field(NODES, f.json, entry[f.json]) for f in NODES.fields}
        assert NodeConfig(**again) == node


def test_the_table_reads_the_schema_and_the_restart_rule() -> None:
    restart = {f"{s}.{k}" for s, k in RESTART_FIELDS}
    for section in SETTINGS_SECTIONS:
        for f in section.fields:
            assert f.type == schema_type(f.path)
            assert f.restart is (f.path in restart), f
    flagged = {f.path for s in SETTINGS_SECTIONS for f in s.fields if f.restart}
    assert flagged == restart - {"ollama_api.port"}  # no settings section shows that one
    assert schema_type("nodes[].weight") is int
    assert schema_type("timeouts.request.streaming.total") == schema_type("timeouts.connection")
    assert [s.name for s in SETTINGS_SECTIONS] == ["api", "loadBalancing", "timeouts",
                                                    "discovery", "aliases", "nodes"]


@pytest.mark.parametrize("section", [API, LOAD_BALANCING, DISCOVERY, ALIASES])
def test_an_unknown_field_is_named_in_one_wording(section: Section) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_write(section, {section.names[0]: None, "bogus": 1}, default_config())
    expected = (section.names[0] if len(section.names) == 1
                else "one of " + ", ".join(section.names))
    assert caught.value.param == "bogus"
    assert caught.value.message == f"bogus: unknown field; expected {expected}"


def test_the_one_wording_everywhere() -> None:
    assert unknown_field("x", ("a", "b")).message == "x: unknown field; expected one of a, b"
    assert unknown_field("x", ("a",)).message == "x: unknown field; expected a"
    with pytest.raises(ConfigError) as caught:
        check_fields({"a": 1, "zz": 2, "b": 3, "yy": 4}, ("a", "b"))
    assert caught.value.param == "zz"  # the first in the body's order
    check_fields({"a": 1, "seen": 2}, ("a",), ignored=("seen",))
    with pytest.raises(ConfigError) as caught:
        parse_claim({"code": "123456", "fingerprint": "node-a", "extra": 1})
    assert caught.value.message == "extra: unknown field; expected one of code, fingerprint, name"


def test_a_tree_section_refuses_unknown_keys_as_the_file_does() -> None:
    for body, path in (({"overall": "1s"}, "timeouts.overall"),
                       ({"request": {"standard": {"slow": "1s"}}},
                        "timeouts.request.standard.slow"),
                       ({"health_check": {"often": "1s"}}, "timeouts.health_check.often")):
        with pytest.raises(ConfigError) as caught:
            apply_write(TIMEOUTS, body, default_config())
        key = path.rsplit(".", 1)[-1]
        assert (caught.value.param, caught.value.message) == (path,
                                                              f"{path}: unknown key {key!r}")


WRONG: dict[Any, object] = {bool: "yes", int: "80", str: 5}


@pytest.mark.parametrize(("section", "name", "value", "param"), [
    *[(API, f.json, WRONG.get(f.type, 7), f.path) for f in API.fields],
    *[(LOAD_BALANCING, f.json, WRONG.get(f.type, "soon"), f.path)
      for f in LOAD_BALANCING.fields],
    *[(DISCOVERY, f.json, "yes", f.path) for f in DISCOVERY.fields],
    (TIMEOUTS, "connection", "soon", "timeouts.connection"),
    (TIMEOUTS, "model_load", True, "timeouts.model_load"),
    (TIMEOUTS, "request", "30s", "timeouts.request"),
    (TIMEOUTS, "request", None, "timeouts.request"),
    (TIMEOUTS, "health_check", {"interval": "soon"}, "timeouts.health_check.interval"),
    (TIMEOUTS, "health_check", {"timeout": 0}, "timeouts.health_check.timeout"),
    (TIMEOUTS, "health_check", 5, "timeouts.health_check"),
    (ALIASES, "aliases", ["gpt-4o"], "aliases"),
    (ALIASES, "aliases", {"gpt-4o": 5}, "aliases.gpt-4o"),
])
def test_a_wrong_type_names_the_field(section: Section, name: str, value: object,
                                      param: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_write(section, {name: value}, default_config())
    assert caught.value.param == param
    assert caught.value.message.startswith(f"{param}: ")


@pytest.mark.parametrize(("name", "value", "words"), [
    ("enabled", "no", "expected true or false"), ("weight", "3", "expected a whole number"),
    ("weight", None, "expected a whole number"), ("name", 5, "expected a string")])
def test_a_node_field_names_its_json_field(name: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        structure_field(NODES, name, value)
    assert caught.value.param == name
    assert caught.value.message.startswith(f"{name}: {words}")
    # The store's limits, named by the config path, come back named by the JSON field.
    limit = ConfigError("nodes[3].weight", "must be between 1 and 100, got 0")
    assert NODES.renamed(limit).message == "weight: must be between 1 and 100, got 0"
    assert NODES.renamed(ConfigError("order", "x")).param == "order"


def test_a_write_keeps_the_rules_of_the_file() -> None:
    cfg = apply_write(API, {"socketDir": "", "restartRequired": True}, changed_everywhere())
    assert cfg.local.socket_dir is None  # "" is null
    # health_check is generated from health_checks; the tree is merged, not replaced.
    cfg = apply_write(TIMEOUTS, {"health_check": {"interval": "2s"},
                                 "request": {"streaming": {"total": "15m"}}}, default_config())
    assert (cfg.health_checks.interval, cfg.health_checks.timeout) == (2.0, 4.0)
    assert (cfg.timeouts.health_check.interval, cfg.timeouts.health_check.timeout) == (2.0, 1.0)
    assert cfg.timeouts.request.streaming.total == 900.0
    assert cfg.timeouts.request.streaming.first_byte == 120.0
    # A table is replaced whole, in the order given; null empties it.
    table = apply_write(ALIASES, {"aliases": {"b": "x", "a": "y"}}, changed_everywhere())
    assert list(table.aliases) == [("b", "x"), ("a", "y")]
    assert not apply_write(ALIASES, {"aliases": None}, changed_everywhere()).aliases
    # A limit (§3.1) is the file's, named by the dotted path.
    with pytest.raises(ConfigError) as caught:
        apply_write(LOAD_BALANCING, {"healthCheckInterval": 0}, default_config())
    assert caught.value.param == "health_checks.interval"


def test_node_status_words_are_the_pools() -> None:
    assert proxy.registry.nodes.UNKNOWN == UNCHECKED == "unknown"
    assert PAUSED == "paused"
