"""The catalogue of managed models (SPEC §11): every ``*.gguf`` found under
``model_loading.dirs`` is a model named after its file, beside the ``models:`` entries of
config.yaml. Decisions only: the folder scan (:mod:`proxy.models.scan`) hands in what it
found, as paths and sizes; this module names the models, joins multi-part files and says
which config entry wins.

- A file's model name: its file name lowercased, ``.gguf`` dropped, every character outside
  ``[a-z0-9._-]`` written as ``-``.
- A multi-part GGUF (``name-00001-of-00003.gguf`` ...) is one model: named without the part
  suffix, loaded from its first part (llama.cpp finds the others), its size the sum of the
  parts; a set with parts missing is listed with them (its load fails, saying which).
- A ``models:`` entry with the same path as a found file wins: its name and settings.
- Two models with one name: the first wins (config entries first, then the folders in
  ``dirs`` order, paths sorted), each other one is left out with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

_PART = re.compile(r"(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf", re.IGNORECASE)
_OUTSIDE_NAME = re.compile(r"[^a-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Found:
    """A ``*.gguf`` file the scan found: its path (as the gateway opens it) and size."""

    path: str
    size: int


@dataclass(frozen=True, slots=True)
class ConfigModel:
    """A ``models:`` entry: its name and its path resolved like the scan's paths."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One managed model of the catalogue."""

    name: str
    path: str  # what llama.cpp loads: the file, or a multi-part set's first part
    size: int  # bytes on disk, all parts together (0 for a config entry not found)
    source: Literal["config", "folder"]
    parts: int = 1
    missing: tuple[int, ...] = ()  # part numbers of a multi-part set that are not there


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    reason: str


def model_name(file_name: str) -> str:
    """The model id of a GGUF file name (SPEC §11's rule; the part suffix is kept here)."""
    name = file_name.lower()
    if name.endswith(".gguf"):
        name = name[:-5]
    return _OUTSIDE_NAME.sub("-", name)


def _file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


@dataclass
class _Model:
    """A model file, or a multi-part set as its parts come in."""

    name: str
    path: str
    size: int
    parts: int = 1
    seen: set[int] | None = None  # a set's part numbers found so far

    @property
    def missing(self) -> tuple[int, ...]:
        if self.seen is None:
            return ()
        return tuple(n for n in range(1, self.parts + 1) if n not in self.seen)


def _group(found: Iterable[Found]) -> list[_Model]:
    """One model per file or multi-part set, in the order of each one's first file."""
    models: list[_Model] = []
    sets: dict[tuple[str, int], _Model] = {}
    for item in found:
        file_name = _file_name(item.path)
        match = _PART.fullmatch(file_name)
        if match is None:
            models.append(_Model(model_name(file_name), item.path, item.size))
            continue
        total = int(match["total"])
        folder = item.path[:len(item.path) - len(file_name)]
        key = (folder + match["stem"].lower(), total)
        model = sets.get(key)
        if model is None:
            model = sets[key] = _Model(model_name(match["stem"]), item.path, 0, total, set())
            models.append(model)
        part = int(match["part"])
        model.size += item.size
        assert model.seen is not None
        model.seen.add(part)
        if part == 1:
            model.path = item.path
    return models


def build_catalogue(configured: Sequence[ConfigModel], found: Sequence[Found]
                    ) -> tuple[list[Entry], list[Skipped]]:
    """The managed models: the config entries first (in their order), then the models of
    the files found (in the order given: the scan sorts each folder's paths), and what was
    left out."""
    sizes = {f.path: f.size for f in found}
    entries: list[Entry] = []
    skipped: list[Skipped] = []
    names: set[str] = set()
    config_paths: set[str] = set()
    for model in configured:
        if model.name in names:
            skipped.append(Skipped(model.path, f"the name {model.name!r} is used twice"))
            continue
        names.add(model.name)
        config_paths.add(model.path)
        entries.append(Entry(model.name, model.path, sizes.get(model.path, 0), "config"))
    for file in _group(found):
        if file.path in config_paths:  # the config entry for this file wins
            if file.parts > 1:  # its size is the whole set's
                entries = [Entry(e.name, e.path, file.size, e.source, file.parts,
                                 file.missing) if e.path == file.path else e
                           for e in entries]
            continue
        if file.name in names:
            skipped.append(Skipped(file.path,
                                   f"another model is already named {file.name!r}"))
            continue
        names.add(file.name)
        entries.append(Entry(file.name, file.path, file.size, "folder", file.parts,
                             file.missing))
    return entries, skipped
