"""Starts, watches, restarts and stops the managed llama.cpp servers (``models:``).

Each model runs as a child process (:mod:`proxy.models.launcher`) listening on
``<socket dir>/m-<name>.sock`` — or on a loopback TCP port when that path would be too long or
no socket folder works. Once its ``/health`` answers it becomes a local backend serving exactly
its configured model id; when it dies the model is unavailable until the restart (exponential
back-off) has it healthy again. On shutdown: SIGTERM, then SIGKILL after a deadline.

Each change of a server's status entry (:meth:`ManagedModel.status`: starting with its pid,
running, back-off, stopped) is a ``model`` event on the hub (SPEC §9.3), that entry with
``source: "managed"``; the backend it serves through reports its own (``source: "backend"``,
:mod:`proxy.observe.state_events`).
"""

from __future__ import annotations

import enum
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from protocol.config import BackendConfig, ModelConfig
from proxy.listeners import MAX_SOCKET_PATH
from proxy.models.logs import RotatingLog
from proxy.models.process import (
    file_safe,
    pump,
    remove_leftover_socket,
    socket_file_name,
    stop_process,
    until_healthy,
)
from proxy.observe.hub import Hub
from proxy.pool.backends import BackendRegistry, LocalBackend
from proxy.upstream_pool import ConnectionPool

log = logging.getLogger("sluice.models")

START_TIMEOUT = 120.0  # a server must load its model and answer /health within this
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
STABLE_AFTER = 60.0  # a server that ran this long restarts with the first back-off again


class ModelState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"  # died; waiting to restart
    STOPPED = "stopped"


def next_backoff(previous: float | None, ran_for: float) -> float:
    """Seconds to wait before the next start: doubling, capped, reset after a stable run."""
    if previous is None or ran_for >= STABLE_AFTER:
        return BACKOFF_FIRST
    return min(previous * 2, BACKOFF_MAX)


class ManagedModel:
    def __init__(self, cfg: ModelConfig, data_dir: Path, socket_dir: Path | None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        model_path = Path(cfg.path)
        self.model_path = model_path if model_path.is_absolute() else data_dir / model_path
        self.log_path = data_dir / "logs" / f"{file_safe(cfg.name)}.log"
        self.socket_path: Path | None = None
        if socket_dir is not None:
            candidate = socket_dir / socket_file_name(cfg.name)
            if len(os.fsencode(candidate)) <= MAX_SOCKET_PATH:
                self.socket_path = candidate
        self.state = ModelState.STOPPED
        self.pid: int | None = None
        self.url: str | None = None
        self.restarts = 0
        self.last_error: str | None = None
        self.backend = LocalBackend(BackendConfig(name=cfg.name, url="", kind="llm"), None,
                                    pinned_model=cfg.name)

    def __repr__(self) -> str:
        return (f"ManagedModel({self.name!r}, {self.state.value}, pid={self.pid}, "
                f"url={self.url}, restarts={self.restarts})")

    @property
    def listen_arg(self) -> str:
        return os.fspath(self.socket_path) if self.socket_path else "127.0.0.1:0"

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "pid": self.pid,
            "address": self.url,
            "transport": None if self.url is None else
            ("unix" if self.url.startswith("unix:") else "tcp"),
            "restarts": self.restarts,
            "lastError": self.last_error,
            "log": os.fspath(self.log_path),
        }

    def command(self) -> list[str]:
        cfg = self.cfg
        return [sys.executable, "-m", "proxy.models.launcher",
                "--model", os.fspath(self.model_path), "--alias", cfg.name,
                "--listen", self.listen_arg, "--context", str(cfg.context),
                "--parallel", str(cfg.parallel), "--threads", str(cfg.threads),
                "--parent", str(os.getpid())]


class Supervisor:
    def __init__(self, models: Sequence[ModelConfig], data_dir: Path, socket_dir: Path | None,
                 registry: BackendRegistry, connections: ConnectionPool,
                 hub: Hub | None = None) -> None:
        self.models = [ManagedModel(cfg, data_dir, socket_dir) for cfg in models]
        self.registry = registry
        self.connections = connections
        self.hub = hub
        self._published: dict[str, dict[str, Any]] = {}  # name -> the last model event
        for model in self.models:
            registry.starting.add(model.name)
            registry.add(model.backend)

    def __repr__(self) -> str:
        return f"Supervisor({self.models!r})"

    def status(self) -> list[dict[str, Any]]:
        return [m.status() for m in self.models]

    def _report(self, model: ManagedModel) -> None:
        """Publish the server's status entry if it changed."""
        entry = {"source": "managed", **model.status()}
        if self.hub is not None and self._published.get(model.name) != entry:
            self._published[model.name] = entry
            self.hub.publish("model", entry)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for model in self.models:
                nursery.start_soon(self._supervise, model)

    async def _supervise(self, model: ManagedModel) -> None:
        backoff: float | None = None
        try:
            while True:
                started = trio.current_time()
                await self._run_once(model)
                self._first_start_over(model)
                backoff = next_backoff(backoff, trio.current_time() - started)
                model.state = ModelState.BACKOFF
                self._report(model)
                log.warning("model server %s is down (%s); restarting in %gs", model.name,
                            model.last_error, backoff)
                await trio.sleep(backoff)
                model.restarts += 1
        finally:
            model.state = ModelState.STOPPED
            self._first_start_over(model)
            self._report(model)

    def _first_start_over(self, model: ManagedModel) -> None:
        self.registry.first_start_over(model.name)

    def _set_down(self, model: ManagedModel) -> None:
        model.pid = None
        model.url = None
        self.registry.server_down(model.backend, model.last_error)

    async def _run_once(self, model: ManagedModel) -> None:
        """Start the server, serve until it dies (or we are cancelled, then stop it)."""
        model.state = ModelState.STARTING
        if not model.model_path.is_file():
            model.last_error = f"model file not found: {model.model_path}"
            return
        if model.socket_path is not None:
            remove_leftover_socket(model.socket_path)
        logfile = RotatingLog(model.log_path)
        proc = await trio.lowlevel.open_process(
            model.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        model.pid = proc.pid
        self._report(model)
        try:
            async with trio.open_nursery() as nursery:
                assert proc.stderr is not None
                nursery.start_soon(pump, proc.stderr, logfile)
                with trio.move_on_after(START_TIMEOUT) as starting:
                    url = await self._wait_until_healthy(model, proc)
                if starting.cancelled_caught:
                    url = None
                    model.last_error = f"did not become healthy within {START_TIMEOUT:g}s"
                if url is not None:
                    self._set_running(model, url)
                    await proc.wait()
                    model.last_error = f"exited with status {proc.returncode}"
                else:
                    await stop_process(proc)
                    tail = logfile.tail(3)
                    if tail and model.last_error and model.last_error.startswith("exited"):
                        model.last_error += f": {tail}"
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(proc)
                self._set_down(model)
                logfile.close()
                if model.socket_path is not None:
                    remove_leftover_socket(model.socket_path)

    async def _wait_until_healthy(self, model: ManagedModel,
                                  proc: trio.Process) -> str | None:
        """The server's URL once it listens and /health says ok; None if it exits first."""
        url, why = await until_healthy(self.connections, proc)
        if url is None:
            model.last_error = why
        return url

    def _set_running(self, model: ManagedModel, url: str) -> None:
        model.url = url
        model.state = ModelState.RUNNING
        model.last_error = None
        self._report(model)
        self.registry.server_up(model.backend, url,
                                [{"id": model.name, "object": "model", "owned_by": "llamacpp"}])
        log.info("model server %s running (pid %s) on %s", model.name, model.pid, url)
