"""The limits of a config (SPEC §3.1), checked on a structured :class:`Config`: each problem
is a :class:`ConfigError` naming the dotted YAML path and, for limits, the limit itself."""

from __future__ import annotations

from protocol.aliases import AliasTable, model_id_problem
from protocol.config.model_checks import check_model
from protocol.config.schema import (
    APIS_SETTINGS,
    BACKEND_KINDS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    SOCKET_DIR_MAX_BYTES,
    STRATEGIES,
    ApiConfig,
    Config,
    LocalConfig,
)
from protocol.durations import format_duration, parse_duration
from protocol.errors import ConfigError
from protocol.lan.pinning import is_pin
from protocol.upstream_url import parse_upstream_url

__all__ = ["validate_config"]

MAX_REQUEST_LOG = 100_000  # observability.request_log_size: entries are ~1 KiB each


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
    _check_range("api.node_port", api.node_port, 0, 65535)  # 0: no node listener
    if api.node_port and api.node_port == api.port:
        raise ConfigError("api.node_port", f"must differ from api.port ({api.port})")
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
        if backend.max_concurrent is not None:
            _check_range(f"backends[{i}].max_concurrent", backend.max_concurrent, 1)
        if backend.kind not in BACKEND_KINDS:
            raise ConfigError(f"backends[{i}].kind", f"unknown kind {backend.kind!r}; expected "
                              f"one of {', '.join(BACKEND_KINDS)}")
        if backend.apis not in APIS_SETTINGS:
            raise ConfigError(f"backends[{i}].apis", f"unknown setting {backend.apis!r}; "
                              f"expected one of {', '.join(APIS_SETTINGS)}")
    names = set()
    for i, model in enumerate(cfg.models):
        _check_name(f"models[{i}].name", model.name, names, "model name")
        check_model(f"models[{i}]", model)
        _check_range(f"models[{i}].context", model.context, 1)
        _check_range(f"models[{i}].parallel", model.parallel, 1)
        _check_range(f"models[{i}].threads", model.threads, 0)
        if model.max_concurrent is not None:
            _check_range(f"models[{i}].max_concurrent", model.max_concurrent, 1)
        if model.keep_alive is not None:
            _check_keep_alive(f"models[{i}].keep_alive", model.keep_alive)
    if cfg.load_balancing.strategy not in STRATEGIES:
        raise ConfigError("load_balancing.strategy",
                          f"unknown strategy {cfg.load_balancing.strategy!r}; "
                          f"expected one of {', '.join(STRATEGIES)}")
    affinity = cfg.load_balancing.affinity
    _check_range("load_balancing.affinity.block_chars", affinity.block_chars, 64, 65536)
    _check_range("load_balancing.affinity.max_blocks", affinity.max_blocks, 0, 10_000_000)
    _check_range("load_balancing.affinity.load_bound", affinity.load_bound, 0)
    fingerprints: set[str] = set()
    priorities: dict[int, int] = {}
    for i, node in enumerate(cfg.nodes):
        _check_name(f"nodes[{i}].fingerprint", node.fingerprint, fingerprints, "fingerprint")
        _check_url(f"nodes[{i}].base_url", node.base_url, unix=False)
        _check_range(f"nodes[{i}].priority", node.priority, 1, 255)
        _check_range(f"nodes[{i}].weight", node.weight, MIN_WEIGHT, MAX_WEIGHT)
        if node.pin is not None and not is_pin(node.pin):
            raise ConfigError(f"nodes[{i}].pin", "expected sha256: and 64 lowercase hex "
                              f"digits (its certificate's SHA-256), got {node.pin[:80]!r}")
        if node.priority in priorities:
            raise ConfigError(f"nodes[{i}].priority", f"priority {node.priority} is already used "
                              f"by nodes[{priorities[node.priority]}]; priorities (1..255) "
                              "must be unique")
        priorities[node.priority] = i


def _check_aliases(aliases: AliasTable) -> None:
    """Each name a model id or a pattern (``*`` the wildcard), each target a model id that
    is not the name itself; whether the target exists is asked per request."""
    for name, target in aliases:
        path = f"aliases.{name}"
        problem = model_id_problem(name, pattern=True)
        if problem is not None:
            raise ConfigError(path, f"the name {name[:40]!r} is not a model id or pattern: "
                                    f"it {problem}")
        problem = model_id_problem(target)
        if problem is not None:
            raise ConfigError(path, f"the target {target[:40]!r} is not a model id: it "
                                    f"{problem}")
        if target == name:
            raise ConfigError(path, "a name cannot be an alias of itself")


def _check_keep_alive(path: str, value: float) -> None:
    if value < 0:  # 0s is allowed here: "unload after each answer"
        raise ConfigError(path, f"must be 0s or more (or forever), got {format_duration(value)}")


def _check_model_loading(cfg: Config) -> None:
    loading = cfg.model_loading
    _check_keep_alive("model_loading.keep_alive", loading.keep_alive)
    _check_range("model_loading.max_loaded", loading.max_loaded, 0)
    for i, folder in enumerate(loading.dirs):
        if not folder.strip() or not folder.isprintable():
            raise ConfigError(f"model_loading.dirs[{i}]", f"invalid folder {folder!r}")
    _check_duration("timeouts.model_load", cfg.timeouts.model_load, low="1s", high="10m")


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
    _check_duration(f"{req}.queue", t.request.queue, high="1h")
    _check_range("scheduling.max_waiting", cfg.scheduling.max_waiting, 1)
    _check_duration("scheduling.promote_after", cfg.scheduling.promote_after)
    _check_duration("timeouts.health_check.timeout", t.health_check.timeout)
    _check_duration("timeouts.health_check.interval", t.health_check.interval)


def validate_config(cfg: Config) -> None:
    """Raise :class:`ConfigError` (dotted path + limit) for the first invalid value."""
    _check_api(cfg.api)
    _check_local(cfg.local)
    _check_lists(cfg)
    _check_aliases(cfg.aliases)
    _check_range("ollama_api.port", cfg.ollama_api.port, 0, 65535)
    _check_range("observability.request_log_size", cfg.observability.request_log_size, 0,
                 MAX_REQUEST_LOG)
    _check_timeouts(cfg)
    _check_model_loading(cfg)
