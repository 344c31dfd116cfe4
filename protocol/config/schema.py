"""The config.yaml schema: one frozen attrs class per section, attribute names exactly the
YAML keys, with the defaults written on first start (SPEC §3), and the rules derived from it
(the ``timeouts.health_check`` regeneration, the node order).

No ``from __future__ import annotations`` here: the converter reads these annotations at
run time, ``Annotated`` units included.
"""

import enum
from collections.abc import Iterable
from typing import Annotated, Final

import attrs

from protocol.aliases import AliasTable

__all__ = [
    "APIS_SETTINGS",
    "AUTO_BUDGET",
    "BACKEND_KINDS",
    "CACHE_TYPES",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "MODEL_KINDS",
    "SOCKET_DIR_MAX_BYTES",
    "STOP_SIGNALS",
    "STRATEGIES",
    "AffinityConfig",
    "ApiConfig",
    "BackendConfig",
    "CircuitBreakerConfig",
    "Command",
    "Config",
    "DiscoveryConfig",
    "Duration",
    "Env",
    "HealthCheckTimeouts",
    "HealthChecksConfig",
    "KeepAlive",
    "LoadBalancingConfig",
    "LocalConfig",
    "MemoryBudget",
    "ModelConfig",
    "ModelLoadingConfig",
    "NodeConfig",
    "ObservabilityConfig",
    "OllamaApiConfig",
    "PhaseTimeouts",
    "RequestTimeouts",
    "Size",
    "Strategy",
    "StreamingTimeouts",
    "TimeoutsConfig",
    "Unit",
    "by_priority",
    "default_config",
    "discovery_effect",
    "rebuild_health_check",
]


class Unit(enum.Enum):
    """How a number is written in YAML (the converter reads and writes it so)."""

    DURATION = "duration"
    SIZE = "size"
    KEEP_ALIVE = "keep_alive"
    BUDGET = "budget"
    COMMAND = "command"
    ENV = "env"


Duration = Annotated[float, Unit.DURATION]  # seconds; "30s" in YAML
Size = Annotated[int, Unit.SIZE]  # bytes; "32MiB" in YAML
# Idle time before a managed model is stopped: seconds, "0s" = after each answer,
# "forever" (inf) = never.
KeepAlive = Annotated[float, Unit.KEEP_ALIVE]
MemoryBudget = Annotated[int, Unit.BUDGET]  # bytes; AUTO_BUDGET (0) = "auto" in YAML
AUTO_BUDGET: Final = 0
# A model server's command line (SPEC §11.1): a YAML list, or a string split like a shell.
Command = Annotated[tuple[str, ...], Unit.COMMAND]
# Its environment: a YAML mapping of names to strings, kept in file order.
Env = Annotated[tuple[tuple[str, str], ...], Unit.ENV]
MODEL_KINDS: Final = ("llm", "embedding", "diffusion", "speech")
# How a server's missing Messages and Responses APIs are handled (SPEC §17.1).
APIS_SETTINGS: Final = ("auto", "native", "translate")
STOP_SIGNALS: Final = ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2",
                       "SIGKILL")
# llama.cpp's KV cache types (its --cache-type-k / -v).
CACHE_TYPES: Final = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

class Strategy(enum.StrEnum):
    """The values of ``load_balancing.strategy``; how each orders the nodes is
    :mod:`protocol.strategies`."""

    PRIORITY = "priority"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    FASTEST = "fastest"
    WEIGHTED = "weighted"  # smooth weighted round-robin by nodes[].weight (SPEC §13)
    CACHE_AWARE = "cache-aware"  # where the conversation's prefix is warm, then load (§15)


STRATEGIES: Final = tuple(s.value for s in Strategy)
BACKEND_KINDS: Final = ("llm", "diffusion", "embedding")
SOCKET_DIR_MAX_BYTES: Final = 62
MIN_WEIGHT: Final = 1  # nodes[].weight, for the weighted strategy
MAX_WEIGHT: Final = 100


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
    node_port: int = 39443  # TLS 1.3 listener for other gateways (SPEC §16); 0 = none


@attrs.frozen
class LocalConfig:
    socket_dir: str | None = None
    fallback_port: int = 0


@attrs.frozen
class OllamaApiConfig:
    port: int = 0  # 0 = off; e.g. 11434: a loopback listener for Ollama apps (SPEC §12)


@attrs.frozen
class DiscoveryConfig:
    """mDNS/DNS-SD on the LAN (SPEC §14): both off until the user turns them on."""

    announce: bool = False  # takes effect only with api.allow_external_access
    browse: bool = False  # takes effect only with load_balancing.enabled


@attrs.frozen
class BackendConfig:
    name: str
    url: str
    kind: str = "llm"
    max_concurrent: int | None = None  # its slots when it reports none, else a cap (§18)
    apis: str = "auto"  # APIS_SETTINGS (SPEC §17.1)


