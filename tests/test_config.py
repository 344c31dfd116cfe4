import math
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.aliases import AliasTable
from protocol.config import (
    ApiConfig,
    BackendConfig,
    Config,
    HealthChecksConfig,
    HealthCheckTimeouts,
    LocalConfig,
    ModelConfig,
    NodeConfig,
    by_priority,
    config_to_dict,
    default_config,
    dump_config_yaml,
    parse_config_text,
    rebuild_health_check,
    validate_config,
)
from protocol.errors import ConfigError
from protocol.names import is_fingerprint, is_label

SPEC_ORDER = ["api", "local", "backends", "models", "load_balancing", "nodes", "aliases",
              "ollama_api", "discovery", "model_loading", "scheduling",
              "observability", "health_checks",
              "circuit_breaker", "timeouts"]


def nested(path: str, value: object) -> dict[str, Any]:
    """``nested("a.b.c", 1) == {"a": {"b": {"c": 1}}}``."""
    data: Any = value
    for key in reversed(path.split(".")):
        data = {key: data}
    return dict(data)


def yaml_for(path: str, value: object) -> str:
    return yaml.safe_dump(nested(path, value))


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config_text(text)
    return info.value


def node(i: int, priority: int) -> dict[str, Any]:
    return {"fingerprint": f"node-{i}", "name": f"n{i}", "base_url": f"http://10.0.0.{i}:39080",
            "priority": priority}


# ------------------------------------------------------------------------------- defaults


def test_defaults_match_spec() -> None:
    cfg = default_config()
    assert cfg.api == ApiConfig(enabled=True, port=39080, allow_external_access=False,
                                require_auth=False, max_body_size=32 * 1024 * 1024,
                                allowed_hosts=(), allowed_origins=(), max_connections=1024)
    assert cfg.local == LocalConfig(socket_dir=None, fallback_port=0)
    assert (cfg.backends, cfg.models, cfg.nodes) == ((), (), ())
    assert (cfg.load_balancing.enabled, cfg.load_balancing.strategy,
            cfg.load_balancing.failover_enabled) == (False, "cache-aware", True)
    # SPEC §15: cache-aware is the default of new files; spill-over off; the index's keys
    lb = cfg.load_balancing
    assert (lb.spill_over, lb.affinity.block_chars, lb.affinity.max_blocks,
            lb.affinity.load_bound) == (False, 512, 200_000, 1)
    assert cfg.health_checks == HealthChecksConfig(interval=5.0, timeout=4.0)
    assert (cfg.circuit_breaker.failure_threshold, cfg.circuit_breaker.reset_timeout) == (3, 60)
    t = cfg.timeouts
    assert t.connection == 10.0
    assert (t.request.standard.first_byte, t.request.standard.total) == (30.0, 300.0)
    assert (t.request.streaming.first_byte, t.request.streaming.chunk_interval,
            t.request.streaming.total) == (120.0, 30.0, 600.0)
    assert (t.request.image_generation.first_byte, t.request.image_generation.total) == (60, 180)
    assert t.health_check == HealthCheckTimeouts(timeout=4.0, interval=5.0)
    validate_config(cfg)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(text: str) -> None:
    assert parse_config_text(text) == default_config()


def test_partial_file_keeps_other_defaults() -> None:
    cfg = parse_config_text("api:\n  port: 8000\ntimeouts:\n  request:\n    streaming:\n"
                            "      total: 15m\nhealth_checks:\n")
    assert cfg.api.port == 8000
    assert cfg.api.max_body_size == 32 << 20
    assert cfg.timeouts.request.streaming.total == 900.0
    assert cfg.timeouts.request.streaming.first_byte == 120.0
    assert cfg == attrs.evolve(
        default_config(),
        api=attrs.evolve(default_config().api, port=8000),
        timeouts=cfg.timeouts,
    )


