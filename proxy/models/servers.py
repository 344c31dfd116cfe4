"""Real model servers for models on demand (:mod:`proxy.models.lifecycle`): the bundled
llama.cpp in a child process (:mod:`proxy.models.launcher`), or the user's own command
(:mod:`proxy.models.command`, SPEC §11.1), started on a request's need and stopped when the
lifecycle says so; and a model's memory estimate from its GGUF file.

A start is over when the server's ``/health`` answers 200 (llama.cpp answers 503 while it
loads). A server that exits first, or a file that is missing or not a usable GGUF, is a
:class:`~proxy.models.lifecycle.LoadFailed` whose message is the reason: the last line of the
server's log, never a secret. The caller bounds a start with timeouts.model_load; cancelled,
the process is stopped (SIGTERM, then SIGKILL) before the cancel goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio

from proxy.listeners import MAX_SOCKET_PATH
from proxy.models.command import Gone, start_command
from proxy.models.gguf_file import read_estimate
from proxy.models.ledger import Ledger
from proxy.models.logs import RotatingLog, tail_of
from proxy.models.managed import LoadFailed, ModelSpec
from proxy.models.process import (
    ServerProcess,
    await_ready,
    file_safe,
    log_until_closed,
    reaped,
    remove_leftover_socket,
    socket_file_name,
    until_healthy,
)
from proxy.tasks import TaskHolder
from proxy.upstream.pool import ConnectionPool


class ModelServers:
    """Starts model servers (the bundled llama.cpp, or a command); their log pumps run in
    :meth:`run`'s nursery."""

    def __init__(self, data_dir: Path, socket_dir: Path | None,
                 connections: ConnectionPool, ledger: Ledger | None = None) -> None:
        self.data_dir = data_dir
        self.socket_dir = socket_dir
        self.connections = connections
        self.ledger = ledger  # state.json's record of our servers (none in some tests)
        self._pumps = TaskHolder()  # the log pumps' nursery, while run() runs
        self._waited: dict[str, str] = {}  # a command model's health URL, for a timeout

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        await self._pumps.run(task_status=task_status)

    def _socket_path(self, name: str) -> Path | None:
        if self.socket_dir is None:
            return None
        path = self.socket_dir / socket_file_name(name)
        return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None

    def last_line(self, spec: ModelSpec) -> str:
        """The last line of a model server's log (for a load that timed out)."""
        return tail_of(self.data_dir / "logs" / f"{file_safe(spec.name)}.log")

    def waited_for(self, spec: ModelSpec) -> str:
        """What a load of ``spec`` waits for: a 200 from its health path."""
        url = self._waited.get(spec.name)
        return "" if url is None else f"GET {spec.health} at {url} to answer 200"

    async def start(self, spec: ModelSpec) -> ServerProcess:
        if self._pumps.nursery is None:
            raise LoadFailed("the gateway is stopping")
        if spec.problem is not None:  # found when the catalogue was made
            raise LoadFailed(spec.problem)
        if self.ledger is not None:  # what a previous gateway left is stopped first
            await self.ledger.clear.wait()
        if spec.command:
            return await start_command(
                spec, data_dir=self.data_dir, socket_path=self._socket_path(spec.name),
                connections=self.connections, pumps=self._pumps.nursery,
                waiting=lambda url: self._waited.__setitem__(spec.name, url),
                spawned=partial(self._spawned, spec))
        _, problem = await trio.to_thread.run_sync(read_estimate, spec.path, spec.context)
        if problem is not None:
            raise LoadFailed(problem)
        socket_path = self._socket_path(spec.name)
        if socket_path is not None:
            remove_leftover_socket(socket_path)
        listen = os.fspath(socket_path) if socket_path is not None else "127.0.0.1:0"
        logfile = RotatingLog(self.data_dir / "logs" / f"{file_safe(spec.name)}.log")
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "proxy.models.launcher", "--model", spec.path,
             "--alias", spec.name, "--listen", listen, "--context", str(spec.context),
             "--parallel", str(spec.parallel), "--threads", str(spec.threads),
             *spec.llama_args, "--parent", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        assert proc.stderr is not None
        logged = trio.Event()
        self._pumps.nursery.start_soon(log_until_closed, proc.stderr, logfile, logged)
        gone = await self._spawned(spec, proc)
        try:
            url = await await_ready(proc, until_healthy(self.connections, proc), logfile,
                                    logged, socket_path=socket_path)
        except BaseException:
            await reaped(proc, gone)
            raise
        return ServerProcess(proc, url, socket_path, gone=gone)

    async def _spawned(self, spec: ModelSpec, proc: trio.Process) -> Gone | None:
        """A server's process was just started: recorded in state.json until it is gone."""
        if self.ledger is None:
            return None
        await self.ledger.add(spec.name, proc.pid, spec.stop_signal)
        return partial(self.ledger.remove, proc.pid)

