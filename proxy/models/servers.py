"""Real model servers for models on demand (:mod:`proxy.models.lifecycle`), started on a
request's need and stopped when the lifecycle says so: one start sequence for every engine,
with the engine's own steps plugged in (:mod:`proxy.models.bundled`: the bundled llama.cpp
through the launcher; :mod:`proxy.models.command`: the user's own command, SPEC §11.1), each
giving a :class:`~proxy.models.process.Launch`.

A start is over when the server's health path answers 200 (llama.cpp answers 503 while it
loads). A server that exits first, or a file that is missing or not a usable GGUF, is a
:class:`~proxy.models.lifecycle.LoadFailed` whose message is the reason: the last line of the
server's log, never a secret. The caller bounds a start with timeouts.model_load; cancelled,
the process is stopped (its stop signal, then SIGKILL) before the cancel goes on.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from protocol.model_spec import Bundled, Command, ModelSpec
from proxy.listeners import MAX_SOCKET_PATH
from proxy.models.bundled import plan_bundled
from proxy.models.command import plan_command
from proxy.models.ledger import Ledger
from proxy.models.logs import RotatingLog, tail_of
from proxy.models.managed import LoadFailed
from proxy.models.process import (
    Launch,
    ServerProcess,
    await_ready,
    log_path,
    log_until_closed,
    reaped,
    remove_leftover_socket,
    socket_file_name,
)
from proxy.tasks import TaskHolder
from proxy.upstream.pool import ConnectionPool

Gone = Callable[[], Awaitable[None]]


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
        self._waited: dict[str, str] = {}  # where a model's load waits, for a timeout

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
        return tail_of(log_path(self.data_dir, spec.name))

    def waited_for(self, spec: ModelSpec) -> str:
        """What a load of ``spec`` waits for: a 200 from its health path."""
        url = self._waited.get(spec.name)
        return "" if url is None else f"GET {spec.engine.health} at {url} to answer 200"

    async def _plan(self, spec: ModelSpec) -> Launch:
        """The engine's own steps: how this start goes."""
        socket_path = self._socket_path(spec.name)
        match spec.engine:
            case Command() as command:
                return plan_command(spec, command, socket_path)
            case Bundled() as bundled:
                return await plan_bundled(spec, bundled, socket_path)

    async def start(self, spec: ModelSpec) -> ServerProcess:
        """Start ``spec``'s server; once it answers, the running server (else LoadFailed)."""
        if self._pumps.nursery is None:
            raise LoadFailed("the gateway is stopping")
        if spec.problem is not None:  # found when the catalogue was made
            raise LoadFailed(spec.problem)
        if self.ledger is not None:  # what a previous gateway left is stopped first
            await self.ledger.clear.wait()
        launch = await self._plan(spec)
        if launch.waits_at:
            self._waited[spec.name] = launch.waits_at
        if launch.socket_path is not None:
            remove_leftover_socket(launch.socket_path)
        logfile = RotatingLog(log_path(self.data_dir, spec.name))
        try:
            proc = await trio.lowlevel.open_process(
                launch.argv, env=launch.env,
                stdin=subprocess.PIPE if launch.lifeline else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if launch.stdout_logged else subprocess.PIPE,
                start_new_session=True)
        except OSError as exc:
            logfile.close()
            raise LoadFailed(f"{launch.cannot_run}: {exc.strerror or exc}") from None
        output = proc.stdout if launch.stdout_logged else proc.stderr
        assert output is not None
        logged = trio.Event()
        self._pumps.nursery.start_soon(log_until_closed, output, logfile, logged)
        gone = await self._spawned(spec, proc)
        try:
            url = await await_ready(proc, launch.ready(self.connections, proc), logfile,
                                    logged, socket_path=launch.socket_path,
                                    stop_signal=launch.stop_signal, group=launch.group)
        except BaseException:
            await reaped(proc, gone, group=launch.group)
            raise
        return ServerProcess(proc, url, launch.socket_path, stop_signal=launch.stop_signal,
                             group=launch.group, gone=gone)

    async def _spawned(self, spec: ModelSpec, proc: trio.Process) -> Gone | None:
        """A server's process was just started: recorded in state.json until it is gone."""
        if self.ledger is None:
            return None
        await self.ledger.add(spec.name, proc.pid, spec.engine.stop_signal)
        return partial(self.ledger.remove, proc.pid)