def test_partial_phase_blocks_keep_their_own_defaults() -> None:
    cfg = parse_config_text("timeouts:\n  request:\n    standard: {total: 2m}\n"
                            "    image_generation: {first_byte: 10s}\n")
    assert (cfg.timeouts.request.standard.first_byte, cfg.timeouts.request.standard.total) \
        == (30.0, 120.0)
    assert (cfg.timeouts.request.image_generation.first_byte,
            cfg.timeouts.request.image_generation.total) == (10.0, 180.0)


def test_values_are_parsed() -> None:
    cfg = parse_config_text(
        "api: {max_body_size: 512KiB, allowed_hosts: [my-box.local]}\n"
        "local: {socket_dir: /run/s}\n"
        "backends: [{name: llama, url: 'unix:/tmp/llama.sock'}]\n"
        "models: [{name: m, path: models/m.gguf}]\n"
        "nodes: [{fingerprint: node-a, name: a, base_url: 'http://10.0.0.2:39080', priority: 7}]\n"
        "timeouts: {connection: 2500ms}\n"
    )
    assert cfg.api.max_body_size == 512 * 1024
    assert cfg.api.allowed_hosts == ("my-box.local",)
    assert cfg.local.socket_dir == "/run/s"
    assert cfg.backends == (BackendConfig(name="llama", url="unix:/tmp/llama.sock", kind="llm"),)
    assert cfg.models == (ModelConfig(name="m", path="models/m.gguf", context=2048, parallel=2,
                                      threads=0),)
    assert cfg.nodes == (NodeConfig(fingerprint="node-a", name="a",
                                    base_url="http://10.0.0.2:39080", priority=7, enabled=True),)
    assert cfg.timeouts.connection == 2.5


# ------------------------------------------------------------------------- SPEC 3.1 limits

LIMITS = [
    # path, accepted values, refused values, the limit as it appears in the message
    ("timeouts.request.standard.total", ["9m", "540s", 540, "539999ms"],
     ["541s", "540001ms", "10m"], "9m"),
    ("timeouts.request.streaming.total", ["20m", "1200s"], ["1201s", "1200001ms", "1h"], "20m"),
    ("timeouts.request.streaming.first_byte", ["8m", "480s"], ["481s", "480001ms"], "8m"),
    ("timeouts.request.streaming.chunk_interval", ["1s", "1000ms", "60s", "1m"],
     ["999ms", "61s", "60001ms", "500ms"], "1s"),
    ("timeouts.connection", ["15s", "15000ms"], ["16s", "15001ms"], "15s"),
]


@pytest.mark.parametrize(("path", "ok", "bad", "limit"), LIMITS)
def test_duration_limits(path: str, ok: list[object], bad: list[object], limit: str) -> None:
    for value in ok:
        parse_config_text(yaml_for(path, value))
    for value in bad:
        err = refused(yaml_for(path, value))
        assert err.path == path
        assert err.param == path
        assert str(err).startswith(f"{path}: ")
        assert limit in str(err)


def test_chunk_interval_message_names_both_bounds() -> None:
    err = refused(yaml_for("timeouts.request.streaming.chunk_interval", "61s"))
    assert "60s" in str(err)


DURATION_PATHS = [
    "health_checks.interval",
    "health_checks.timeout",
    "circuit_breaker.reset_timeout",
    "timeouts.connection",
    "timeouts.request.standard.first_byte",
    "timeouts.request.standard.total",
    "timeouts.request.streaming.first_byte",
    "timeouts.request.streaming.chunk_interval",
    "timeouts.request.streaming.total",
    "timeouts.request.image_generation.first_byte",
    "timeouts.request.image_generation.total",
]


@pytest.mark.parametrize("path", DURATION_PATHS)
@pytest.mark.parametrize("value", [0, "0s", "0ms", -1, "-5s", "-1ms"])
def test_zero_and_negative_durations_refused(path: str, value: object) -> None:
    err = refused(yaml_for(path, value))
    assert err.path == path


@pytest.mark.parametrize("field", ["timeout", "interval"])
def test_derived_health_check_block_is_validated_too(field: str) -> None:
    cfg = default_config()
    bad = attrs.evolve(cfg.timeouts.health_check, **{field: 0.0})
    with pytest.raises(ConfigError) as info:
        validate_config(attrs.evolve(cfg, timeouts=attrs.evolve(cfg.timeouts, health_check=bad)))
    assert info.value.path == f"timeouts.health_check.{field}"


