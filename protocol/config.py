"""The config.yaml schema, its parsing and validation (pure: text in, values out).

Attribute names are exactly the YAML keys. Durations are ``float`` seconds and sizes ``int``
bytes in memory; on disk they are written as ``"30s"`` / ``"32MiB"``. Every problem is raised
as :class:`ConfigError` naming the dotted YAML path (``timeouts.request.streaming.total``,
``nodes[1].priority``) and, for limits, the limit itself.
"""

import enum
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, get_args, get_origin

import attrs
import cattrs
import yaml
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from protocol.durations import format_duration, format_size, parse_duration, parse_size
from protocol.errors import ConfigError
from protocol.upstream_url import parse_upstream_url
from protocol.yaml_loader import load_yaml

__all__ = [
    "BACKEND_KINDS", "STRATEGIES", "ApiConfig", "BackendConfig", "CircuitBreakerConfig",
    "Config", "HealthCheckTimeouts", "HealthChecksConfig", "LoadBalancingConfig",
    "LocalConfig", "ModelConfig", "NodeConfig", "PhaseTimeouts", "RequestTimeouts",
    "StreamingTimeouts", "TimeoutsConfig", "config_to_dict", "default_config",
    "dump_config_yaml", "parse_config_text", "rebuild_health_check", "validate_config",
]


class _Unit(enum.Enum):
    DURATION = "duration"
    SIZE = "size"


Duration = Annotated[float, _Unit.DURATION]  # seconds; "30s" in YAML
Size = Annotated[int, _Unit.SIZE]  # bytes; "32MiB" in YAML

STRATEGIES: Final = ("priority", "round-robin", "least-loaded", "fastest")
BACKEND_KINDS: Final = ("llm", "diffusion", "embedding")
SOCKET_DIR_MAX_BYTES: Final = 62

# ---------------------------------------------------------------------------------- schema


@attrs.frozen
class ApiConfig:
    enabled: bool = True
    port: int = 39080
    allow_external_access: bool = False
    require_auth: bool = False
    max_body_size: Size = 32 << 20
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 1024


@attrs.frozen
class LocalConfig:
    socket_dir: str | None = None
    fallback_port: int = 0


@attrs.frozen
class BackendConfig:
    name: str
    url: str
    kind: str = "llm"


@attrs.frozen
class ModelConfig:
    name: str
    path: str
    context: int = 2048
    parallel: int = 2
    threads: int = 0


@attrs.frozen
class LoadBalancingConfig:
    enabled: bool = False
    strategy: str = "priority"
    failover_enabled: bool = True


@attrs.frozen
class NodeConfig:
    fingerprint: str
    name: str
    base_url: str
    priority: int
    enabled: bool = True


@attrs.frozen
class HealthChecksConfig:
    interval: Duration = 5.0
    timeout: Duration = 4.0


@attrs.frozen
class CircuitBreakerConfig:
    failure_threshold: int = 3
    reset_timeout: Duration = 60.0


@attrs.frozen
class PhaseTimeouts:
    first_byte: Duration
    total: Duration


@attrs.frozen
class StreamingTimeouts:
    first_byte: Duration = 120.0
    chunk_interval: Duration = 30.0
    total: Duration = 600.0


@attrs.frozen
class RequestTimeouts:
    standard: PhaseTimeouts = PhaseTimeouts(first_byte=30.0, total=300.0)
    streaming: StreamingTimeouts = attrs.field(factory=StreamingTimeouts)
    image_generation: PhaseTimeouts = PhaseTimeouts(first_byte=60.0, total=180.0)


@attrs.frozen
class HealthCheckTimeouts:
    timeout: Duration = 4.0
    interval: Duration = 5.0


@attrs.frozen
class TimeoutsConfig:
    connection: Duration = 10.0
    request: RequestTimeouts = attrs.field(factory=RequestTimeouts)
    health_check: HealthCheckTimeouts = attrs.field(factory=HealthCheckTimeouts)


