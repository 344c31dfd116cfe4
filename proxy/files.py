"""Writing and reading the gateway's own files: replace a file atomically, read a text file
with every problem told as a :class:`ConfigError` naming the file (never its content)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from protocol.errors import ConfigError

__all__ = ["FileSignature", "atomic_write", "file_signature", "read_text", "remove_leftovers"]


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data``: temp file in the same folder, fsync, rename, fsync of
    the folder. A reader sees the old file or the new one, never a part; a failure (raised as
    OSError) leaves the old file as it was."""
    folder = path.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_leftovers(path: Path) -> int:
    """Remove the temp files of :func:`atomic_write` for ``path`` that a killed process left
    (made, not yet renamed); how many. Run at start, before any write."""
    removed = 0
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            leftover.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def read_text(path: Path) -> str:
    """A config-ish file as text; problems become ConfigError (never with the content)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path}: not valid UTF-8 text") from None
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot read ({exc.strerror})") from None


FileSignature = tuple[int, int, int, int]
"""(device, inode, size, mtime in ns) of a regular file: what changes when it is written."""


def file_signature(path: Path) -> FileSignature | None:
    """The signature of the regular file at ``path`` (through symlinks); None when there is
    none (gone, a folder, unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