def test_unknown_strategy_refused() -> None:
    for name in ("priority", "round-robin", "least-loaded", "fastest", "weighted",
                 "cache-aware"):
        assert parse_config_text(yaml_for("load_balancing.strategy", name))
    err = refused(yaml_for("load_balancing.strategy", "random"))
    assert err.path == "load_balancing.strategy"
    assert "round-robin" in str(err)


AFFINITY_LIMITS = [
    ("load_balancing.affinity.block_chars", [64, 512, 65536], [63, 65537, 0, -1], "64 and 65536"),
    ("load_balancing.affinity.max_blocks", [0, 1, 10_000_000], [-1, 10_000_001],
     "0 and 10000000"),
    ("load_balancing.affinity.load_bound", [0, 1, 50], [-1], "at least 0"),
]


@pytest.mark.parametrize(("path", "ok", "bad", "limit"), AFFINITY_LIMITS)
def test_affinity_limits(path: str, ok: list[int], bad: list[int], limit: str) -> None:
    """SPEC §3.1: the cache-aware index's keys, refused with their dotted path and limit."""
    for value in ok:
        cfg = parse_config_text(yaml_for(path, value))
        assert getattr(cfg.load_balancing.affinity, path.rsplit(".", 1)[1]) == value
    for value in bad:
        err = refused(yaml_for(path, value))
        assert (err.path, err.param) == (path, path)
        assert limit in str(err)


def test_cache_aware_and_spill_over_read() -> None:
    text = yaml.safe_dump({"load_balancing": {"strategy": "cache-aware", "spill_over": True}})
    lb = parse_config_text(text).load_balancing
    assert (lb.strategy, lb.spill_over) == ("cache-aware", True)
    # an existing file keeps the strategy it names
    assert parse_config_text(yaml_for("load_balancing.strategy", "priority")) \
        .load_balancing.strategy == "priority"


@pytest.mark.parametrize("priority", [1, 255])
def test_priority_bounds_accepted(priority: int) -> None:
    assert parse_config_text(yaml.safe_dump({"nodes": [node(1, priority)]})).nodes[0].priority \
        == priority


@pytest.mark.parametrize("priority", [0, 256, -1])
def test_priority_out_of_range_refused(priority: int) -> None:
    err = refused(yaml.safe_dump({"nodes": [node(1, 3), node(2, priority)]}))
    assert err.path == "nodes[1].priority"
    assert "1 and 255" in str(err)


def test_repeated_priority_refused() -> None:
    err = refused(yaml.safe_dump({"nodes": [node(1, 5), node(2, 4), node(3, 5)]}))
    assert err.path == "nodes[2].priority"
    assert "nodes[0]" in str(err)


def test_socket_dir_limit_in_utf8_bytes() -> None:
    parse_config_text(yaml_for("local.socket_dir", "/" + "a" * 61))
    parse_config_text(yaml_for("local.socket_dir", "/" + "é" * 30 + "a"))  # 62 bytes
    for value in ["/" + "a" * 62, "/" + "é" * 31]:  # 63 bytes
        err = refused(yaml_for("local.socket_dir", value))
        assert err.path == "local.socket_dir"
        assert "62 bytes" in str(err)


# ------------------------------------------------------------------ other validation rules

SENSIBLE = [
    ("api.port", [0, 1, 65535], [-1, 65536]),
    ("api.max_connections", [1], [0, -1]),
    ("api.max_body_size", [1, "1KiB"], [0, "0MiB"]),
    ("local.fallback_port", [0, 65535], [-1, 65536]),
    ("circuit_breaker.failure_threshold", [1], [0]),
]


@pytest.mark.parametrize(("path", "ok", "bad"), SENSIBLE)
def test_sensible_ranges(path: str, ok: list[object], bad: list[object]) -> None:
    for value in ok:
        parse_config_text(yaml_for(path, value))
    for value in bad:
        assert refused(yaml_for(path, value)).path == path


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost", "http://h:1/v1",
                                 "http://[::1]:8080", "unix:/tmp/llama.sock"])
