"""Local model servers (``backends:``): their model lists and the health poll that keeps
them current. Routing asks :meth:`BackendRegistry.holder_of` which backend serves a model.

The registry is the one owner of a backend's state: the health poll and the models on
demand (:mod:`proxy.models.ondemand`) report what they found through its methods
(:meth:`~BackendRegistry.checked`, :meth:`~BackendRegistry.server_up`,
:meth:`~BackendRegistry.server_down`), which change the backend and re-index the models in
one step.

Each check of an ``llm`` backend that answered its model list also asks it for its slots
(SPEC §15 "Load"; :mod:`proxy.registry.slots_probe`): :attr:`LocalBackend.slots`, None while
unknown, as the server reported them; routing reads them with its own in-flight count. An
``llm`` backend's served context (SPEC §17.2: ``/props``, from the slots poll's or asked
once per address) is :attr:`LocalBackend.served`; a managed server that comes up is checked
at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from protocol.api_modes import ApiModes, Mode, initial_modes
from protocol.config import BackendConfig, Config
from protocol.openai import merge_model_lists
from protocol.served_context import Served
from protocol.slots import Slots
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from proxy.publish import Subscribers
from proxy.registry.apis_probe import probe_apis
from proxy.registry.probe import probe_models
from proxy.registry.slots_probe import poll_context, poll_slots
from proxy.upstream.pool import ConnectionPool

log = logging.getLogger("sluice.backends")

# After a server refused /slots and /props, they are asked again after this many checks (or
# at once when its address changes or it comes back from offline).
SLOTS_RETRY_CHECKS = 10


class LocalBackend:
    """One configured local model server and what its last health check found."""

    def __init__(self, cfg: BackendConfig, api_key: str | None, *,
                 pinned_model: str | None = None, bundled: bool = False) -> None:
        self.name = cfg.name
        self.kind = cfg.kind
        self.url = cfg.url
        # None while a managed server is down: then it is neither polled nor routed to.
        self.address: UpstreamAddress | None = parse_upstream_url(cfg.url) if cfg.url else None
        # A managed llama.cpp server answers to any model id; it serves exactly this one.
        self.pinned_model = pinned_model
        self.served_by = f"local:{cfg.name}".encode()
        self.forwarded_by: bytes | None = None  # a local server is not another gateway
        self._api_key = api_key
        self.models: list[dict[str, Any]] = []
        self.online = False
        self.last_error: str | None = None
        self.latency_ms: float | None = None
        # Its slots at the last check (None: unknown, or it does not report them), and how
        # many checks pass before /slots is asked again at this address after it was refused.
        self.slots: Slots | None = None
        self.slots_skip = 0
        # SPEC §18: its slots when it reports none, else a cap on them (None: no cap).
        self.max_concurrent = cfg.max_concurrent
        # SPEC §17.1: which of its APIs are relayed or translated (None: not known yet)
        self.apis: ApiModes = initial_modes(cfg.apis, bundled=bundled)
        # The context its llama.cpp serves (``/props``, SPEC §17.2), asked once per address.
        self.served: Served | None = None
        self.props_at: UpstreamAddress | None = None

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @property
    def live(self) -> bool:
        """Routed to and listed: it answered its last check and has an address."""
        return self.online and self.address is not None

    def status(self) -> dict[str, Any]:
        """Its entry in ``backends`` of ``/api/v1/inference/status`` (and of a ``model``
        event): the models it serves now (none while it is not live)."""
        live = self.live
        address = self.address
        return {"name": self.name, "kind": self.kind, "online": live,
                "models": [m["id"] for m in self.models] if live else [],
                "lastError": self.last_error, "apis": self.apis.view(),
                # where it listens (tcp:host:port or unix:path; never the URL's key)
                "address": None if address is None else address.key}

    def __repr__(self) -> str:  # never shows the key
        where = self.address.key if self.address is not None else "down"
        return (f"LocalBackend({self.name!r}, {where}, online={self.online}, "
                f"models={[m['id'] for m in self.models]})")


class BackendRegistry:
    """The local backends in config order and the model → backend index."""

    def __init__(self, configs: Sequence[BackendConfig], keys: Mapping[str, str]) -> None:
        self.backends = [LocalBackend(cfg, keys.get(cfg.name)) for cfg in configs]
        self._by_model: dict[str, LocalBackend] = {}
        self._holders: dict[str, list[LocalBackend]] = {}
        self.changes: Subscribers[BackendRegistry] = Subscribers()  # after each re-index
        self.ready = trio.Event()  # every backend has been checked once
        self.added = trio.Event()  # set when follow() adds a backend: check it now
        self._changed = trio.Event()  # replaced on every reindex

    def __repr__(self) -> str:
        return f"BackendRegistry({self.backends!r})"

    def holder_of(self, model: str) -> LocalBackend | None:
        return self._by_model.get(model)

    def holders_of(self, model: str) -> list[LocalBackend]:
        """Every live backend that lists ``model``, in config order (the first is
        :meth:`holder_of`'s)."""
        return list(self._holders.get(model, ()))

    async def wait_for_holder(self, model: str) -> LocalBackend | None:
        """Like holder_of, but right after start waits for the backends' first checks (each
        bounded by the health-check timeout) before saying nobody holds the model."""
        while (backend := self._by_model.get(model)) is None and not self.ready.is_set():
            await self._changed.wait()
        return backend

    def add(self, backend: LocalBackend) -> None:
        self.backends.append(backend)
        self.reindex()

    def remove(self, backend: LocalBackend) -> None:
        """A managed model that left the catalogue (its file is gone)."""
        if backend in self.backends:
            self.backends.remove(backend)
            self.reindex()

    def follow(self, configs: Sequence[BackendConfig], keys: Mapping[str, str]) -> None:
        """The ``backends:`` of a new config (SPEC §13): a new entry is added (and checked
        at once), a removed one leaves (a request already sent to it finishes), a changed
        one (url, kind or key) is replaced. Managed models' backends are not the config's
        and stay."""
        configured = {b.name: b for b in self.backends if b.pinned_model is None}
        kept: list[LocalBackend] = []
        added = False
        for cfg in configs:
            old = configured.pop(cfg.name, None)
            if (old is not None and old.url == cfg.url and old.kind == cfg.kind
                    and old.api_key == keys.get(cfg.name) and old.apis.setting == cfg.apis):
                old.max_concurrent = cfg.max_concurrent
                kept.append(old)
            else:
                kept.append(LocalBackend(cfg, keys.get(cfg.name)))
                added = True
        if not added and not configured:
            return
        for gone in configured.values():
            log.info("backend %s removed from the config", gone.name)
        self.backends = [*kept, *(b for b in self.backends if b.pinned_model is not None)]
        self.reindex()
        if added:
            self.added.set()

    def model_entries(self) -> list[dict[str, Any]]:
        """The live backends' ``/v1/models`` entries, each with ``"sluice": {"apis"}``
        (SPEC §17.1)."""
        return merge_model_lists(
            (b.name, [{**m, "sluice": {**m.get("sluice", {}), "apis": b.apis.view()}}
                      for m in b.models])
            for b in self.backends if b.live)

    def checked(self, backend: LocalBackend, models: list[dict[str, Any]], error: str | None,
                latency_ms: float | None) -> None:
        """A health check's result: online with ``models``, or offline with ``error``."""
        was_online = backend.online
        backend.online = error is None
        backend.last_error = error
        backend.models = models
        backend.latency_ms = latency_ms
        if error is not None:  # asked again from scratch once it is back
            backend.slots, backend.slots_skip = None, 0
            backend.served, backend.props_at = None, None
        if error is not None and was_online:
            log.warning("backend %s went offline: %s", backend.name, error)
        elif error is None and not was_online:
            log.info("backend %s online with models %s", backend.name,
                     ", ".join(m["id"] for m in models) or "(none)")
        self.reindex()

    def server_up(self, backend: LocalBackend, url: str, models: list[dict[str, Any]]) -> None:
        """A managed server listens on ``url`` and serves ``models``."""
        backend.address = parse_upstream_url(url)
        backend.url = url
        backend.online = True
        backend.last_error = None
        backend.models = models
        backend.slots, backend.slots_skip = None, 0  # a new server: known at its next check
        backend.served, backend.props_at = None, None
        self.reindex()
        self.added.set()  # check it now: its context and slots, read from the server

    def server_down(self, backend: LocalBackend, error: str | None) -> None:
        """A managed server stopped: no address, no models, until it is up again."""
        backend.address = None
        backend.online = False
        backend.last_error = error
        backend.models = []
        backend.slots, backend.slots_skip = None, 0
        backend.served, backend.props_at = None, None
        self.reindex()

    def found_apis(self, backend: LocalBackend, address: UpstreamAddress,
                   found: dict[str, Mode]) -> None:
        """What a check's API probes found at ``address`` (SPEC §17.1); dropped when the
        backend moved while it was asked."""
        if backend.address != address or not found:
            return
        modes = backend.apis
        for name, mode in found.items():
            if modes.of(name) is None:
                modes = modes.with_mode(name, mode)
        if modes != backend.apis:
            log.info("backend %s: %s", backend.name, ", ".join(
                f"{name} {mode}" for name, mode in modes.view().items()))
            backend.apis = modes
            self.changes.publish(self)

    def lacks(self, backend: LocalBackend, name: str) -> None:
        """A relayed request for API ``name`` was answered 404/405 before any byte: the
        server lacks it (SPEC §17.1's safety net); from now on it is translated."""
        if backend.apis.of(name) is None:
            log.info("backend %s has no %s API: translated from now on", backend.name, name)
            backend.apis = backend.apis.with_mode(name, "translate")
            self.changes.publish(self)

    def slots_due(self, backend: LocalBackend) -> bool:
        """Whether this check asks ``backend`` for its slots: not while it counts down the
        checks after a refusal (one check counted per call)."""
        if backend.slots_skip > 0:
            backend.slots_skip -= 1
            return False
        return True

    def found_slots(self, backend: LocalBackend, address: UpstreamAddress, slots: Slots | None,
                    *, refused: bool = False) -> None:
        """What a check's slots poll found at ``address``; ``refused``: the server does not
        serve ``/slots`` there, so it is not asked again for :data:`SLOTS_RETRY_CHECKS`
        checks (meanwhile ``slots`` stays). Dropped when the backend moved or went offline
        while it was asked."""
        if backend.address != address or not backend.online:
            return
        backend.slots_skip = SLOTS_RETRY_CHECKS if refused else 0
        backend.slots = slots
        self.changes.publish(self)  # a report: routing reads it now; a slot may have freed

    def found_context(self, backend: LocalBackend, address: UpstreamAddress,
                      served: Served | None) -> None:
        """What ``/props`` said at ``address`` (None: no context there); not asked again
        at that address. Dropped when the backend moved or went offline meanwhile."""
        if backend.address != address or not backend.online:
            return
        backend.props_at = address
        if served != backend.served:
            backend.served = served
            self.changes.publish(self)

    def reindex(self) -> None:
        index: dict[str, LocalBackend] = {}
        holders: dict[str, list[LocalBackend]] = {}
        for backend in self.backends:  # config order: the first holder wins
            if backend.live:
                for entry in backend.models:
                    index.setdefault(entry["id"], backend)
                    listed = holders.setdefault(entry["id"], [])
                    if not listed or listed[-1] is not backend:
                        listed.append(backend)
        self._by_model = index
        self._holders = holders
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        self.changes.publish(self)


def pin(models: list[dict[str, Any]], pinned: str | None) -> list[dict[str, Any]]:
    """The model list of a managed server: exactly its configured id, whatever it reports."""
    if pinned is None:
        return models
    reported = models[0] if models else {}
    return [{**reported, "id": pinned}]


async def check_backend(registry: BackendRegistry, backend: LocalBackend,
                        connections: ConnectionPool, timeout: float) -> None:
    """Fetch the backend's ``/v1/models`` within ``timeout``; the registry records it. An
    ``llm`` backend that answered is then asked for its slots in what is left of
    ``timeout``."""
    address = backend.address
    if address is None:
        return
    deadline = trio.current_time() + timeout
    probe = await probe_models(connections, address, api_key=backend.api_key, timeout=timeout)
    error = probe.error
    models = pin(probe.models, backend.pinned_model) if error is None else []
    registry.checked(backend, models, error, probe.latency_ms)
    if error is None and backend.kind == "llm" and not backend.apis.known():
        modes = await probe_apis(connections, address, backend.apis, api_key=backend.api_key,
                                 deadline=deadline)
        registry.found_apis(backend, address, modes)
    if error is None and backend.kind == "llm" and registry.slots_due(backend):
        found, refused = await poll_slots(
            connections, address, api_key=backend.api_key, deadline=deadline,
            context=lambda served: registry.found_context(backend, address, served))
        registry.found_slots(backend, address, found, refused=refused)
    if error is None and backend.kind == "llm" and backend.props_at != address:
        served, answered = await poll_context(connections, address, api_key=backend.api_key,
                                              deadline=deadline)
        if answered:
            registry.found_context(backend, address, served)


async def run_health_checks(
    registry: BackendRegistry,
    connections: ConnectionPool,
    get_config: Callable[[], Config],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Poll every backend each ``health_checks.interval``. Each backend's answer is indexed
    as soon as it comes, so one slow backend delays nobody else's models."""

    task_status.started()
    while True:
        config = get_config().timeouts.health_check
        async with trio.open_nursery() as nursery:
            for backend in registry.backends:
                nursery.start_soon(check_backend, registry, backend, connections, config.timeout)
        if not registry.ready.is_set():
            registry.ready.set()
            registry.reindex()  # wake waiters: the answer is now final
        with trio.move_on_after(config.interval):
            await registry.added.wait()
        if registry.added.is_set():
            registry.added = trio.Event()
