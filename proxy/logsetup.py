"""How ``sluice serve`` logs: one line per record on stderr,
``2026-12-01 12:00:00,123 INFO sluice.access: ...``, cheaply enough for one access-log line
per request (SPEC §9.1).

A write to stderr per line would be the dearest part of a small request (a system call,
tens of µs where stderr is a file), so lines are buffered: a WARNING or worse is written at
once, with whatever came before it; the rest at most :data:`FLUSH_EVERY` seconds later (by
the next record, or by :func:`flush_periodically`, which the gateway runs), and at exit.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import trio

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FLUSH_EVERY = 0.2  # seconds an INFO line may wait in the buffer
BUFFER_SIZE = 64 * 1024  # bytes buffered before a write, whatever the time


class _Formatter(logging.Formatter):
    """The standard format, with the timestamp's date and time made once a second."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int(record.msecs):03d}"


class BufferedStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr through a buffer of its own (see the module docstring)."""

    def __init__(self, fd: int | None = None) -> None:
        target = sys.stderr.fileno() if fd is None else fd
        stream = open(target, "w", buffering=BUFFER_SIZE, encoding="utf-8",  # noqa: SIM115
                      errors="backslashreplace", closefd=False)
        super().__init__(stream)
        self._written_at = time.monotonic()

    def __repr__(self) -> str:
        return f"BufferedStderr(fd={self.stream.fileno()})"

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)  # calls flush(), which writes only when it is time
        if record.levelno >= logging.WARNING:
            self.write_out()

    def flush(self) -> None:
        if time.monotonic() - self._written_at >= FLUSH_EVERY:
            self.write_out()

    def write_out(self) -> None:
        """Write what is buffered now."""
        self.acquire()
        try:
            self._written_at = time.monotonic()
            if not self.stream.closed:
                self.stream.flush()
        finally:
            self.release()

    def write_line(self, line: str) -> None:
        """A line made elsewhere in this log's format (the access log's fast path)."""
        self.acquire()
        try:
            self.stream.write(line)
        finally:
            self.release()
        self.flush()

    def close(self) -> None:
        self.write_out()
        super().close()


def configure(level: str) -> None:
    """Log to stderr at ``level``. The format names no source line, thread or process, so
    what finding them costs on every record is skipped (the logging HOWTO's
    "Optimization")."""
    handler = BufferedStderr()
    handler.setFormatter(_Formatter())
    logging.basicConfig(level=level, handlers=[handler])
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # A client's malformed upload (SPEC §17.2) is its 400, not a warning of ours.
    logging.getLogger("python_multipart").setLevel(logging.ERROR)


def line_sink() -> Callable[[str], None] | None:
    """Where finished lines go when :func:`configure` set up the log, else None."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, BufferedStderr):
            return handler.write_line
    return None


def write_out() -> None:
    """Write every buffered line now."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, BufferedStderr):
            handler.write_out()


async def flush_periodically() -> None:
    """Run by the gateway: no buffered line waits longer than FLUSH_EVERY."""
    try:
        while True:
            await trio.sleep(FLUSH_EVERY)
            write_out()
    finally:
        write_out()


__all__ = ["FLUSH_EVERY", "BufferedStderr", "configure", "flush_periodically", "line_sink",
           "write_out"]