def test_backend_url_accepted(url: str) -> None:
    cfg = parse_config_text(yaml.safe_dump({"backends": [{"name": "b", "url": url}]}))
    assert cfg.backends[0].url == url


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://h", "https://h", "http://", "unix:",
                                 "unix:relative.sock", "unix://tmp/x.sock", "http://h:0",
                                 "http://h:99999", "http://u:p@h", "http://h/?q=1", ""])
def test_backend_url_refused(url: str) -> None:
    err = refused(yaml.safe_dump({"backends": [{"name": "a", "url": "http://h"},
                                               {"name": "b", "url": url}]}))
    assert err.path == "backends[1].url"


def test_backend_kind_and_names() -> None:
    for kind in ("llm", "diffusion", "embedding"):
        parse_config_text(yaml.safe_dump({"backends": [{"name": "b", "url": "http://h",
                                                        "kind": kind}]}))
    err = refused(yaml.safe_dump({"backends": [{"name": "b", "url": "http://h", "kind": "tts"}]}))
    assert err.path == "backends[0].kind"
    err = refused(yaml.safe_dump({"backends": [{"name": "b", "url": "http://h"},
                                               {"name": "b", "url": "http://g"}]}))
    assert err.path == "backends[1].name"
    err = refused(yaml.safe_dump({"backends": [{"name": " ", "url": "http://h"}]}))
    assert err.path == "backends[0].name"


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        ({"name": "", "path": "m.gguf"}, "models[0].name"),
        ({"name": "m", "path": ""}, "models[0].path"),
        ({"name": "m", "path": "m.gguf", "context": 0}, "models[0].context"),
        ({"name": "m", "path": "m.gguf", "parallel": 0}, "models[0].parallel"),
        ({"name": "m", "path": "m.gguf", "threads": -1}, "models[0].threads"),
        ({"name": "m"}, "models[0].path"),
    ],
)
def test_model_rules(entry: dict[str, Any], path: str) -> None:
    assert refused(yaml.safe_dump({"models": [entry]})).path == path


def test_model_names_unique() -> None:
    entries = [{"name": "m", "path": "a.gguf"}, {"name": "m", "path": "b.gguf"}]
    assert refused(yaml.safe_dump({"models": entries})).path == "models[1].name"


def test_node_fingerprints_unique_and_urls_checked() -> None:
    a, b = node(1, 2), node(2, 1)
    b["fingerprint"] = a["fingerprint"]
    assert refused(yaml.safe_dump({"nodes": [a, b]})).path == "nodes[1].fingerprint"
    c = node(3, 1) | {"base_url": "10.0.0.3"}
    assert refused(yaml.safe_dump({"nodes": [c]})).path == "nodes[0].base_url"


# -------------------------------------------------------------- unknown keys, wrong types


@pytest.mark.parametrize(
    ("text", "path", "key"),
    [
        ("prot: 1\n", "prot", "prot"),
        ("api:\n  prot: 1\n", "api.prot", "prot"),
        ("timeouts:\n  request:\n    streaming:\n      totl: 5m\n",
         "timeouts.request.streaming.totl", "totl"),
        ("backends:\n  - name: a\n    url: http://h\n    nmae: b\n", "backends[0].nmae", "nmae"),
        ("nodes:\n  - {fingerprint: a, name: a, base_url: 'http://h', priority: 1, x: 2}\n",
         "nodes[0].x", "x"),
    ],
)
def test_unknown_keys_refused_by_name(text: str, path: str, key: str) -> None:
    err = refused(text)
    assert err.path == path
    assert str(err) == f"{path}: unknown key {key!r}"