@attrs.frozen
class ModelConfig:
    """A managed model (SPEC §11): the bundled llama.cpp serving ``path``, or with
    ``command`` a model server of the user's own (§11.1)."""

    name: str
    path: str = ""  # ${MODEL}; optional for a command that names no file
    context: int = 2048
    parallel: int = 2
    threads: int = 0
    keep_alive: KeepAlive | None = None  # None: model_loading.keep_alive
    preload: bool = False  # loaded at start, and again after an unload by idle
    command: Command = ()  # empty: the bundled llama.cpp
    env: Env = ()
    health: str = "/health"  # 200 = ready
    memory: Size | None = None  # its size for the budget, loaded or not
    kind: str = "llm"  # MODEL_KINDS
    stop_signal: str = "SIGTERM"  # then SIGKILL after 10 s
    gpu_layers: int | None = None  # the bundled llama.cpp's n_gpu_layers (-1: all that fit)
    flash_attn: bool | None = None
    cache_type_k: str | None = None  # CACHE_TYPES
    cache_type_v: str | None = None
    batch: int | None = None  # n_batch
    max_concurrent: int | None = None  # a cap on its slots (SPEC §18); default: reported
    apis: str = "auto"  # APIS_SETTINGS (SPEC §17.1); the bundled llama.cpp's auto is native


@attrs.frozen
class AffinityConfig:
    """How cache-aware routing indexes prompts (SPEC §15)."""

    block_chars: int = 512  # prefix block size, in characters of the canonical prompt text
    max_blocks: int = 200_000  # index cap, all candidates together; least recently used out
    load_bound: int = 1  # a cached candidate may have this many more waiting than the least


@attrs.frozen
class LoadBalancingConfig:
    enabled: bool = False
    strategy: str = "cache-aware"  # new files; an existing file keeps the one it names
    failover_enabled: bool = True
    prefer_loaded: bool = True  # nodes that have the model loaded first (SPEC §11)
    spill_over: bool = False  # a local server with every slot busy: a node's free slot (§15)
    affinity: AffinityConfig = attrs.field(factory=AffinityConfig)


@attrs.frozen
class NodeConfig:
    fingerprint: str
    name: str
    base_url: str
    priority: int
    enabled: bool = True
    weight: int = 1  # MIN_WEIGHT..MAX_WEIGHT: its share under the weighted strategy
    pin: str | None = None  # its certificate's "sha256:<hex>", set by pairing (SPEC §16)


@attrs.frozen
class ObservabilityConfig:
    request_log_size: int = 1000  # finished requests kept for /api/v1/requests (0 = off)


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
    queue: Duration = 600.0  # the longest wait for a slot (SPEC §18) -> 504 queue_timeout


@attrs.frozen
class HealthCheckTimeouts:
    timeout: Duration = 4.0
    interval: Duration = 5.0


@attrs.frozen
class TimeoutsConfig:
    connection: Duration = 10.0
    request: RequestTimeouts = attrs.field(factory=RequestTimeouts)
    model_load: Duration = 120.0  # a managed model's start must answer /health within this
    health_check: HealthCheckTimeouts = attrs.field(factory=HealthCheckTimeouts)


@attrs.frozen
class SchedulingConfig:
    """The queue in front of every server (SPEC §18)."""

    queue: bool = True  # false: send at once, as before §18
    max_waiting: int = 256  # per model; beyond -> 429 queue_full with Retry-After
    promote_after: Duration = 120.0  # a batch request waiting this long is interactive


@attrs.frozen
class ModelLoadingConfig:
    """Models on demand (SPEC §11)."""

    keep_alive: KeepAlive = 300.0
    max_loaded: int = 0  # 0 = no count limit
    memory_budget: MemoryBudget = AUTO_BUDGET
    dirs: tuple[str, ...] = ("models",)  # relative to the data dir


@attrs.frozen
class Config:
    api: ApiConfig = attrs.field(factory=ApiConfig)
    local: LocalConfig = attrs.field(factory=LocalConfig)
    backends: tuple[BackendConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()
    load_balancing: LoadBalancingConfig = attrs.field(factory=LoadBalancingConfig)
    nodes: tuple[NodeConfig, ...] = ()
    # names clients send -> models that exist (SPEC §12), in file order
    aliases: AliasTable = attrs.field(factory=AliasTable)
    ollama_api: OllamaApiConfig = attrs.field(factory=OllamaApiConfig)
    discovery: DiscoveryConfig = attrs.field(factory=DiscoveryConfig)
    model_loading: ModelLoadingConfig = attrs.field(factory=ModelLoadingConfig)
    scheduling: SchedulingConfig = attrs.field(factory=SchedulingConfig)
    observability: ObservabilityConfig = attrs.field(factory=ObservabilityConfig)
    health_checks: HealthChecksConfig = attrs.field(factory=HealthChecksConfig)
    circuit_breaker: CircuitBreakerConfig = attrs.field(factory=CircuitBreakerConfig)
    timeouts: TimeoutsConfig = attrs.field(factory=TimeoutsConfig)


def default_config() -> Config:
    """The configuration written on first start (SPEC §3)."""
    return Config()


def by_priority(nodes: Iterable[NodeConfig]) -> list[NodeConfig]:
    """Nodes in the user's order: top first (the largest priority first)."""
    return sorted(nodes, key=lambda n: -n.priority)


def discovery_effect(cfg: Config, external: bool) -> tuple[bool, bool]:
    """(announcing, browsing): what the ``discovery:`` switches do now (SPEC §14). Announcing
    needs ``api.allow_external_access`` and ``external``: the running API listener binds
    every address (decided at start; the config's flag is read live, so turning it off
    stops the announcement at once). Browsing needs ``load_balancing.enabled``."""
    announcing = (cfg.discovery.announce and external and cfg.api.enabled
                  and cfg.api.allow_external_access)
    return announcing, cfg.discovery.browse and cfg.load_balancing.enabled


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
