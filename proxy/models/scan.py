"""The folder side of the managed-model catalogue (SPEC §11): find every ``*.gguf`` under
``model_loading.dirs`` and hand the files to :func:`protocol.catalogue.build_catalogue`.

Folders are relative to the data folder unless absolute. A symlinked file counts (a link to
a GGUF is a model of its own, as a copy is); a symlinked folder is not followed (no loops),
and a folder that cannot be read is passed over. Blocking file-system calls: the gateway
runs them in a worker thread (:func:`proxy.models.specs.prepare`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from protocol.catalogue import ConfigModel, Entry, Found, Skipped, build_catalogue
from protocol.config import ModelConfig

MAX_FILES = 10_000  # GGUF files looked at per scan; a folder tree beyond that is cut short


def model_path(data_dir: Path, path: str) -> str:
    """A configured or found path as the catalogue compares them: absolute, normalised,
    symlinks kept (two links to one file are two models)."""
    return os.path.normpath(os.path.join(data_dir, path))


def scan_models(data_dir: Path, dirs: Sequence[str]) -> list[Found]:
    """Every ``*.gguf`` file under ``dirs``, each folder's files in sorted path order."""
    found: list[Found] = []
    seen: set[str] = set()
    for folder in dirs:
        root = model_path(data_dir, folder)
        files: list[Found] = []
        for here, subdirs, names in os.walk(root, onerror=lambda _: None):
            subdirs.sort()
            for name in names:
                if not name.lower().endswith(".gguf"):
                    continue
                path = os.path.join(here, name)
                try:
                    size = os.stat(path).st_size  # through a symlink: the file's size
                except OSError:
                    continue  # a dangling link, or gone since
                if path not in seen and os.path.isfile(path):
                    seen.add(path)
                    files.append(Found(path, size))
            if len(found) + len(files) >= MAX_FILES:
                break
        found += sorted(files, key=lambda f: f.path)
    return found[:MAX_FILES]


def build(data_dir: Path, models: Sequence[ModelConfig], dirs: Sequence[str]
          ) -> tuple[list[Entry], list[Skipped]]:
    """The catalogue: ``models`` (their paths resolved) and the files under ``dirs``."""
    configured = [ConfigModel(m.name, model_path(data_dir, m.path) if m.path else "")
                  for m in models]  # no path: a command that names no file (SPEC §11.1)
    entries, skipped = build_catalogue(configured, scan_models(data_dir, dirs))
    return [_sized(e) for e in entries], skipped


def _sized(entry: Entry) -> Entry:
    """A config entry's file outside the scanned folders, with its size."""
    if entry.size or entry.source != "config" or not entry.path:
        return entry
    try:
        return dataclasses.replace(entry, size=os.stat(entry.path).st_size)
    except OSError:
        return entry  # not there: its load says so
