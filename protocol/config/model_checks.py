"""The limits of one ``models:`` entry (SPEC §11, §11.1), checked on a structured
:class:`ModelConfig`: a bundled llama.cpp model, or one with a ``command`` of its own."""

from __future__ import annotations

from protocol.config.schema import (
    APIS_SETTINGS,
    CACHE_TYPES,
    MODEL_KINDS,
    STOP_SIGNALS,
    ModelConfig,
)
from protocol.errors import ConfigError
from protocol.model_command import PLACEHOLDERS, unknown_placeholder, uses

__all__ = ["check_model"]

BUNDLED_ONLY = ("gpu_layers", "flash_attn", "cache_type_k", "cache_type_v", "batch")
COMMAND_ONLY = ("env", "health", "stop_signal")
BUNDLED_KINDS = ("llm", "embedding")  # what the bundled llama.cpp serves


def _one_of(path: str, value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ConfigError(path, f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def check_model(at: str, model: ModelConfig) -> None:
    """``at`` is the entry's path (``models[2]``); the first problem is raised."""
    default = ModelConfig(name=model.name)
    _one_of(f"{at}.kind", model.kind, MODEL_KINDS, "kind")
    _one_of(f"{at}.apis", model.apis, APIS_SETTINGS, "setting")
    if model.memory is not None and model.memory <= 0:
        raise ConfigError(f"{at}.memory", f"must be a size greater than 0, got {model.memory}")
    if not model.command:
        if not model.path.strip():
            raise ConfigError(f"{at}.path", "must not be empty (or give the model a command)")
        for key in COMMAND_ONLY:
            if getattr(model, key) != getattr(default, key):
                raise ConfigError(f"{at}.{key}", "is for a model with a command (SPEC "
                                  "§11.1); the bundled llama.cpp does not take it")
        if model.kind not in BUNDLED_KINDS:
            raise ConfigError(f"{at}.kind", f"the bundled llama.cpp serves "
                              f"{' or '.join(BUNDLED_KINDS)}; a {model.kind} server needs a "
                              "command")
        _check_llama_options(at, model)
        return
    for key in BUNDLED_ONLY:
        if getattr(model, key) is not None:
            raise ConfigError(f"{at}.{key}", "is an option of the bundled llama.cpp; with a "
                              "command, pass your server's own flag in the command")
    if not model.command[0].strip():
        raise ConfigError(f"{at}.command[0]", "the program must not be empty")
    bad = unknown_placeholder(model.command)
    if bad is not None:
        index, name = bad
        known = ", ".join(f"${{{p}}}" for p in PLACEHOLDERS)
        raise ConfigError(f"{at}.command[{index}]",
                          f"unknown placeholder ${{{name}}}; the placeholders are {known}")
    if uses(model.command, "MODEL") and not model.path.strip():
        raise ConfigError(f"{at}.path", "is required: the command names ${MODEL}")
    if not model.health.startswith("/") or any(c.isspace() for c in model.health):
        raise ConfigError(f"{at}.health", f"expected a path such as /health, got "
                          f"{model.health[:80]!r}")
    _one_of(f"{at}.stop_signal", model.stop_signal, STOP_SIGNALS, "signal")


def _check_llama_options(at: str, model: ModelConfig) -> None:
    if model.gpu_layers is not None and model.gpu_layers < -1:
        raise ConfigError(f"{at}.gpu_layers",
                          f"must be -1 (all that fit) or more, got {model.gpu_layers}")
    for key in ("cache_type_k", "cache_type_v"):
        value = getattr(model, key)
        if value is not None:
            _one_of(f"{at}.{key}", value, CACHE_TYPES, "cache type")
    if model.batch is not None and model.batch < 1:
        raise ConfigError(f"{at}.batch", f"must be at least 1, got {model.batch}")
