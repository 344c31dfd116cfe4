"""Model aliases (SPEC §12): names clients send, mapped to models that exist. Pure.

``aliases:`` in config.yaml maps a name, or a pattern where ``*`` (the only wildcard)
matches any run of characters, empty included, to a target model id:
``{"gpt-4o": "smollm2-135m", "claude-*": "qwen2.5-coder-7b"}``. The rule, in order:

1. a model id that exists (local or remote) is never aliased;
2. else an exact name;
3. else the first pattern that matches the whole id, in file order.

A target is used as it is: it is not looked up in the table again (no chains). Whether the
asked id and the target exist is the caller's question (:mod:`proxy.aliasing` asks the
registry, the managed models and the node index); this module only decides.

:class:`AliasTable` is made once per config (the config converter builds it), so a pattern
is compiled once per table, not per request; an empty table is falsy, which is all a request
pays when no alias is configured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

__all__ = ["MAX_MODEL_ID", "WILDCARD", "AliasTable", "alias_entries", "model_id_problem",
           "resolve"]

WILDCARD: Final = "*"
MAX_MODEL_ID: Final = 256  # characters of a model id (or an alias name) we accept


def model_id_problem(value: object, *, pattern: bool = False) -> str | None:
    """Why ``value`` is not a model id, or None when it is. A model id is 1 to
    :data:`MAX_MODEL_ID` printable characters without white space (``gpt-4o``,
    ``qwen2.5-coder:7b``, ``meta-llama/Llama-3.1-8B``). ``pattern``: an alias name, where
    ``*`` is the wildcard; a target may not hold one."""
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > MAX_MODEL_ID:
        return f"is {len(value)} characters long; a model id has at most {MAX_MODEL_ID}"
    if not value.isprintable() or any(c.isspace() for c in value):
        return "must be printable text without spaces"
    if not pattern and WILDCARD in value:
        return "holds '*', which only an alias name may (as its wildcard)"
    return None


def _compile(pattern: str) -> re.Pattern[str]:
    """``*`` matches any run of characters (empty too); everything else itself."""
    parts = pattern.split(WILDCARD)
    return re.compile(".*".join(re.escape(part) for part in parts), re.DOTALL)


class AliasTable:
    """The ``aliases:`` of one config, in file order. Immutable; equal when the entries and
    their order are equal. Falsy when empty."""

    __slots__ = ("_exact", "_items", "_patterns")

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: tuple[tuple[str, str], ...] = tuple(items)
        self._exact: dict[str, str] = {}
        patterns: list[tuple[Callable[[str], Any], str]] = []
        for name, target in self._items:
            if WILDCARD in name:
                patterns.append((_compile(name).fullmatch, target))
            else:
                self._exact.setdefault(name, target)
        self._patterns = tuple(patterns)

    @classmethod
    def of(cls, mapping: Mapping[str, str]) -> AliasTable:
        return cls(mapping.items())

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AliasTable):
            return NotImplemented
        return self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"AliasTable({dict(self._items)!r})"

    def as_dict(self) -> dict[str, str]:
        """name -> target in file order (the YAML and the API's shape)."""
        return dict(self._items)

    @property
    def exact(self) -> Mapping[str, str]:
        """The names without a wildcard, in file order."""
        return self._exact

    def target_of(self, model: str) -> str | None:
        """The target of ``model`` by rules 2 and 3 (whether it exists is not asked)."""
        target = self._exact.get(model)
        if target is not None:
            return target
        for match, target in self._patterns:
            if match(model) is not None:
                return target
        return None


def resolve(table: AliasTable, model: str, exists: Callable[[str], bool]) -> str | None:
    """The model to serve ``model`` as, or None to serve it as asked: None when ``model``
    exists (``exists(model)``, asked only when some alias would apply), else its exact
    alias, else the first matching pattern's target, else None."""
    target = table.target_of(model)
    if target is None or exists(model):
        return None
    return target


def alias_entries(table: AliasTable, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The unified model list (SPEC §7.5) with the exact aliases added after it: each one
    whose target is listed and whose own name is not (a model that exists is never aliased),
    as a copy of the target's entry with the alias's id and ``"sluice": {"aliasOf":
    target}`` (beside the target's own ``sluice`` facts, e.g. a managed model's state)."""
    exact = table.exact
    if not exact:
        return entries
    by_id = {entry["id"]: entry for entry in entries}
    added = []
    for name, target in exact.items():
        listed = by_id.get(target)
        if listed is None or name in by_id:
            continue
        extra = listed.get("sluice")
        entry = {**listed, "id": name,
                 "sluice": {**(extra if isinstance(extra, dict) else {}), "aliasOf": target}}
        added.append(entry)
    return [*entries, *added] if added else entries
