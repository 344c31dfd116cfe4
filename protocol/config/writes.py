"""The one way a settings write's JSON becomes config (SPEC §8): the body (any subset of its
section's fields, in the shape the GET returned) is put at each field's config path in the
current config's YAML data, and that data is read exactly as config.yaml is at start
(:func:`protocol.config.text.config_from_data`: the one converter, the health_check rule,
the limits of §3.1). Every problem is a :class:`ConfigError` naming what the section's
422s name (:meth:`Section.renamed`), and the write changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from protocol.config.convert import config_to_dict, describe, structure_at
from protocol.config.fields import Field, Section
from protocol.config.schema import Config
from protocol.config.text import config_from_data
from protocol.errors import ConfigError

__all__ = ["apply_write", "structure_field"]


def _merge(target: dict[str, Any], key: str, value: object, path: str) -> None:
    """Put ``value`` at ``target[key]``; a mapping given for a mapping is merged key by key
    (a partial tree changes only what it names)."""
    old = target.get(key)
    if not isinstance(old, dict):
        target[key] = value
        return
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping of keys, got {describe(value)}")
    for name, item in value.items():
        _merge(old, name, item, f"{path}.{name}")


def _put(data: dict[str, Any], path: str, value: object, *, tree: bool) -> None:
    """Put ``value`` at ``path``; a section of the schema (``tree``) is merged into."""
    *parents, key = path.split(".")
    for part in parents:
        data = data[part]
    if tree:
        _merge(data, key, value, path)
    else:
        data[key] = value


def _value(f: Field, value: object) -> object:
    return None if f.blank_is_null and value == "" else value


def apply_write(section: Section, doc: Mapping[str, Any], cfg: Config) -> Config:
    """``cfg`` with the fields of ``doc`` written (read-only ones ignored), structured,
    derived and validated as at start; :class:`ConfigError` naming the field otherwise."""
    section.check(doc)
    data = config_to_dict(cfg)
    try:
        for name, value in doc.items():
            f = section.get(name)
            if f is not None:
                _put(data, f.path, _value(f, value), tree=attrs.has(f.type))
            elif name not in section.read_only and section.tree is not None:
                _put(data, f"{section.tree}.{name}", value, tree=False)  # an unknown key
        return config_from_data(data)
    except ConfigError as exc:
        raise section.renamed(exc) from None


def structure_field(section: Section, name: str, value: object) -> Any:
    """One field's value read as its config type (before it is used to make a change);
    :class:`ConfigError` naming the field as the section's 422s do."""
    f = section.get(name)
    if f is None:
        raise ValueError(f"{section.name} has no field {name!r}")
    try:
        return structure_at(f.path, _value(f, value), f.type)
    except ConfigError as exc:
        raise section.renamed(exc) from None
