"""A model server of the user's own (SPEC §11.1): ``models[].command`` run as a child process
with its placeholders filled in, under the same lifecycle as the bundled llama.cpp.

The command is never run through a shell. ``${PORT}`` is a loopback port picked here,
``${SOCKET}`` a socket path in the socket dir; sluice reaches the server over the socket if
the command names it, else over the port. The server is ready once GET ``health`` answers
200 there (vLLM answers 503 or refuses connections while it loads). Its stdout and stderr go
to ``<data dir>/logs/<name>.log``. It runs in a session of its own: ``stop_signal`` goes to
the command's own process (the entry's pid), SIGKILL after 10 s, and once it is gone
whatever is left of its process group is killed too (workers it started). It is started
through :mod:`proxy.models.guard`, which stops it should the gateway die without doing so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from protocol.model_command import expand, uses
from proxy.models.logs import RotatingLog
from proxy.models.managed import LoadFailed, ModelSpec
from proxy.models.process import (
    ServerProcess,
    await_ready,
    file_safe,
    free_port,
    log_until_closed,
    reaped,
    remove_leftover_socket,
    until_answers,
)
from proxy.upstream.pool import ConnectionPool

GUARD = os.fspath(Path(__file__).with_name("guard.py"))  # run by path: stdlib only

Gone = Callable[[], Awaitable[None]]


def find_program(name: str, env: dict[str, str]) -> str | None:
    """The executable a command's first argument names: a path (absolute, or relative to
    the working directory) as it is, a bare name looked up on the command's PATH."""
    return shutil.which(name, path=env.get("PATH", os.defpath))


def where_to_listen(spec: ModelSpec, socket_path: Path | None) -> tuple[dict[str, str], str]:
    """The placeholders' values and the URL sluice reaches the server at."""
    values = {"NAME": spec.name, "MODEL": spec.path}
    url = ""
    if uses(spec.command, "SOCKET"):
        if socket_path is None:
            raise LoadFailed(f"{spec.field or spec.name}.command names ${{SOCKET}}, but this "
                             "gateway has no socket folder short enough for it (use ${PORT})")
        values["SOCKET"] = os.fspath(socket_path)
        url = f"unix:{socket_path}"
    port = free_port()
    values["PORT"] = str(port)
    return values, url or f"http://127.0.0.1:{port}"


async def start_command(spec: ModelSpec, *, data_dir: Path, socket_path: Path | None,
                        connections: ConnectionPool, pumps: trio.Nursery,
                        waiting: Callable[[str], None] = lambda url: None,
                        spawned: Callable[[trio.Process], Awaitable[Gone | None]]
                        ) -> ServerProcess:
    """Start ``spec``'s command and wait until its health path answers 200 (the caller
    bounds the wait with timeouts.model_load; cancelled, the process is stopped). Raises
    LoadFailed: the program is not found, or the process exited first (with its last log
    line)."""
    values, url = where_to_listen(spec, socket_path)
    waiting(url)
    argv = expand(spec.command, values)
    env = {**os.environ, **dict(spec.env)}
    program = find_program(argv[0], env)
    if program is None:
        raise LoadFailed(f"{spec.field or spec.name}.command: {argv[0]!r} was not found (no "
                         "such executable file" + ("" if os.sep in argv[0] else " on PATH")
                         + ")")
    if socket_path is not None and "SOCKET" in values:
        remove_leftover_socket(socket_path)
    logfile = RotatingLog(data_dir / "logs" / f"{file_safe(spec.name)}.log")
    try:
        # Through the guard, which execs the program in its own place and stops it should
        # this gateway die without doing so; its stdin is the lifeline, held only here.
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", GUARD, spec.stop_signal, program, *argv[1:]],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        logfile.close()
        raise LoadFailed(f"{spec.field or spec.name}.command: cannot run {argv[0]!r}: "
                         f"{exc.strerror or exc}") from None
    assert proc.stdout is not None
    logged = trio.Event()
    pumps.start_soon(log_until_closed, proc.stdout, logfile, logged)
    stop_signal = signal.Signals[spec.stop_signal]
    ours = socket_path if "SOCKET" in values else None  # its socket file, removed at a stop
    gone = await spawned(proc)
    try:
        await await_ready(proc, until_answers(connections, proc, url, spec.health), logfile,
                          logged, socket_path=ours, stop_signal=stop_signal, group=True)
    except BaseException:
        await reaped(proc, gone)
        raise
    return ServerProcess(proc, url, ours, stop_signal=stop_signal, group=True, gone=gone)

