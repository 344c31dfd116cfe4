"""A size-rotated log file for a managed model server's stderr."""

from __future__ import annotations

import os
from pathlib import Path

MAX_LOG_BYTES = 5 * 1024 * 1024  # a log file is rotated past this size
KEEP_LOGS = 3  # rotated files kept: name.log.1 .. name.log.3


class RotatingLog:
    def __init__(self, path: Path, *, max_bytes: int = MAX_LOG_BYTES, keep: int = KEEP_LOGS):
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def __repr__(self) -> str:
        return f"RotatingLog({self.path}, size={self._size})"

    def write(self, data: bytes | bytearray) -> None:
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        os.write(self._fd, data)
        self._size += len(data)

    def _rotate(self) -> None:
        os.close(self._fd)
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0

    def tail(self, lines: int = 5) -> str:
        """The last lines written (for error messages)."""
        return tail_of(self.path, lines)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def tail_of(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of a log file (of its last 4 KiB; "" when there are none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(line.strip() for line in text.strip().splitlines()[-lines:])