def test_first_unknown_key_in_file_order() -> None:
    assert refused("api:\n  zzz: 1\n  aaa: 2\n").path == "api.zzz"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("api: {port: abc}", "api.port"),
        ("api: {port: 1.5}", "api.port"),
        ("api: {port: true}", "api.port"),
        ("api: {enabled: 'yes'}", "api.enabled"),
        ("api: {enabled: 1}", "api.enabled"),
        ("api: {allowed_hosts: localhost}", "api.allowed_hosts"),
        ("api: {allowed_hosts: [a, 5]}", "api.allowed_hosts[1]"),
        ("api: {max_body_size: lots}", "api.max_body_size"),
        ("api: 5", "api"),
        ("api: [1]", "api"),
        ("backends: {name: a}", "backends"),
        ("backends: [5]", "backends[0]"),
        ("backends: [{url: 'http://h'}]", "backends[0].name"),
        ("nodes: [{fingerprint: a, name: a, base_url: 'http://h', priority: high}]",
         "nodes[0].priority"),
        ("local: {socket_dir: 5}", "local.socket_dir"),
        ("timeouts: {connection: soon}", "timeouts.connection"),
        ("timeouts: {connection: true}", "timeouts.connection"),
        ("timeouts: {request: {standard: 5}}", "timeouts.request.standard"),
    ],
)
def test_wrong_types_refused_with_path(text: str, path: str) -> None:
    err = refused(text)
    assert err.path == path
    assert str(err).startswith(f"{path}: ")


@pytest.mark.parametrize("text", ["- a\n- b\n", "5\n", "just text\n"])
def test_top_level_must_be_a_mapping(text: str) -> None:
    assert "mapping" in str(refused(text))


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("api:\n  port: 1\n\tenabled: true\n", 3, 1),
        ("api: {port: 1\n", 2, 1),
        ("api:\n  port: [1, 2\nlocal: {}\n", 3, 6),
    ],
)
def test_malformed_yaml_names_line_and_column(text: str, line: int, column: int) -> None:
    err = refused(text)
    assert err.path == ""
    assert f"line {line}, column {column}" in str(err)


def test_duplicate_key_refused() -> None:
    err = refused("api:\n  port: 1\n  port: 2\n")
    assert "duplicate key 'port'" in str(err)
    assert "line 3" in str(err)


def test_python_tags_refused() -> None:
    assert "malformed YAML" in str(refused("api: !!python/object:os.system {}\n"))


# ------------------------------------------------------------------- health_check rebuild


@pytest.mark.parametrize(
    ("interval", "timeout", "expected"),
    [
        (5.0, 4.0, 4.0),  # below the interval: kept
        (5.0, 5.0, 4.0),  # equal: interval - 1s
        (5.0, 30.0, 4.0),  # larger: interval - 1s
        (10.0, 0.5, 0.5),
        (1.0, 1.0, 0.5),  # interval - 1s would be 0: interval / 2
        (0.5, 2.0, 0.25),
        (1.5, 1.5, 0.5),
    ],
)
def test_rebuild_health_check(interval: float, timeout: float, expected: float) -> None:
    cfg = attrs.evolve(default_config(), health_checks=HealthChecksConfig(interval, timeout))
    rebuilt = rebuild_health_check(cfg)
    assert rebuilt.timeouts.health_check == HealthCheckTimeouts(timeout=expected,
                                                                interval=interval)
    assert rebuilt.health_checks == cfg.health_checks  # what the user set stays


def test_parse_rebuilds_health_check_over_the_file() -> None:
    cfg = parse_config_text("health_checks: {interval: 10s, timeout: 10s}\n"
                            "timeouts: {health_check: {timeout: 1h, interval: 0s}}\n")
    assert cfg.timeouts.health_check == HealthCheckTimeouts(timeout=9.0, interval=10.0)


# ------------------------------------------------------------------------ dump / round trip


