"""The gateway's managed models on demand (SPEC §11): the catalogue made into a
:class:`~proxy.models.lifecycle.Lifecycle` of real llama.cpp servers, and what the rest of
the gateway sees of it.

Each managed model is a local backend of the registry that is live only while its server is
loaded (``server_up`` / ``server_down``, told by the lifecycle's changes), so the router
finds a loaded model as it finds any backend; an exchange first :meth:`acquire`s a managed
model, which loads it if need be. Each state change is a ``model`` event (§9.3) carrying the
model's entry (:meth:`entry`, also ``GET /api/v1/inference/status``'s ``managedModels``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from protocol.catalogue import Entry
from protocol.config import BackendConfig, Config, ModelConfig
from protocol.model_room import memory_budget_bytes
from protocol.model_state import ModelState
from protocol.request_record import iso_utc
from proxy.models.lifecycle import Lifecycle, Managed, ModelSpec
from proxy.models.process import file_safe
from proxy.models.scan import build
from proxy.models.servers import LlamaServers, read_estimate
from proxy.observe.hub import Hub
from proxy.pool.backends import BackendRegistry, LocalBackend
from proxy.upstream_pool import ConnectionPool

log = logging.getLogger("sluice.models")


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover (not Linux or macOS)
        return 8 << 30


Prepared = list[tuple[ModelSpec, Entry]]


def prepare(models: Sequence[ModelConfig], cfg: Config, data_dir: Path) -> Prepared:
    """The catalogue's models as specs: a config entry's settings, else the defaults; each
    with why its file cannot be used, if it cannot (blocking: the folder scan and the GGUF
    headers; run it in a worker thread)."""
    entries, skipped = build(data_dir, models, cfg.model_loading.dirs)
    for item in skipped:
        log.warning("model file %s left out: %s", item.path, item.reason)
    by_name = {m.name: m for m in models}
    out = []
    for entry in entries:
        model = by_name.get(entry.name) or ModelConfig(name=entry.name, path=entry.path)
        keep_alive = cfg.model_loading.keep_alive if model.keep_alive is None \
            else model.keep_alive
        estimate, problem = read_estimate(entry.path, model.context)
        if entry.missing:
            problem = f"parts {', '.join(map(str, entry.missing))} of {entry.parts} are missing"
        out.append((ModelSpec(name=entry.name, path=entry.path, estimate=estimate,
                              keep_alive=keep_alive, context=model.context,
                              parallel=model.parallel, threads=model.threads,
                              preload=model.preload, problem=problem), entry))
    return out


class OnDemand:
    """The managed models of one gateway (``prepared`` by :func:`prepare`)."""

    def __init__(self, prepared: Prepared, cfg: Config, data_dir: Path,
                 socket_dir: Path | None, registry: BackendRegistry,
                 connections: ConnectionPool, hub: Hub | None = None, *,
                 load_timeout: Callable[[], float] | None = None) -> None:
        self.entries = {entry.name: entry for _, entry in prepared}
        self.registry = registry
        self.hub = hub
        self.data_dir = data_dir
        self.servers = LlamaServers(data_dir, socket_dir, connections)
        self.lifecycle = Lifecycle(
            [spec for spec, _ in prepared], self.servers,
            budget=memory_budget_bytes(cfg.model_loading.memory_budget, physical_memory()),
            max_loaded=cfg.model_loading.max_loaded,
            load_timeout=load_timeout or (lambda: cfg.timeouts.model_load),
            on_change=self._changed)
        self.backends: dict[str, LocalBackend] = {}
        for spec, _ in prepared:
            backend = LocalBackend(BackendConfig(name=spec.name, url="", kind="llm"), None,
                                   pinned_model=spec.name)
            self.backends[spec.name] = backend
            registry.add(backend)

    def __repr__(self) -> str:
        return f"OnDemand({self.lifecycle!r})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.servers.run)
            await nursery.start(self.lifecycle.run)
            task_status.started()

    def holds(self, model: str) -> bool:
        return model in self.lifecycle.models

    def take(self, model: str) -> Managed | None:
        return self.lifecycle.take(model)

    async def acquire(self, model: str) -> Managed:
        return await self.lifecycle.acquire(model)

    def release(self, model: Managed) -> None:
        self.lifecycle.release(model)

    def _changed(self, model: Managed) -> None:
        backend = self.backends[model.name]
        if model.state is ModelState.LOADED and model.server is not None:
            self.registry.server_up(backend, model.server.url,
                                    [{"id": model.name, "object": "model",
                                      "owned_by": "llamacpp"}])
        elif backend.live:
            self.registry.server_down(backend, model.failure)
        if self.hub is not None:
            self.hub.publish("model", self.event(model))

    def entry(self, model: Managed) -> dict[str, Any]:
        """The model as ``GET /api/v1/models/local`` lists it (SPEC §11)."""
        entry = self.entries[model.name]
        spec = model.spec
        server = model.server
        now = trio.current_time()
        unloads = model.unloads_at()
        return {
            "name": model.name, "path": spec.path, "source": entry.source,
            "state": model.state.value,
            "keepAlive": None if math.isinf(spec.keep_alive) else spec.keep_alive,
            "preload": spec.preload,
            "loadedAt": _wall(model.loaded_at, now),
            "lastUsedAt": _wall(model.last_used, now),
            "unloadsAt": _wall(unloads, now),
            "estimatedBytes": spec.estimate, "memoryBytes": model.memory,
            "activeRequests": model.in_flight,
            "pid": server.pid if server is not None else None,
            "address": server.url if server is not None else None,
            "transport": None if server is None else
            ("unix" if server.url.startswith("unix:") else "tcp"),
            "restarts": model.restarts, "lastError": model.failure,
            "log": os.fspath(self.data_dir / "logs" / f"{file_safe(model.name)}.log"),
        }

    def event(self, model: Managed) -> dict[str, Any]:
        """The ``model`` event of a change: the entry, ``source: "managed"`` as every managed
        server's event says (a backend's says ``backend``), the entry's own source (config
        or folder) as ``origin``."""
        entry = self.entry(model)
        return {**entry, "source": "managed", "origin": entry["source"]}

    def listed(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``/v1/models``' local entries with every managed model in it, loaded or not, each
        with ``"sluice": {"state": S}`` (SPEC §11)."""
        models = self.lifecycle.models
        out = []
        for entry in entries:
            model = models.get(entry.get("id", ""))
            out.append(entry if model is None else
                       {**entry, "sluice": {"state": model.state.value}})
        shown = {entry.get("id") for entry in entries}
        out += [{"id": name, "object": "model", "created": 0, "owned_by": "llamacpp",
                 "sluice": {"state": model.state.value}}
                for name, model in models.items() if name not in shown]
        return out

    def status(self) -> list[dict[str, Any]]:
        return [self.entry(m) for m in self.lifecycle.models.values()]


def _wall(at: float | None, now: float) -> str | None:
    """A trio clock time as the wall clock's ISO 8601 (None for never)."""
    if at is None or math.isinf(at):
        return None
    return iso_utc(time.time() + (at - now))
