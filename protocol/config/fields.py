"""The settings API's one field table (SPEC §8, §12, §14): for each section a settings write
can change, each field's JSON name, the dotted config path it is written to, its type (the
schema's annotation at that path, looked up, not restated) and whether it takes effect only
at the next start (derived from :data:`protocol.config.changes.RESTART_FIELDS`, the one
restart rule).

A section is named as its ``settings`` event is (``loadBalancing``). Its GET body is its
fields read from the config (:mod:`protocol.views`); a write is a subset of them, mapped to
config by :func:`protocol.config.writes.apply_write`. Read-only fields (computed by the
server) are ignored in a write; any other name is refused with :func:`unknown_field`, the
one wording of that 422 for every body the API reads — except in the ``timeouts`` section,
whose body is the YAML tree itself: a name not in it is one of the tree's unknown keys, as
in config.yaml. A 422 names the dotted config path, or, for the node registry, the JSON
field (:meth:`Section.renamed`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, get_args

import attrs

from protocol.config.changes import RESTART_FIELDS
from protocol.config.schema import Config, TimeoutsConfig
from protocol.errors import ConfigError

__all__ = ["ALIASES", "API", "DISCOVERY", "LOAD_BALANCING", "NODES", "RESTART_PATHS",
           "SETTINGS_SECTIONS", "TIMEOUTS", "Field", "Section", "check_fields",
           "schema_type", "unknown_field"]

RESTART_PATHS: Final = frozenset(f"{section}.{key}" for section, key in RESTART_FIELDS)


def unknown_field(name: str, allowed: Iterable[str]) -> ConfigError:
    """The one 422 for a field a body should not have: it names the field and lists the
    fields the body may have."""
    names = list(allowed)
    expected = names[0] if len(names) == 1 else f"one of {', '.join(names)}"
    return ConfigError(name, f"unknown field; expected {expected}")


def check_fields(doc: Mapping[str, Any], allowed: Iterable[str],
                 ignored: Iterable[str] = ()) -> None:
    """Refuse the first field of ``doc`` (in its order) that is neither ``allowed`` nor
    ``ignored``."""
    names = tuple(allowed)
    skip = frozenset(ignored)
    for name in doc:
        if name not in names and name not in skip:
            raise unknown_field(name, names)


def schema_type(path: str) -> Any:
    """The schema's annotation at a dotted config path (``nodes[].weight``: each node's)."""
    tp: Any = Config
    for part in path.split("."):
        tp = attrs.fields_dict(tp)[part.removesuffix("[]")].type
        if part.endswith("[]"):
            tp = get_args(tp)[0]
    return tp


@attrs.frozen
class Field:
    """One field of a settings section."""

    json: str  # its name in the API's bodies
    path: str  # the dotted config path a write changes
    shown: str  # the path the GET reads it from (and a 422 about it names): mostly ``path``
    type: Any = attrs.field(eq=False, repr=False)  # the schema's annotation at ``path``
    restart: bool = False  # applies at the next start (RESTART_FIELDS)
    blank_is_null: bool = False  # "" is written as null (a folder left empty)

    @property
    def key(self) -> str:
        """The last part of the path (the attribute of the config class that holds it)."""
        return self.path.rsplit(".", 1)[-1]


def field(json: str, path: str, *, shown: str | None = None,
          blank_is_null: bool = False) -> Field:
    return Field(json, path, shown or path, schema_type(path), path in RESTART_PATHS,
                 blank_is_null)


@attrs.frozen
class Section:
    """The fields of one settings section, in the order its GET body shows them."""

    name: str  # as in the ``settings`` events
    fields: tuple[Field, ...]
    read_only: tuple[str, ...] = ()  # shown by the GET, computed: ignored in a write
    tree: str | None = None  # the body is this YAML tree: other names are its unknown keys
    by_json: bool = False  # a 422 names the JSON field, not the config path

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.json for f in self.fields)

    def get(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.json == name), None)

    def check(self, doc: Mapping[str, Any]) -> None:
        """Refuse a field this section does not have (the GET's read-only ones are fine)."""
        if self.tree is None:
            check_fields(doc, self.names, self.read_only)

    def param(self, path: str) -> str:
        """What a 422 about the config path ``path`` names: the field's shown path (or its
        JSON name), followed by the rest of ``path`` below it."""
        for f in self.fields:
            match = re.match(re.escape(f.path).replace(r"\[\]", r"\[\d*\]") + r"(?=$|[.\[])",
                             path)
            if match:
                return (f.json if self.by_json else f.shown) + path[match.end():]
        return path

    def renamed(self, exc: ConfigError) -> ConfigError:
        """``exc`` naming :meth:`param` of its path (the same error when that is its path)."""
        param = self.param(exc.path)
        if param == exc.path:
            return exc
        return ConfigError(param, exc.message[len(exc.path) + 2:])


API: Final = Section("api", (
    field("enabled", "api.enabled"),
    field("port", "api.port"),
    field("allowExternalAccess", "api.allow_external_access"),
    field("requireAuth", "api.require_auth"),
    field("socketDir", "local.socket_dir", blank_is_null=True),
    field("nodePort", "api.node_port"),
), read_only=("restartRequired", "identity"))

LOAD_BALANCING: Final = Section("loadBalancing", (
    field("enabled", "load_balancing.enabled"),
    field("strategy", "load_balancing.strategy"),
    field("failoverEnabled", "load_balancing.failover_enabled"),
    field("preferLoaded", "load_balancing.prefer_loaded"),
    field("spillOver", "load_balancing.spill_over"),
    field("affinity", "load_balancing.affinity"),
    field("healthCheckInterval", "health_checks.interval"),
))

# The timeouts tree with the YAML's own keys. health_check is generated from health_checks
# (SPEC §3.2): values given for it are written there, and a 422 about them names the path
# the GET shows them at.
TIMEOUTS: Final = Section("timeouts", tuple(
    field(a.name, f"timeouts.{a.name}") if a.name != "health_check"
    else field(a.name, "health_checks", shown=f"timeouts.{a.name}")
    for a in attrs.fields(TimeoutsConfig)), tree="timeouts")

DISCOVERY: Final = Section("discovery", (
    field("announce", "discovery.announce"),
    field("browse", "discovery.browse"),
), read_only=("announcing", "browsing"))

ALIASES: Final = Section("aliases", (field("aliases", "aliases"),))

# Each entry of the node registry (GET /api/v1/nodes); a 422 names the JSON field.
NODES: Final = Section("nodes", (
    field("fingerprint", "nodes[].fingerprint"),
    field("name", "nodes[].name"),
    field("baseUrl", "nodes[].base_url"),
    field("priority", "nodes[].priority"),
    field("enabled", "nodes[].enabled"),
    field("weight", "nodes[].weight"),
), read_only=("hasApiKey", "pin", "link"), by_json=True)

SETTINGS_SECTIONS: Final = (API, LOAD_BALANCING, TIMEOUTS, DISCOVERY, ALIASES, NODES)
