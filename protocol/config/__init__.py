"""config.yaml (pure: text in, values out), in four parts:

- :mod:`protocol.config.schema` — the attrs classes (attribute names are exactly the YAML
  keys), the defaults, the ``timeouts.health_check`` rule and the node order;
- :mod:`protocol.config.convert` — the one cattrs converter, YAML data <-> schema;
- :mod:`protocol.config.validate` — the limits of SPEC §3.1;
- :mod:`protocol.config.text` — parsing and writing the file's text.

Beside them (imported from their modules): :mod:`protocol.config.changes` (what a change
changes, the restart rule), :mod:`protocol.config.fields` (the settings API's one field
table) and :mod:`protocol.config.writes` (a settings write's JSON -> a new config).

Durations are ``float`` seconds and sizes ``int`` bytes in memory; on disk they are written as
``"30s"`` / ``"32MiB"``. Every problem is raised as :class:`ConfigError` naming the dotted YAML
path (``timeouts.request.streaming.total``, ``nodes[1].priority``) and, for limits, the limit
itself. Import the names from here.
"""

from protocol.config.convert import config_to_dict, structure_config
from protocol.config.schema import (
    APIS_SETTINGS,
    BACKEND_KINDS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    SOCKET_DIR_MAX_BYTES,
    STRATEGIES,
    AffinityConfig,
    ApiConfig,
    BackendConfig,
    CircuitBreakerConfig,
    Config,
    DiscoveryConfig,
    HealthChecksConfig,
    HealthCheckTimeouts,
    LoadBalancingConfig,
    LocalConfig,
    ModelConfig,
    NodeConfig,
    ObservabilityConfig,
    OllamaApiConfig,
    PhaseTimeouts,
    RequestTimeouts,
    Strategy,
    StreamingTimeouts,
    TimeoutsConfig,
    by_priority,
    default_config,
    discovery_effect,
    rebuild_health_check,
)
from protocol.config.text import dump_config_yaml, parse_config_text
from protocol.config.validate import validate_config

__all__ = [
    "APIS_SETTINGS", "BACKEND_KINDS", "MAX_WEIGHT", "MIN_WEIGHT", "SOCKET_DIR_MAX_BYTES",
    "STRATEGIES",
    "AffinityConfig", "ApiConfig", "BackendConfig",
    "CircuitBreakerConfig", "Config", "DiscoveryConfig", "HealthCheckTimeouts",
    "HealthChecksConfig",
    "LoadBalancingConfig", "LocalConfig", "ModelConfig", "NodeConfig", "ObservabilityConfig",
    "OllamaApiConfig",
    "PhaseTimeouts", "RequestTimeouts", "Strategy", "StreamingTimeouts", "TimeoutsConfig",
    "by_priority",
    "config_to_dict",
    "default_config", "discovery_effect", "dump_config_yaml", "parse_config_text",
    "rebuild_health_check",
    "structure_config", "validate_config",
]
