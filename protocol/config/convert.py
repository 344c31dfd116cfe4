"""The one cattrs converter between config data (YAML's mappings, lists and scalars) and the
schema, both ways. Reading is strict (no ``"yes"`` for true, no unknown key) and every
problem becomes a :class:`ConfigError` naming the dotted YAML path of the first one."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping
from typing import Any, Final, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from protocol.aliases import AliasTable
from protocol.config.schema import (
    AUTO_BUDGET,
    Command,
    Config,
    Duration,
    Env,
    KeepAlive,
    MemoryBudget,
    ModelConfig,
    Size,
)
from protocol.durations import format_duration, format_size, parse_duration, parse_size
from protocol.errors import ConfigError

__all__ = ["config_to_dict", "describe", "structure_at", "structure_config"]


def describe(value: object) -> str:
    """What a YAML value is, for messages ("the string 'x'", "a mapping", ...)."""
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
            raise ConfigError("", f"expected {expected}, got {describe(value)}")
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
        raise ConfigError("", f"expected a list, got {describe(value)}")
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
            raise ConfigError("", f"expected a mapping of keys, got {describe(value)}")
        for name, default in instance_defaults.items():
            given = value.get(name)
            if isinstance(given, Mapping):
                value = {**value, name: {**default, **given}}
        return inner(value, cl)

    return structure


def _keep_alive(value: object, _: Any) -> float:
    """``model_loading.keep_alive``: a duration (``0s`` = after each answer) or ``forever``."""
    if isinstance(value, str) and value.strip().lower() == "forever":
        return math.inf
    return parse_duration(value, "")


def _format_keep_alive(seconds: float) -> str:
    return "forever" if seconds == math.inf else format_duration(seconds)


def _memory_budget(value: object, _: Any) -> int:
    """``model_loading.memory_budget``: ``auto`` (75% of physical RAM) or a size over 0."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO_BUDGET
    try:
        size = parse_size(value, "")
    except ConfigError:
        raise ConfigError("", "expected auto or a size such as \"12GiB\", got "
                              f"{describe(value)}") from None
    if size <= 0:
        raise ConfigError("", f"expected auto or a size greater than 0, got {describe(value)}")
    return size


def _format_memory_budget(size: int) -> str:
    return "auto" if size == AUTO_BUDGET else format_size(size)


def _aliases(value: object, _: Any) -> AliasTable:
    """``aliases:``: a mapping (``null`` = empty) of names to targets, both strings, kept in
    file order; a problem names ``aliases.<name>``. Whether each is a model id is
    :mod:`protocol.config.validate`'s rule."""
    if value is None:
        return AliasTable()
    if not isinstance(value, Mapping):
        raise ConfigError("", "expected a mapping of names to model ids (gpt-4o: "
                              f"smollm2-135m), got {describe(value)}")
    for name, target in value.items():
        if not isinstance(name, str):
            raise ConfigError(str(name), "an alias name must be a string (write it in "
                                         f"quotes), got {describe(name)}")
        if not isinstance(target, str):
            raise ConfigError(name, f"the target must be a model id (a string), got "
                                    f"{describe(target)}")
    return AliasTable(value.items())


