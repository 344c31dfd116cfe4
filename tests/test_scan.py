"""The catalogue's folder scan (proxy/models/scan.py) on a real folder tree."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.config import ModelConfig
from proxy.models.scan import build, scan_models


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"G" * size)


def test_a_folder_tree_becomes_the_catalogue(tmp_path: Path) -> None:
    data = tmp_path / "data"
    models = data / "models"
    write(models / "B.gguf", 3)
    write(models / "a.gguf", 2)
    write(models / "nested" / "deep" / "c.GGUF", 4)
    write(models / "notes.txt", 1)
    write(models / "big-00002-of-00002.gguf", 6)
    write(models / "big-00001-of-00002.gguf", 5)
    os.symlink(models / "a.gguf", models / "link-to-a.gguf")  # a link is a model of its own
    os.symlink(models / "missing.gguf", models / "dangling.gguf")
    os.symlink(models, models / "loop")  # a linked folder is not followed
    write(tmp_path / "outside" / "far.gguf", 7)  # an absolute folder in dirs
    (models / "locked").mkdir()
    write(models / "locked" / "hidden.gguf", 1)
    os.chmod(models / "locked", 0)
    try:
        entries, skipped = build(data, [ModelConfig(name="chat", path="models/B.gguf")],
                                 ["models", str(tmp_path / "outside"), "nowhere"])
    finally:
        os.chmod(models / "locked", 0o700)
    got = [(e.name, str(Path(e.path).relative_to(tmp_path)), e.size, e.source, e.parts)
           for e in entries]
    expected = [
        ("chat", "data/models/B.gguf", 3, "config", 1),
        ("a", "data/models/a.gguf", 2, "folder", 1),
        ("big", "data/models/big-00001-of-00002.gguf", 11, "folder", 2),
        ("link-to-a", "data/models/link-to-a.gguf", 2, "folder", 1),
        ("c", "data/models/nested/deep/c.GGUF", 4, "folder", 1),
        ("far", "outside/far.gguf", 7, "folder", 1),
    ]
    if os.geteuid() != 0:  # root reads a folder whatever its mode
        assert ("hidden", "data/models/locked/hidden.gguf", 1, "folder", 1) not in got
    else:
        expected.insert(4, ("hidden", "data/models/locked/hidden.gguf", 1, "folder", 1))
    assert got == expected
    assert skipped == []


def test_no_folder_no_models(tmp_path: Path) -> None:
    assert scan_models(tmp_path, ["models", "../elsewhere"]) == []
