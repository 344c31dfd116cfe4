"""A model server's process (:mod:`proxy.models.servers`): its socket file, its log, its
first line, its health, its stop.

llama.cpp leaves its socket file behind and a stale one makes the next bind fail, so the file
is removed before a start and after a stop (only a socket is ever removed).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from protocol.upstream_url import parse_upstream_url
from proxy.models.logs import RotatingLog
from proxy.models.managed import LoadFailed
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, fetch

STOP_TIMEOUT = 10.0  # SIGTERM grace before SIGKILL
LOG_DRAIN = 1.0  # seconds a failed start's reason waits for the rest of its log
HEALTH_POLL = 0.02  # seconds between /health tries while a server loads its model (a
# cold start waits at most this long after the server is ready: S9)


def file_safe(name: str) -> str:
    """A model name as a file name: anything but letters, digits and ``._-`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def socket_file_name(model: str) -> str:
    return f"m-{file_safe(model)}.sock"


def log_path(data_dir: Path, model: str) -> Path:
    """A model server's log file (SPEC §11): ``<data dir>/logs/<name>.log``."""
    return data_dir / "logs" / f"{file_safe(model)}.log"


Ready = Callable[[ConnectionPool, trio.Process], Awaitable[tuple[str | None, str]]]


@attrs.frozen
class Launch:
    """One server's start as its engine plans it (:mod:`proxy.models.bundled`,
    :mod:`proxy.models.command`); :meth:`proxy.models.servers.ModelServers.start` runs every
    plan the same way: its socket file cleared, the process started in a session of its own
    with its output to its log, recorded, waited for with ``ready``, stopped on failure."""

    argv: list[str]
    ready: Ready  # the server's URL once it answers, else None and why (it exited)
    cannot_run: str  # what a spawn's OSError is prefixed with
    env: dict[str, str] | None = None  # None: the gateway's own
    socket_path: Path | None = None  # its socket file: removed before the start, after the stop
    lifeline: bool = False  # stdin a pipe only the gateway holds (proxy.models.guard)
    stdout_logged: bool = False  # stdout and stderr both to the log (else stderr only: the
    # launcher's stdout says where it listens)
    stop_signal: int = signal.SIGTERM
    group: bool = False  # its whole process group is killed once it is gone
    waits_at: str = ""  # where a load waits for it, when known before it starts


def remove_leftover_socket(path: Path) -> None:
    """Remove a socket file left by an earlier server (nothing that is not a socket)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


async def read_line(stream: trio.abc.ReceiveStream, cap: int = 4096) -> str:
    """The first line a process writes (the launcher's ``listening <url>``)."""
    data = b""
    while b"\n" not in data and len(data) < cap:
        chunk = await stream.receive_some(cap)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "replace")


async def pump(stream: trio.abc.ReceiveStream, logfile: RotatingLog) -> None:
    """Copy a process's output into its log until it closes."""
    while chunk := await stream.receive_some(65536):
        logfile.write(chunk)


async def log_until_closed(stream: trio.abc.ReceiveStream, logfile: RotatingLog,
                           done: trio.Event) -> None:
    """A server's output into its log until the server exits; then the log is closed."""
    try:
        await pump(stream, logfile)
    finally:
        logfile.close()
        done.set()


async def stop_process(proc: trio.Process, sig: int = signal.SIGTERM, *,
                       group: bool = False) -> None:
    """``sig`` (SIGTERM), then SIGKILL after STOP_TIMEOUT; always reaps the child.
    ``group``: the process leads a session of its own (a user's command, which may have
    started workers of its own): once it is gone, whatever is left of its group is killed
    too, so nothing it started holds on to a port or memory."""
    if proc.returncode is None:
        proc.send_signal(sig)
        with trio.move_on_after(STOP_TIMEOUT):
            await proc.wait()
        if proc.returncode is None:
            if group:
                _kill_group(proc.pid)
            else:
                proc.kill()
            await proc.wait()
    if group:
        _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left of it


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS), 0 when it cannot be read (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


async def until_healthy(connections: ConnectionPool, proc: trio.Process
                        ) -> tuple[str | None, str]:
    """The launcher's server URL once it listens and its /health answers 200 (llama.cpp
    answers 503 while it loads); else None and why: it exited before that."""
    assert proc.stdout is not None
    line = await read_line(proc.stdout)
    if not line.startswith("listening "):
        await proc.wait()
        return None, f"exited with status {proc.returncode} before listening"
    url = line[len("listening "):].strip()
    return await until_answers(connections, proc, url, "/health")


async def until_answers(connections: ConnectionPool, proc: trio.Process, url: str,
                        path: str) -> tuple[str | None, str]:
    """``url`` once GET ``path`` there answers 200 (a server answers 503, or refuses the
    connection, while it loads); else None and why: the process exited first. The caller
    bounds the wait (timeouts.model_load)."""
    address = parse_upstream_url(url)
    target = path.encode()
    while proc.poll() is None:
        try:
            status, _ = await fetch(connections, address, target)
            if status == 200:
                return url, ""
        except UpstreamFailure:
            pass
        await trio.sleep(HEALTH_POLL)
    return None, f"exited with status {proc.returncode} while loading"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick; a server told to listen there
    gets it unless another process takes it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def await_ready(proc: trio.Process, ready: Awaitable[tuple[str | None, str]],
                      logfile: RotatingLog, logged: trio.Event, *,
                      socket_path: Path | None = None, stop_signal: int = signal.SIGTERM,
                      group: bool = False) -> str:
    """The URL ``ready`` gives once the server answers; else the process is stopped and
    LoadFailed says why with its last log line (waiting up to LOG_DRAIN for its log to
    close). Cancelled (timeouts.model_load), the process is stopped before the cancel goes
    on."""
    try:
        url, why = await ready
    except BaseException:
        with trio.CancelScope(shield=True):
            await stop_process(proc, stop_signal, group=group)
        if socket_path is not None:
            remove_leftover_socket(socket_path)
        raise
    if url is None:
        await stop_process(proc, stop_signal, group=group)
        with trio.move_on_after(LOG_DRAIN):  # its last words, for the reason
            await logged.wait()
        last = logfile.tail(1).strip()
        raise LoadFailed(f"its server {why}" + (f": {last}" if last else ""))
    return url


class ServerProcess:
    """A running model server (the lifecycle's Server): the bundled llama.cpp's launcher,
    or a user's command (SPEC §11.1: its ``stop_signal``, and its whole process ``group``
    killed once it is gone)."""

    def __init__(self, proc: trio.Process, url: str, socket_path: Path | None, *,
                 stop_signal: int = signal.SIGTERM, group: bool = False,
                 gone: Callable[[], Awaitable[None]] | None = None) -> None:
        self.proc = proc
        self.pid: int | None = proc.pid
        self.url = url
        self._socket_path = socket_path
        self._stop_signal = stop_signal
        self._group = group
        self._gone = gone  # told once it has been reaped (its record in state.json goes)

    def __repr__(self) -> str:
        return f"ServerProcess(pid={self.pid}, {self.url})"

    def memory(self) -> int:
        return rss_bytes(self.proc.pid)

    async def wait(self) -> None:
        await self.proc.wait()
        await self._reaped()

    async def stop(self) -> None:
        with trio.CancelScope(shield=True):
            await stop_process(self.proc, self._stop_signal, group=self._group)
            await self._reaped()
        if self._socket_path is not None:
            remove_leftover_socket(self._socket_path)

    async def _reaped(self) -> None:
        await reaped(self.proc, self._gone, group=self._group)
        self._gone = None


async def reaped(proc: trio.Process, gone: Callable[[], Awaitable[None]] | None, *,
                 group: bool = False) -> None:
    """A server's process has been reaped (it exited, or was stopped): what is left of its
    ``group`` killed (a user's command's guard among them: :mod:`proxy.models.guard`), then
    its lifeline closed, so the guard never takes it for the gateway's end; ``gone`` told."""
    if group:
        _kill_group(proc.pid)
    if proc.stdin is not None:
        with trio.CancelScope(shield=True):
            await proc.stdin.aclose()
    if gone is not None:
        with trio.CancelScope(shield=True):
            await gone()