def _command(value: object, _: Any) -> tuple[str, ...]:
    """``models[].command``: a list of strings, or one string split as a shell would split
    it (quotes and backslashes; no shell is run, nothing is expanded here)."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:  # an unclosed quote
            raise ConfigError("", f"cannot split the command: {exc}") from None
    if not isinstance(value, list | tuple):
        raise ConfigError("", f"expected a list of arguments or a string, got {describe(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"[{index}]", "each argument must be a string (write it in "
                                            f"quotes), got {describe(item)}")
    return tuple(value)


def _env(value: object, _: Any) -> tuple[tuple[str, str], ...]:
    """``models[].env``: a mapping of variable names to strings (a whole number is taken as
    its digits: ``CUDA_VISIBLE_DEVICES: 0``)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError("", f"expected a mapping of names to values, got {describe(value)}")
    out = []
    for name, given in value.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(str(name), "not a variable name")
        if isinstance(given, int) and not isinstance(given, bool):
            given = str(given)
        if not isinstance(given, str):
            raise ConfigError(name, f"expected a string, got {describe(given)}")
        out.append((name, given))
    return tuple(out)


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
_CONVERTER.register_structure_hook_func(lambda t: t == KeepAlive, _keep_alive)
_CONVERTER.register_structure_hook_func(lambda t: t == MemoryBudget, _memory_budget)
_CONVERTER.register_unstructure_hook_func(lambda t: t == KeepAlive, _format_keep_alive)
_CONVERTER.register_unstructure_hook_func(lambda t: t == MemoryBudget, _format_memory_budget)
_CONVERTER.register_structure_hook(AliasTable, _aliases)
_CONVERTER.register_structure_hook_func(lambda t: t == Command, _command)
_CONVERTER.register_structure_hook_func(lambda t: t == Env, _env)
_CONVERTER.register_unstructure_hook_func(lambda t: t == Command, list)
_CONVERTER.register_unstructure_hook_func(lambda t: t == Env, dict)
_CONVERTER.register_unstructure_hook(AliasTable, AliasTable.as_dict)


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
    if isinstance(exc, ConfigError):  # a hook's own path (an alias name) goes under ours
        if not exc.path:
            return ConfigError(path, exc.message)
        below = path + exc.path if exc.path.startswith("[") else _join(path, exc.path)
        return ConfigError(below, exc.message[len(exc.path) + 2:])
    if isinstance(exc, KeyError):
        return ConfigError(path, "is required")
    return ConfigError(path, f"invalid value ({type(exc).__name__}: {exc})")


def structure_config(data: Mapping[str, Any]) -> Config:
    """A :class:`Config` from YAML data; missing keys take their defaults. Raises
    :class:`ConfigError` for the first problem (unknown keys first), not yet validated."""
    try:
        return _CONVERTER.structure(data, Config)
    except ConfigError:
        raise
    except Exception as exc:
        raise _first_error(exc, "", data) from None


def structure_at(path: str, value: object, tp: Any) -> Any:
    """One value of the config at the dotted ``path`` (``tp`` the schema's annotation
    there), read as in config.yaml; a problem is a :class:`ConfigError` naming ``path`` (or
    the key below it)."""
    try:
        return _CONVERTER.structure(value, tp)
    except Exception as exc:
        raise _first_error(exc, path, value) from None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain YAML-ready data in SPEC order; durations like ``"30s"``, sizes like ``"32MiB"``.
    A node without a pin has no ``pin`` key (SPEC §16: absent = a plain link), a backend or
    model without ``max_concurrent`` none either (SPEC §18)."""
    data: dict[str, Any] = _CONVERTER.unstructure(cfg)
    for node in data.get("nodes", ()):
        if node.get("pin", "") is None:
            del node["pin"]
    for backend in data.get("backends", ()):  # §17.1's and §18's keys where they say something
        if backend.get("max_concurrent", "") is None:
            del backend["max_concurrent"]
        if backend.get("apis") == "auto":
            del backend["apis"]
    for model in data.get("models", ()):  # §11.1's keys only where they say something
        if model.get("path") == "":  # a command that names no file
            del model["path"]
        for key in _MODEL_OPTIONAL:
            if model.get(key) == _MODEL_DEFAULTS[key]:
                del model[key]
    return data


# models[]' keys of SPEC §11.1, written to config.yaml only when not at their default.
_MODEL_OPTIONAL: Final = ("command", "env", "health", "memory", "kind", "stop_signal",
                          "gpu_layers", "flash_attn", "cache_type_k", "cache_type_v", "batch",
                          "max_concurrent", "apis")
_MODEL_DEFAULTS: Final = {key: value for key, value in
                          _CONVERTER.unstructure(ModelConfig(name="")).items()
                          if key in _MODEL_OPTIONAL}