def test_config_to_dict_order_and_text() -> None:
    data = config_to_dict(default_config())
    assert list(data) == SPEC_ORDER
    assert list(data["api"]) == ["enabled", "port", "allow_external_access", "require_auth",
                                 "max_body_size", "allowed_hosts", "allowed_origins",
                                 "max_connections", "node_port"]
    assert data["api"]["max_body_size"] == "32MiB"
    assert data["api"]["allowed_hosts"] == []
    assert data["health_checks"] == {"interval": "5s", "timeout": "4s"}
    assert data["timeouts"]["connection"] == "10s"
    assert data["timeouts"]["request"]["streaming"] == {"first_byte": "2m",
                                                        "chunk_interval": "30s", "total": "10m"}
    assert list(data["timeouts"]["health_check"]) == ["timeout", "interval"]


def test_dump_default_is_complete_and_round_trips() -> None:
    text = dump_config_yaml(default_config())
    assert text.startswith("#")
    data = yaml.safe_load(text)
    assert list(data) == SPEC_ORDER
    assert set(data["timeouts"]) == {"connection", "request", "model_load", "health_check"}
    assert set(data["timeouts"]["request"]) == {"standard", "streaming", "image_generation",
                                                "queue"}
    assert parse_config_text(text) == default_config()
    assert all(len(line) <= 100 for line in text.splitlines())


def rich_config() -> Config:
    base = default_config()
    return rebuild_health_check(attrs.evolve(
        base,
        api=attrs.evolve(base.api, port=8080, max_body_size=1000, allowed_hosts=("yes", "null"),
                         allowed_origins=("http://localhost:3000", "#x")),
        local=LocalConfig(socket_dir="/run/user/1000/sluice é", fallback_port=4000),
        backends=(BackendConfig("llama", "http://127.0.0.1:8080", "llm"),
                  BackendConfig("sd", "unix:/tmp/sd: x.sock", "diffusion")),
        models=(ModelConfig("smollm2-135m", "models/a b.gguf", 4096, 1, 3),),
        nodes=(NodeConfig("node-1", "studio: mac", "http://10.0.0.1:39080", 255, False),
               NodeConfig("node-2", "", "http://10.0.0.2:39080/base", 1, True)),
        aliases=AliasTable([("gpt-4o", "smollm2-135m"), ("*", "#x:y"), ("claude-*", "é/ü"),
                            ("yes", "null"), ("&a", "!b")]),
        health_checks=HealthChecksConfig(interval=2.5, timeout=7.0),
        timeouts=attrs.evolve(base.timeouts, connection=0.75),
    ))


def test_rich_config_round_trips() -> None:
    cfg = rich_config()
    validate_config(cfg)
    assert parse_config_text(dump_config_yaml(cfg)) == cfg


@pytest.mark.slow
@settings(max_examples=200)
@given(
    st.floats(min_value=0.001, max_value=540.0),
    st.floats(min_value=1.0, max_value=60.0),
    st.integers(min_value=1, max_value=15_000),
    st.floats(min_value=1e-6, max_value=1e6),
    st.floats(min_value=1e-6, max_value=1e6),
)
def test_durations_round_trip_through_the_file(
    total: float, chunk: float, connection_ms: int, interval: float, timeout: float
) -> None:
    base = default_config()
    request = base.timeouts.request
    cfg = rebuild_health_check(attrs.evolve(
        base,
        health_checks=HealthChecksConfig(interval=interval, timeout=timeout),
        timeouts=attrs.evolve(
            base.timeouts,
            connection=connection_ms / 1000,
            request=attrs.evolve(
                request,
                standard=attrs.evolve(request.standard, total=total),
                streaming=attrs.evolve(request.streaming, chunk_interval=chunk),
            ),
        ),
    ))
    validate_config(cfg)
    assert parse_config_text(dump_config_yaml(cfg)) == cfg


# ------------------------------------------------------------------------- node order, names


def test_by_priority_is_top_first() -> None:
    nodes = [NodeConfig(fingerprint=fp, name=fp, base_url="http://h", priority=p)
             for fp, p in (("b", 2), ("c", 9), ("a", 5))]
    assert [n.fingerprint for n in by_priority(nodes)] == ["c", "a", "b"]
    assert [n.fingerprint for n in by_priority(tuple(nodes))] == ["c", "a", "b"]
    assert by_priority(()) == []


