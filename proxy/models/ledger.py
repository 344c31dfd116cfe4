"""The model servers a gateway runs, as state.json records them (SPEC §11), and those a
previous gateway of the same data dir left behind when it died without stopping them (kill -9,
the OOM killer, a crash).

Each server is recorded with its pid and its process's start time as the system tells it
(``/proc/<pid>/stat``'s starttime; ``ps -o lstart`` elsewhere), so a pid that another
process has taken since is never taken for the server: a leftover is signalled only while
its pid still names a process that started when the recorded one did. A leftover is stopped
as the gateway stops its own (its stop signal, SIGKILL after the grace, then whatever is left
of its process group), before this gateway starts a model server of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable

import trio

from proxy.datadir import ServerRecord

log = logging.getLogger("sluice.models")

STOP_TIMEOUT = 10.0  # a leftover's grace before SIGKILL (as proxy.models.process's)
POLL = 0.05  # seconds between two looks at whether a leftover is gone
HAS_PROC = os.path.isfile("/proc/self/stat")  # Linux; elsewhere ps(1) tells


def start_time(pid: int) -> str | None:
    """When process ``pid`` started, as the system tells it; None when there is no such
    process (or only its zombie). Blocking off Linux (``ps``): run it in a worker thread."""
    if HAS_PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b") ", 1)[1].split()
        except (OSError, IndexError):
            return None
        return None if fields[0] == b"Z" else fields[19].decode()
    try:
        out = subprocess.run(["ps", "-o", "stat=", "-o", "lstart=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    state, _, started = out.strip().partition(" ")
    return None if not started or state.startswith("Z") else " ".join(started.split())


class Ledger:
    """The servers this gateway runs, written to state.json through ``write`` (in a worker
    thread, one write at a time), and the ones ``left_behind`` by a previous gateway:
    :meth:`run` stops those, then sets :attr:`clear`, which a start waits for."""

    def __init__(self, write: Callable[[tuple[ServerRecord, ...]], None],
                 left_behind: tuple[ServerRecord, ...] = ()) -> None:
        self._write = write
        self.left_behind = left_behind
        self.clear = trio.Event()
        self._running: dict[int, ServerRecord] = {}
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        return f"Ledger(running={sorted(self._running)}, left_behind={len(self.left_behind)})"

    async def run(self) -> None:
        """Stop what a previous gateway left behind, one after the other; then clear."""
        try:
            for record in self.left_behind:
                await stop_leftover(record)
        finally:
            self.clear.set()

    async def add(self, name: str, pid: int, stop_signal: str = "SIGTERM") -> None:
        """A server just started: recorded with its start time."""
        started = await trio.to_thread.run_sync(start_time, pid)
        if started is not None:
            await self._save(lambda: self._running.__setitem__(
                pid, ServerRecord(name, pid, started, stop_signal)))

    async def remove(self, pid: int) -> None:
        """A server is gone (reaped)."""
        if pid in self._running:
            await self._save(lambda: self._running.pop(pid, None))

    async def _save(self, change: Callable[[], object]) -> None:
        with trio.CancelScope(shield=True):
            async with self._lock:
                change()
                records = tuple(self._running.values())
                try:
                    await trio.to_thread.run_sync(self._write, records)
                except OSError as exc:
                    log.warning("cannot record the model servers in state.json: %s", exc)


async def stop_leftover(record: ServerRecord) -> bool:
    """Stop a server a previous gateway left, if its pid still names it (same start time);
    whether it did."""
    pid = record.pid
    if await trio.to_thread.run_sync(start_time, pid) != record.start_time:
        return False  # gone, or another process has its pid now: left alone
    try:
        leads_group = os.getpgid(pid) == pid
        os.kill(pid, signal.Signals[record.stop_signal]
                if record.stop_signal in signal.Signals.__members__ else signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    log.warning("stopping model server %s (pid %d), left running by a gateway that ended "
                "without stopping it", record.name or "?", pid)
    with trio.move_on_after(STOP_TIMEOUT):
        await until_gone(record)  # not our child: no exit to wait for, only to look at
    try:
        if await trio.to_thread.run_sync(start_time, pid) == record.start_time:
            os.kill(pid, signal.SIGKILL)
        if leads_group:  # its workers (a pgid is not reused while its group lives)
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return True


async def until_gone(record: ServerRecord) -> None:
    """Until ``record``'s process is gone (looked at every POLL seconds)."""
    while True:
        if await trio.to_thread.run_sync(start_time, record.pid) != record.start_time:
            return
        await trio.sleep(POLL)