@attrs.frozen
class Config:
    api: ApiConfig = attrs.field(factory=ApiConfig)
    local: LocalConfig = attrs.field(factory=LocalConfig)
    backends: tuple[BackendConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()
    load_balancing: LoadBalancingConfig = attrs.field(factory=LoadBalancingConfig)
    nodes: tuple[NodeConfig, ...] = ()
    health_checks: HealthChecksConfig = attrs.field(factory=HealthChecksConfig)
    circuit_breaker: CircuitBreakerConfig = attrs.field(factory=CircuitBreakerConfig)
    timeouts: TimeoutsConfig = attrs.field(factory=TimeoutsConfig)


def default_config() -> Config:
    """The configuration written on first start (SPEC §3)."""
    return Config()


def rebuild_health_check(cfg: Config) -> Config:
    """Derive ``timeouts.health_check`` from ``health_checks`` (SPEC §3.2).

    The per-check timeout must be below the interval; if it is not, it becomes
    interval - 1s (or interval / 2 when that would not be positive).
    """
    interval = cfg.health_checks.interval
    timeout = cfg.health_checks.timeout
    if timeout >= interval:
        timeout = interval - 1.0 if interval - 1.0 > 0 else interval / 2
    derived = HealthCheckTimeouts(timeout=timeout, interval=interval)
    if derived == cfg.timeouts.health_check:
        return cfg
    return attrs.evolve(cfg, timeouts=attrs.evolve(cfg.timeouts, health_check=derived))


# ------------------------------------------------------------------------------- converter


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _strict(tp: type, expected: str) -> Callable[[object, Any], Any]:
    """A hook that takes a YAML scalar of exactly ``tp`` (no ``"yes"`` -> True, no 1 -> True)."""
    def structure(value: object, _: Any) -> Any:
        if type(value) is not tp:
            raise ConfigError("", f"expected {expected}, got {_kind(value)}")
        return value

    return structure


def _is_homogeneous_tuple(tp: Any) -> bool:
    args = get_args(tp)
    return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def _structure_tuple(value: object, tp: Any) -> tuple[Any, ...]:
    """A YAML list (``null`` = empty) into a tuple; errors keep the element's index."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ConfigError("", f"expected a list, got {_kind(value)}")
    item_type = get_args(tp)[0]
    items = []
    for index, item in enumerate(value):
        try:
            items.append(_CONVERTER.structure(item, item_type))
        except Exception as exc:
            exc.add_note(IterableValidationNote(f"@ index {index}", index, item_type))
            raise IterableValidationError(f"While structuring {tp!r}", [exc], tp) from None
    return tuple(items)


def _attrs_hook_factory(cl: type[Any]) -> Callable[[object, Any], Any]:
    inner = make_dict_structure_fn(cl, _CONVERTER)
    # Sub-sections whose defaults differ per field (request.standard vs image_generation):
    # a partial mapping is completed from that field's own default.
    instance_defaults = {a.name: attrs.asdict(a.default, recurse=False)
                         for a in attrs.fields(cl) if attrs.has(type(a.default))}

    def structure(value: object, _: Any) -> Any:
        if value is None:  # an empty section (`api:`) means "all defaults"
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError("", f"expected a mapping of keys, got {_kind(value)}")
        for name, default in instance_defaults.items():
            given = value.get(name)
            if isinstance(given, Mapping):
                value = {**value, name: {**default, **given}}
        return inner(value, cl)

    return structure


_CONVERTER: Final = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
_CONVERTER.register_structure_hook(bool, _strict(bool, "true or false"))
_CONVERTER.register_structure_hook(int, _strict(int, "a whole number"))
_CONVERTER.register_structure_hook(str, _strict(str, "a string"))
_CONVERTER.register_structure_hook_func(lambda t: t == Duration, lambda v, _: parse_duration(v, ""))
_CONVERTER.register_structure_hook_func(lambda t: t == Size, lambda v, _: parse_size(v, ""))
_CONVERTER.register_structure_hook_func(_is_homogeneous_tuple, _structure_tuple)
_CONVERTER.register_structure_hook_factory(attrs.has, _attrs_hook_factory)
_CONVERTER.register_unstructure_hook_func(lambda t: t == Duration, format_duration)
_CONVERTER.register_unstructure_hook_func(lambda t: t == Size, format_size)


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _first_error(exc: BaseException, path: str, raw: object) -> ConfigError:
    """The first problem in a cattrs error tree, as a ConfigError with its dotted path."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        subs = list(exc.exceptions)
        # An unknown key is the likeliest root cause (a typo): report it first.
        subs.sort(key=lambda e: not isinstance(e, ForbiddenExtraKeysError))
        for sub in subs:
            for note in getattr(sub, "__notes__", ()):
                if isinstance(note, AttributeValidationNote):
                    child = raw.get(note.name) if isinstance(raw, Mapping) else None
                    return _first_error(sub, _join(path, note.name), child)
                if isinstance(note, IterableValidationNote) and isinstance(note.index, int):
                    items = raw if isinstance(raw, list | tuple) else ()
                    child = items[note.index] if note.index < len(items) else None
                    return _first_error(sub, _join(path, note.index), child)
        if subs:
            return _first_error(subs[0], path, raw)
    if isinstance(exc, ForbiddenExtraKeysError):
        order = list(raw) if isinstance(raw, Mapping) else []
        unknown = sorted(exc.extra_fields, key=lambda k: order.index(k) if k in order else 0)
        key = unknown[0]
        return ConfigError(f"{path}.{key}" if path else str(key), f"unknown key {key!r}")
    if isinstance(exc, ConfigError):
        return ConfigError(path, exc.message)
    if isinstance(exc, KeyError):
        return ConfigError(path, "is required")
    return ConfigError(path, f"invalid value ({type(exc).__name__}: {exc})")


def parse_config_text(text: str) -> Config:
    """Parse, complete (missing keys take their defaults), derive and validate a config.

    An empty file gives :func:`default_config`. ``timeouts.health_check`` is always rebuilt
    from ``health_checks``. Raises :class:`ConfigError` for the first problem found.
    """
    data = load_yaml(text)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"the top level of the config must be a mapping, not {_kind(data)}")
    try:
        cfg = _CONVERTER.structure(data, Config)
    except ConfigError:
        raise
    except Exception as exc:
        raise _first_error(exc, "", data) from None
    cfg = rebuild_health_check(cfg)
    validate_config(cfg)
    return cfg