@pytest.mark.parametrize(("value", "ok"), [
    ("node-3f9a1c0b", True), ("a", True), ("A.b_c-9", True), ("x" * 64, True),
    ("x" * 65, False), ("", False), ("-node", False), (".node", False), ("node a", False),
    ("node/a", False), ("nöde", False), (None, False), (5, False),
])
def test_one_fingerprint_rule(value: object, ok: bool) -> None:
    assert is_fingerprint(value) is ok


@pytest.mark.parametrize(("value", "ok"), [
    ("", True), ("studio mac", True), ("스튜디오", True), ("x" * 100, True), ("x" * 101, False),
    ("a\nb", False), ("a\tb", False), (None, False), (5, False),
])
def test_one_label_rule(value: object, ok: bool) -> None:
    assert is_label(value) is ok


# ------------------------------------------------------------------------ models on demand (§11)


def test_model_loading_defaults_and_text() -> None:
    data = config_to_dict(default_config())
    assert data["model_loading"] == {"keep_alive": "5m", "max_loaded": 0,
                                     "memory_budget": "auto", "dirs": ["models"]}
    assert data["timeouts"]["model_load"] == "2m"
    assert list(data["timeouts"]) == ["connection", "request", "model_load", "health_check"]
    assert data["load_balancing"]["prefer_loaded"] is True


@pytest.mark.parametrize(("text", "keep_alive", "budget"), [
    ("model_loading: {keep_alive: forever}", math.inf, 0),
    ("model_loading: {keep_alive: 0s, memory_budget: 12GiB}", 0.0, 12 << 30),
    ("model_loading: {keep_alive: 90, memory_budget: AUTO}", 90.0, 0),
])
def test_model_loading_values_round_trip(text: str, keep_alive: float, budget: int) -> None:
    cfg = parse_config_text(text + "\nmodels: [{name: m, path: m.gguf, keep_alive: forever, "
                            "preload: true}]\n")
    assert (cfg.model_loading.keep_alive, cfg.model_loading.memory_budget) == (keep_alive, budget)
    assert (cfg.models[0].keep_alive, cfg.models[0].preload) == (math.inf, True)
    assert parse_config_text(dump_config_yaml(cfg)) == cfg


@pytest.mark.parametrize(("text", "path", "words"), [
    ("timeouts: {model_load: 11m}", "timeouts.model_load", "between 1s and 10m"),
    ("timeouts: {model_load: 500ms}", "timeouts.model_load", "between 1s and 10m"),
    ("model_loading: {max_loaded: -1}", "model_loading.max_loaded", "at least 0"),
    ("model_loading: {keep_alive: -5s}", "model_loading.keep_alive", "0s or more"),
    ("model_loading: {memory_budget: lots}", "model_loading.memory_budget", "auto or a size"),
    ("model_loading: {memory_budget: 0}", "model_loading.memory_budget", "greater than 0"),
    ("model_loading: {dirs: ['']}", "model_loading.dirs[0]", "invalid folder"),
    ("models: [{name: m, path: m.gguf, keep_alive: -1}]", "models[0].keep_alive", "0s or more"),
    ("models: [{name: m, path: m.gguf, preload: 1}]", "models[0].preload", "true or false"),
])
def test_model_loading_limits(text: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text)
    assert caught.value.path == path
    assert words in caught.value.message


def test_discovery_section() -> None:
    """SPEC §3, §14: both switches off by default; booleans only; unknown keys refused."""
    assert default_config().discovery.announce is False
    assert default_config().discovery.browse is False
    assert "discovery:\n  announce: false" in dump_config_yaml(default_config())
    cfg = parse_config_text("discovery: {announce: true}\n")
    assert (cfg.discovery.announce, cfg.discovery.browse) == (True, False)
    assert parse_config_text("discovery:\n") == default_config()
    for text, path in (('discovery: {browse: "true"}\n', "discovery.browse"),
                       ("discovery: {announce: 1}\n", "discovery.announce"),
                       ("discovery: {listen: true}\n", "discovery.listen"),
                       ("discovery: [true]\n", "discovery")):
        assert refused(text).path == path, text
