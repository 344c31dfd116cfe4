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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from protocol.catalogue import Entry
from protocol.config import BackendConfig, Config, ModelConfig
from protocol.model_room import memory_budget_bytes
from protocol.model_state import ModelState
from protocol.request_record import iso_utc
from proxy.models.gguf_file import memory_required, read_estimate
from proxy.models.ledger import Ledger
from proxy.models.lifecycle import Lifecycle
from proxy.models.managed import Managed, ModelSpec
from proxy.models.process import file_safe
from proxy.models.scan import build
from proxy.models.servers import ModelServers
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


Prepared = list[tuple[ModelSpec, Entry]]
# A file's estimate and problem by (path, size, mtime, context): a rescan reads the header of
# a new or changed file only.
Estimates = dict[tuple[str, int, int, int], tuple[int, str | None]]

RESCAN_EVERY = 10.0  # seconds between two looks at model_loading.dirs (SPEC §11)
STOP_WAIT = 15.0  # seconds the API's unload waits for the server to go (SIGKILL after 10)


def _estimate(path: str, context: int, cache: Estimates | None) -> tuple[int, str | None]:
    if cache is None:
        return read_estimate(path, context)
    try:
        st = os.stat(path)
    except OSError:
        return read_estimate(path, context)  # says why it cannot be read
    key = (path, st.st_size, st.st_mtime_ns, context)
    known = cache.get(key)
    if known is None:
        known = cache[key] = read_estimate(path, context)
    return known


def prepare(models: Sequence[ModelConfig], cfg: Config, data_dir: Path,
            cache: Estimates | None = None) -> Prepared:
    """The catalogue's models as specs: a config entry's settings, else the defaults; each
    with why its file cannot be used, if it cannot (blocking: the folder scan and the GGUF
    headers; run it in a worker thread). ``cache`` keeps the headers read for the next
    call."""
    entries, skipped = build(data_dir, models, cfg.model_loading.dirs)
    for item in skipped:
        log.warning("model file %s left out: %s", item.path, item.reason)
    by_name = {m.name: m for m in models}
    fields = {m.name: f"models[{i}]" for i, m in enumerate(models)}
    out = []
    for entry in entries:
        model = by_name.get(entry.name) or ModelConfig(name=entry.name, path=entry.path)
        keep_alive = cfg.model_loading.keep_alive if model.keep_alive is None \
            else model.keep_alive
        field = fields.get(entry.name, "")
        estimate, problem = _size(model, entry.path, field, cache)
        if entry.missing:
            problem = f"parts {', '.join(map(str, entry.missing))} of {entry.parts} are missing"
        out.append((ModelSpec(
            name=entry.name, path=entry.path, estimate=estimate, keep_alive=keep_alive,
            context=model.context, parallel=model.parallel, threads=model.threads,
            preload=model.preload, problem=problem, command=model.command, env=model.env,
            health=model.health, stop_signal=model.stop_signal, kind=model.kind,
            declared=model.memory is not None, llama_args=tuple(llama_args(model)),
            field=field), entry))
    return out


def _size(model: ModelConfig, path: str, field: str, cache: Estimates | None
          ) -> tuple[int, str | None]:
    """A model's size for the budget and why its file cannot be used: a declared ``memory``
    wins; else the GGUF's estimate. A command model's own server reads its file, so only
    its size is asked of it: with no ``memory`` and no readable GGUF it is required."""
    if model.command and model.memory is not None:
        return model.memory, None
    estimate, problem = (0, "path names no GGUF file") if not path else \
        _estimate(path, model.context, cache)
    if problem is not None and model.command:
        return estimate, f"{field}.memory: {memory_required(problem)}"
    return (estimate if model.memory is None else model.memory), problem


def config_problems(prepared: Prepared) -> list[str]:
    """The problems that make a config invalid (SPEC §3: serve exits 2), not only a model
    that cannot load: a command model whose size is unknown (no ``memory``, no GGUF)."""
    return [spec.problem for spec, _ in prepared
            if spec.command and not spec.declared and spec.problem is not None]