# ------------------------------------------------------------------------------ validation


def _check_range(path: str, value: int, low: int, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        limit = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(path, f"must be {limit}, got {value}")


def _check_duration(path: str, value: float, high: str | None = None, low: str | None = None
                    ) -> None:
    """Positive, and within ``low``..``high`` (limits written as in SPEC, e.g. ``"9m"``)."""
    got = format_duration(value)
    if (low is not None and high is not None
            and not parse_duration(low, path) <= value <= parse_duration(high, path)):
        raise ConfigError(path, f"must be between {low} and {high}, got {got}")
    if value <= 0:
        raise ConfigError(path, f"must be greater than 0s, got {got}")
    if high is not None and value > parse_duration(high, path):
        raise ConfigError(path, f"{got} is over the limit of {high}")


def _check_name(path: str, value: str, seen: set[str], what: str) -> None:
    if not value.strip():
        raise ConfigError(path, f"{what} must not be empty")
    if value in seen:
        raise ConfigError(path, f"{what} {value!r} is used twice")
    seen.add(value)


def _check_url(path: str, url: str, *, unix: bool) -> None:
    """One rule for upstream URLs: the parser the gateway connects with."""
    if not unix and url.startswith("unix:"):
        raise ConfigError(path, f"expected http://host[:port][/base], got {url!r}")
    try:
        parse_upstream_url(url)
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from None


def _check_api(api: ApiConfig) -> None:
    _check_range("api.port", api.port, 0, 65535)  # 0: any free port
    _check_range("api.max_body_size", api.max_body_size, 1)
    for field, values in (("allowed_hosts", api.allowed_hosts),
                          ("allowed_origins", api.allowed_origins)):
        for i, item in enumerate(values):
            if not item.strip() or any(c.isspace() for c in item):
                raise ConfigError(f"api.{field}[{i}]", f"invalid entry {item!r}")
    _check_range("api.max_connections", api.max_connections, 1)


def _check_local(local: LocalConfig) -> None:
    if local.socket_dir is not None:
        size = len(local.socket_dir.encode("utf-8"))
        if not local.socket_dir.strip() or not local.socket_dir.isprintable():
            raise ConfigError("local.socket_dir", "must be a folder path or null")
        if size > SOCKET_DIR_MAX_BYTES:
            raise ConfigError("local.socket_dir", f"is {size} bytes long; the limit is "
                              f"{SOCKET_DIR_MAX_BYTES} bytes (UTF-8)")
    _check_range("local.fallback_port", local.fallback_port, 0, 65535)


def _check_lists(cfg: Config) -> None:
    names: set[str] = set()
    for i, backend in enumerate(cfg.backends):
        _check_name(f"backends[{i}].name", backend.name, names, "backend name")
        _check_url(f"backends[{i}].url", backend.url, unix=True)
        if backend.kind not in BACKEND_KINDS:
            raise ConfigError(f"backends[{i}].kind", f"unknown kind {backend.kind!r}; expected "
                              f"one of {', '.join(BACKEND_KINDS)}")
    names = set()
    for i, model in enumerate(cfg.models):
        _check_name(f"models[{i}].name", model.name, names, "model name")
        if not model.path.strip():
            raise ConfigError(f"models[{i}].path", "must not be empty")
        _check_range(f"models[{i}].context", model.context, 1)
        _check_range(f"models[{i}].parallel", model.parallel, 1)
        _check_range(f"models[{i}].threads", model.threads, 0)
    if cfg.load_balancing.strategy not in STRATEGIES:
        raise ConfigError("load_balancing.strategy",
                          f"unknown strategy {cfg.load_balancing.strategy!r}; "
                          f"expected one of {', '.join(STRATEGIES)}")
    fingerprints: set[str] = set()
    priorities: dict[int, int] = {}
    for i, node in enumerate(cfg.nodes):
        _check_name(f"nodes[{i}].fingerprint", node.fingerprint, fingerprints, "fingerprint")
        _check_url(f"nodes[{i}].base_url", node.base_url, unix=False)
        _check_range(f"nodes[{i}].priority", node.priority, 1, 255)
        if node.priority in priorities:
            raise ConfigError(f"nodes[{i}].priority", f"priority {node.priority} is already used "
                              f"by nodes[{priorities[node.priority]}]; priorities (1..255) "
                              "must be unique")
        priorities[node.priority] = i


def _check_timeouts(cfg: Config) -> None:
    hc = cfg.health_checks
    _check_duration("health_checks.interval", hc.interval)
    _check_duration("health_checks.timeout", hc.timeout)
    _check_range("circuit_breaker.failure_threshold", cfg.circuit_breaker.failure_threshold, 1)
    _check_duration("circuit_breaker.reset_timeout", cfg.circuit_breaker.reset_timeout)
    t = cfg.timeouts
    _check_duration("timeouts.connection", t.connection, high="15s")
    req = "timeouts.request"
    _check_duration(f"{req}.standard.first_byte", t.request.standard.first_byte)
    _check_duration(f"{req}.standard.total", t.request.standard.total, high="9m")
    _check_duration(f"{req}.streaming.first_byte", t.request.streaming.first_byte, high="8m")
    _check_duration(f"{req}.streaming.chunk_interval", t.request.streaming.chunk_interval,
                    low="1s", high="60s")
    _check_duration(f"{req}.streaming.total", t.request.streaming.total, high="20m")
    _check_duration(f"{req}.image_generation.first_byte", t.request.image_generation.first_byte)
    _check_duration(f"{req}.image_generation.total", t.request.image_generation.total)
    _check_duration("timeouts.health_check.timeout", t.health_check.timeout)
    _check_duration("timeouts.health_check.interval", t.health_check.interval)


def validate_config(cfg: Config) -> None:
    """Raise :class:`ConfigError` (dotted path + limit) for the first invalid value."""
    _check_api(cfg.api)
    _check_local(cfg.local)
    _check_lists(cfg)
    _check_timeouts(cfg)


# --------------------------------------------------------------------------------- writing


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain YAML-ready data in SPEC order; durations like ``"30s"``, sizes like ``"32MiB"``."""
    data: dict[str, Any] = _CONVERTER.unstructure(cfg)
    return data


_HEADER = """\
# sluice configuration. Hand edits are fine; the gateway rewrites this file (atomically)
# whenever a setting changes. Unknown keys are refused. Durations: 500ms, 30s, 5m, 1h or a
# number of seconds. Sizes: bytes, KiB, MiB, GiB. Secrets live in secrets.yaml, not here.
"""

_SECTION_NOTES: Final = {
    "backends": "local model servers (llama.cpp, vLLM, Ollama, LM Studio...), e.g.\n"
                "#   - name: llama\n"
                "#     url: http://127.0.0.1:8080   # or unix:/path/to/model.sock\n"
                "#     kind: llm                    # llm | diffusion | embedding",
    "models": "managed llama.cpp servers, e.g.\n"
              "#   - name: smollm2-135m             # the model id clients ask for\n"
              "#     path: models/model.gguf        # relative to the data dir\n"
              "#     context: 2048\n"
              "#     parallel: 2                    # concurrent slots\n"
              "#     threads: 0                     # 0 = all cores",
    "nodes": "network nodes, e.g.\n"
             "#   - fingerprint: node-abc\n"
             "#     name: studio-mac\n"
             "#     base_url: http://192.168.1.50:39080\n"
             "#     priority: 5                    # 1..255, unique; largest = first\n"
             "#     enabled: true                  # included in routing",
}

_KEY_NOTES: Final = {
    ("api", "enabled"): "TCP API server; false = Unix socket only",
    ("api", "allow_external_access"): "true binds 0.0.0.0 (and ::); remote clients need a key",
    ("api", "require_auth"): "true: loopback TCP clients need an access key too",
    ("api", "allowed_hosts"): "extra Host names accepted on TCP (DNS-rebinding guard)",
    ("api", "allowed_origins"): "extra browser origins allowed (CORS)",
    ("api", "max_connections"): "client connections held at once",
    ("local", "socket_dir"): "custom socket folder, at most 62 bytes, applied at restart",
    ("local", "fallback_port"): "loopback TCP port used only when no socket folder works",
    ("load_balancing", "strategy"): "priority | round-robin | least-loaded | fastest",
    ("timeouts", "health_check"): "generated from health_checks on every write",
}


def _annotate(section: str, lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        key = line[2:].split(":", 1)[0] if line.startswith("  ") and line[2:3] != " " else ""
        note = _KEY_NOTES.get((section, key))
        out.append(f"{line}   # {note}" if note else line)
    return out


def dump_config_yaml(cfg: Config) -> str:
    """A complete, commented config.yaml that parses back to an equal :class:`Config`."""
    parts = [_HEADER]
    for section, value in config_to_dict(cfg).items():
        note = _SECTION_NOTES.get(section)
        if note:
            parts.append(f"# {note}\n")
        text = yaml.safe_dump({section: value}, sort_keys=False, default_flow_style=False,
                              allow_unicode=True, width=1 << 16)
        parts.append("\n".join(_annotate(section, text.splitlines())) + "\n")
    return "".join(parts)
