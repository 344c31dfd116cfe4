"""What a change of config.yaml changes (SPEC §13), pure: the sections that differ between
two configs and the fields among them that take effect only at the next start.

A section is a top-level YAML key (``timeouts``, ``nodes``, ...), named as in the file: the
words of the notification "config.yaml reloaded: <sections>", of each history entry's
``sections`` and of the ``settings`` events' sources.
"""

from __future__ import annotations

import attrs

from protocol.config.schema import Config

__all__ = ["RESTART_FIELDS", "SECTIONS", "changed_sections", "restart_changes"]

SECTIONS: tuple[str, ...] = tuple(field.name for field in attrs.fields(Config))
"""Every top-level key of config.yaml, in the file's order."""

RESTART_FIELDS: tuple[tuple[str, str], ...] = (
    ("api", "enabled"),
    ("api", "port"),
    ("api", "allow_external_access"),
    ("api", "node_port"),
    ("local", "socket_dir"),
    ("ollama_api", "port"),
)
"""The fields a running gateway cannot apply: they name the sockets it listens on. The one
restart rule: the settings field table's ``restart`` flags are derived from it
(:mod:`protocol.config.fields`)."""


def changed_sections(old: Config, new: Config) -> tuple[str, ...]:
    """The top-level sections whose values differ, in the file's order."""
    if old is new:
        return ()
    return tuple(name for name in SECTIONS if getattr(old, name) != getattr(new, name))


def restart_changes(old: Config, new: Config) -> list[str]:
    """The dotted paths of the fields that take effect at the next start and differ."""
    return [f"{section}.{key}" for section, key in RESTART_FIELDS
            if getattr(getattr(old, section), key) != getattr(getattr(new, section), key)]
