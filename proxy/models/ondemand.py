"""The gateway's managed models on demand (SPEC §11), its facade: the catalogue's specs
(:mod:`proxy.models.specs`) made into a :class:`~proxy.models.lifecycle.Lifecycle` of real
servers, and what the rest of the gateway sees of it (the bodies built by the pure views of
:mod:`protocol.views`).

Each managed model is a local backend of the registry that is live only while its server is
loaded (``server_up`` / ``server_down``, told by the lifecycle's changes), so the router
finds a loaded model as it finds any backend; an exchange first :meth:`acquire`s a managed
model, which loads it if need be. Each state change is a ``model`` event (§9.3) carrying the
model's entry (:meth:`entry`, also ``GET /api/v1/inference/status``'s ``managedModels``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from protocol.api_modes import initial_modes
from protocol.config import BackendConfig, Config, ModelConfig
from protocol.model_room import memory_budget_bytes
from protocol.model_spec import Bundled, ModelSpec
from protocol.model_state import ModelState
from protocol.views import listed_models, local_model_entry, model_event
from proxy.models.context import ServedContexts
from proxy.models.ledger import Ledger
from proxy.models.lifecycle import Lifecycle
from proxy.models.managed import Managed
from proxy.models.process import log_path
from proxy.models.servers import ModelServers
from proxy.models.specs import Estimates, Prepared, prepare
from proxy.notifications import Notifications
from proxy.observe.hub import Hub
from proxy.registry.backends import BackendRegistry, LocalBackend
from proxy.timestamps import wall
from proxy.upstream.pool import ConnectionPool

log = logging.getLogger("sluice.models")


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover (not Linux or macOS)
        return 8 << 30


RESCAN_EVERY = 10.0  # seconds between two looks at model_loading.dirs (SPEC §11)
STOP_WAIT = 15.0  # seconds the API's unload waits for the server to go (SIGKILL after 10)


class OnDemand:
    """The managed models of one gateway (``prepared`` by :func:`prepare` from ``models``
    and the config's folders; :meth:`rescan` looks again)."""

    def __init__(self, prepared: Prepared, cfg: Config, data_dir: Path,
                 socket_dir: Path | None, registry: BackendRegistry,
                 connections: ConnectionPool, hub: Hub | None = None, *,
                 load_timeout: Callable[[], float] | None = None,
                 models: Callable[[], Sequence[ModelConfig]] | None = None,
                 config: Callable[[], Config] | None = None,
                 estimates: Estimates | None = None, ledger: Ledger | None = None,
                 notifications: Notifications | None = None) -> None:
        self.entries = {entry.name: entry for _, entry in prepared}
        self.registry = registry
        self.hub = hub
        self.data_dir = data_dir
        self.config = config or (lambda: cfg)
        self.models = models or (lambda: cfg.models)
        self.estimates: Estimates = {} if estimates is None else estimates
        self.servers = ModelServers(data_dir, socket_dir, connections, ledger)
        self.lifecycle = Lifecycle(
            [spec for spec, _ in prepared], self.servers,
            budget=memory_budget_bytes(cfg.model_loading.memory_budget, physical_memory()),
            max_loaded=cfg.model_loading.max_loaded,
            load_timeout=load_timeout or (lambda: cfg.timeouts.model_load),
            on_change=self._changed, on_removed=self._removed, on_idle=self._idle)
        self.backends: dict[str, LocalBackend] = {}
        self.contexts = ServedContexts(self.lifecycle, self.backends, notifications)
        registry.changes.subscribe(self.contexts.check)
        self._look_again = trio.Event()  # set by follow(): rescan now
        for spec, _ in prepared:
            self._add_backend(spec)

    def __repr__(self) -> str:
        return f"OnDemand({self.lifecycle!r})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.servers.run)
            await nursery.start(self.lifecycle.run)
            nursery.start_soon(self._rescan_periodically)
            task_status.started()

    # ------------------------------------------------------------------ the catalogue

    def _add_backend(self, spec: ModelSpec) -> None:
        name = spec.name
        backend = LocalBackend(BackendConfig(name=name, url="", kind=spec.kind, apis=spec.apis,
                                             max_concurrent=spec.max_concurrent),
                               None, pinned_model=name, bundled=_bundled(spec))
        self.backends[name] = backend
        self.registry.add(backend)

    async def _rescan_periodically(self) -> None:
        while True:
            with trio.move_on_after(RESCAN_EVERY):
                await self._look_again.wait()
            self._look_again = trio.Event()
            await self.rescan()

    def follow(self, cfg: Config) -> None:
        """A new config (SPEC §13): the budget and the limit apply to the next load; the
        catalogue is looked at again at once (``models:`` and the folders may have
        changed; a model that left stops once idle)."""
        lifecycle = self.lifecycle
        lifecycle.budget = memory_budget_bytes(cfg.model_loading.memory_budget,
                                               physical_memory())
        lifecycle.max_loaded = cfg.model_loading.max_loaded
        self._look_again.set()

    async def rescan(self) -> dict[str, list[str]]:
        """Look at the folders again (SPEC §11): new files become models, changed ones get
        their new estimate, a model whose file is gone leaves once idle. Returns the names
        added and removed."""
        prepared = await trio.to_thread.run_sync(
            prepare, self.models(), self.config(), self.data_dir, self.estimates)
        known = set(self.lifecycle.models)
        seen = set()
        added = []
        for spec, entry in prepared:
            seen.add(spec.name)
            self.entries[spec.name] = entry
            backend = self.backends.get(spec.name)
            if backend is None:
                self._add_backend(spec)
            elif backend.apis.setting != spec.apis:  # SPEC §17.1: a changed setting
                backend.apis = initial_modes(spec.apis, bundled=_bundled(spec))
            if spec.name not in known:
                added.append(spec.name)
                log.info("model %s found: %s", spec.name, spec.path)
            self.lifecycle.add(spec)
        removed = sorted(known - seen)
        for name in removed:
            if name in self.lifecycle.models:
                log.info("model %s left the catalogue (config or file): it stops once idle",
                         name)
                self.lifecycle.remove(name)
        return {"added": added, "removed": removed}

    def _idle(self, model: Managed) -> None:
        """Its last request ended: a ``model`` event with the new ``unloadsAt`` (built only
        when somebody follows the events)."""
        hub = self.hub
        if hub is not None and hub.wants("model"):
            hub.publish("model", self.event(model))

    def _removed(self, model: Managed) -> None:
        backend = self.backends.pop(model.name, None)
        if backend is not None:
            self.registry.remove(backend)
        self.entries.pop(model.name, None)
        if self.hub is not None:
            self.hub.publish("model", {"name": model.name, "state": "removed",
                                       "source": "managed"})

    # ------------------------------------------------------------------ requests and the API

    def holds(self, model: str) -> bool:
        return model in self.lifecycle.models

    def take(self, model: str) -> Managed | None:
        return self.lifecycle.take(model)

    async def acquire(self, model: str) -> Managed:
        return await self.lifecycle.acquire(model)

    def release(self, model: Managed) -> None:
        self.lifecycle.release(model)

    async def load(self, name: str) -> dict[str, Any]:
        """The API's load: once it is loaded, its entry (its keep_alive counts from now);
        raises the request's errors (503 model_load_failed, ...)."""
        model = await self.lifecycle.acquire(name)
        self.lifecycle.release(model)
        return self.entry(model)

    async def unload(self, name: str, wait: float = STOP_WAIT) -> dict[str, Any]:
        """The API's unload: at once if no request is in flight (its entry once the server
        is gone, waiting at most ``wait`` seconds), else as soon as none is."""
        model = self.lifecycle.ask_unload(name)
        with trio.move_on_after(wait):
            while model.unload_asked and not model.in_flight:
                await model.changed.wait()
        return self.entry(model)

    def memory_in_use(self) -> int:
        """Bytes the loaded models hold (``GET /api/v1/models/local``'s ``memoryInUse``)."""
        return sum(m.held for m in self.lifecycle.models.values()
                   if m.state is ModelState.LOADED)

    def _changed(self, model: Managed) -> None:
        backend = self.backends.get(model.name)
        if backend is None:  # a model the rescan adds: its backend comes next
            return
        if model.state is ModelState.LOADED and model.server is not None:
            self.registry.server_up(backend, model.server.url,
                                    [{"id": model.name, "object": "model",
                                      "owned_by": model.spec.engine.owner}])
        elif backend.live:
            self.registry.server_down(backend, model.failure)
        if self.hub is not None:
            self.hub.publish("model", self.event(model))

    def entry(self, model: Managed) -> dict[str, Any]:
        """The model as ``GET /api/v1/models/local`` lists it (SPEC §11)."""
        entry = self.entries.get(model.name)
        return {**local_model_entry(
            model, source="folder" if entry is None else entry.source,
            log=os.fspath(log_path(self.data_dir, model.name)),
            now=trio.current_time(), wall_now=wall(), context=self.contexts.of(model)),
            "apis": self._apis(model.name)}

    def event(self, model: Managed) -> dict[str, Any]:
        """The ``model`` event of a change (its entry, ``source: "managed"``)."""
        return model_event(self.entry(model))

    def listed(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``/v1/models``' local entries with every managed model in it (SPEC §11)."""
        out = listed_models(entries, self.lifecycle.models)
        for entry in out:  # each with its server's APIs, relayed or translated (SPEC §17.1)
            apis = self._apis(entry.get("id", ""))
            if apis is not None and "sluice" in entry:
                entry["sluice"] = {**entry["sluice"], "apis": apis}
        return out

    def _apis(self, name: str) -> dict[str, str | None] | None:
        backend = self.backends.get(name)
        return None if backend is None else backend.apis.view()

    def status(self) -> list[dict[str, Any]]:
        return [self.entry(m) for m in self.lifecycle.models.values()]


def _bundled(spec: ModelSpec) -> bool:
    """The bundled llama.cpp serves it: its ``apis: auto`` is native (SPEC §17.1)."""
    return isinstance(spec.engine, Bundled)