def llama_args(model: ModelConfig) -> list[str]:
    """The bundled llama.cpp's options of a ``models:`` entry as launcher arguments."""
    args = []
    if model.gpu_layers is not None:
        args += ["--gpu-layers", str(model.gpu_layers)]
    if model.flash_attn is not None:
        args += ["--flash-attn", "on" if model.flash_attn else "off"]
    if model.cache_type_k is not None:
        args += ["--cache-type-k", model.cache_type_k]
    if model.cache_type_v is not None:
        args += ["--cache-type-v", model.cache_type_v]
    if model.batch is not None:
        args += ["--batch", str(model.batch)]
    if model.kind == "embedding" and not model.command:
        args.append("--embeddings")
    return args


class OnDemand:
    """The managed models of one gateway (``prepared`` by :func:`prepare` from ``models``
    and the config's folders; :meth:`rescan` looks again)."""

    def __init__(self, prepared: Prepared, cfg: Config, data_dir: Path,
                 socket_dir: Path | None, registry: BackendRegistry,
                 connections: ConnectionPool, hub: Hub | None = None, *,
                 load_timeout: Callable[[], float] | None = None,
                 models: Callable[[], Sequence[ModelConfig]] | None = None,
                 config: Callable[[], Config] | None = None,
                 estimates: Estimates | None = None, ledger: Ledger | None = None) -> None:
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
        self._look_again = trio.Event()  # set by follow(): rescan now
        for spec, _ in prepared:
            self._add_backend(spec.name, spec.kind)

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

    def _add_backend(self, name: str, kind: str = "llm") -> None:
        backend = LocalBackend(BackendConfig(name=name, url="", kind=kind), None,
                               pinned_model=name)
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
            if spec.name not in self.backends:
                self._add_backend(spec.name, spec.kind)
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

    def budget(self) -> dict[str, Any]:
        """``GET /api/v1/models/local``'s figures beside its models."""
        life = self.lifecycle
        return {"memoryBudget": life.budget,
                "memoryInUse": sum(m.held for m in life.models.values()
                                   if m.state is ModelState.LOADED),
                "maxLoaded": life.max_loaded}

    def _changed(self, model: Managed) -> None:
        backend = self.backends.get(model.name)
        if backend is None:  # a model the rescan adds: its backend comes next
            return
        if model.state is ModelState.LOADED and model.server is not None:
            self.registry.server_up(backend, model.server.url,
                                    [{"id": model.name, "object": "model",
                                      "owned_by": owner(model.spec)}])
        elif backend.live:
            self.registry.server_down(backend, model.failure)
        if self.hub is not None:
            self.hub.publish("model", self.event(model))

    def entry(self, model: Managed) -> dict[str, Any]:
        """The model as ``GET /api/v1/models/local`` lists it (SPEC §11)."""
        entry = self.entries.get(model.name)
        spec = model.spec
        server = model.server
        now = trio.current_time()
        unloads = model.unloads_at()
        return {
            "name": model.name, "path": spec.path,
            "source": "folder" if entry is None else entry.source,
            "state": model.state.value,
            "keepAlive": None if math.isinf(model.idle_time) else model.idle_time,
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
            "engine": spec.engine, "kind": spec.kind,
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
        out += [{"id": name, "object": "model", "created": 0, "owned_by": owner(model.spec),
                 "sluice": {"state": model.state.value}}
                for name, model in models.items() if name not in shown]
        return out

    def status(self) -> list[dict[str, Any]]:
        return [self.entry(m) for m in self.lifecycle.models.values()]


def owner(spec: ModelSpec) -> str:
    """``owned_by`` in /v1/models: llamacpp for the bundled engine, else the command's
    program (llama-server, vllm, mlx_lm.server)."""
    return os.path.basename(spec.command[0]) if spec.command else "llamacpp"


def _wall(at: float | None, now: float) -> str | None:
    """A trio clock time as the wall clock's ISO 8601 (None for never)."""
    if at is None or math.isinf(at):
        return None
    return iso_utc(wall() + (at - now))
