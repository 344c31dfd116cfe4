"""The state owners' events on the hub (SPEC §9.3) that are made from a change the owner
already announces: ``node`` (from :attr:`NodeIndex.changes`), ``model`` for local backends
(from :attr:`BackendRegistry.changes`), ``settings`` (from :meth:`Settings.subscribe`) and
``stats`` (a once-a-second look at the router's counters). The other owners publish their
own: the router its ``circuit`` events, :class:`~proxy.notifications.Notifications` its
``notification`` events, :mod:`proxy.models.ondemand` the ``model`` events of managed
models, and the
settle step of each request its ``request`` event.

Every payload is the body (or the entry) of the matching GET endpoint, built by the same
function that endpoint uses (:mod:`protocol.views`), and is published only when it differs
from the last one for the same thing. Nothing here runs on a request: node and backend
entries are compared after each health check that changed something (and remembered with
nobody subscribed, so a subscriber hears of real changes only), settings after each write;
the stats are looked at once a second, and built only while somebody reads them.

- ``node``: an endpoint entry of ``GET /api/v1/pool/distributed-status``, when a field of it
  or the node's model ids changed (the entry only counts them: a reader that shows the
  models reads them from distributed-status). Latency moves only count when large enough
  (:data:`LATENCY_STEP_MS`, :data:`LATENCY_SHARE`, from the entry last published), so
  jitter is no event storm.
- ``model``: ``{source: "backend", name, kind, online, models, lastError}`` (an entry of
  ``backends`` in ``/api/v1/inference/status``); managed servers send ``source: "managed"``.
- ``settings``: ``{section, value}``, one per section whose GET body changed in a write:
  ``loadBalancing``, ``timeouts``, ``api``, ``aliases``, ``discovery`` and ``nodes`` (the
  registry: a key change shows as ``hasApiKey``; never a key).
- ``stats``: the routing-stats body, at most once a second, only when it changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from protocol.config import Config
from protocol.config.changes import restart_changes
from protocol.views import (
    aliases_view,
    api_view,
    discovery_view,
    endpoint_entry,
    load_balancing_view,
    registry_view,
    timeouts_view,
)
from proxy.notifications import Notifications, restart_pending
from proxy.observe.hub import Hub
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import NodeEndpoint, NodeIndex
from proxy.routing.router import Router
from proxy.routing.stats import routing_stats
from proxy.settings.store import Settings

STATS_INTERVAL = 1.0  # seconds: at most one stats event per interval; breakers looked at
LATENCY_STEP_MS = 2  # a node's latency must move at least this much (ms) ...
LATENCY_SHARE = 0.1  # ... and this share of the latency last published to be an event


def latency_moved(old: int | None, new: int | None) -> bool:
    """A latency change worth a ``node`` event: appearing, vanishing, or moving by at least
    :data:`LATENCY_STEP_MS` and :data:`LATENCY_SHARE` of ``old``."""
    if old is None or new is None:
        return old != new
    return abs(new - old) >= max(LATENCY_STEP_MS, LATENCY_SHARE * old)


def entry_moved(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """``new`` differs from the node entry last published (latency with its dead band)."""
    if any(old[k] != v for k, v in new.items() if k != "latencyMs"):
        return True
    return latency_moved(old["latencyMs"], new["latencyMs"])


class NodeFeed:
    """``node`` events: each node entry when it changed (see the module docstring)."""

    __slots__ = ("_hub", "_published", "_settings")

    def __init__(self, hub: Hub, nodes: NodeIndex, settings: Settings) -> None:
        self._hub = hub
        self._settings = settings
        # fingerprint -> the last entry sent and the model ids (all, loaded) then
        self._published: dict[str, tuple[dict[str, Any], tuple[frozenset[str], ...]]] = {}
        nodes.changes.subscribe(self._changed)

    def __repr__(self) -> str:
        return f"NodeFeed({sorted(self._published)})"

    def _changed(self, endpoint: NodeEndpoint) -> None:
        enabled = self._settings.config.load_balancing.enabled
        entry = endpoint_entry(endpoint.cfg, endpoint, enabled)
        ids = (endpoint.model_ids, endpoint.loaded_ids) if enabled and endpoint.online else ()
        last = self._published.get(endpoint.fingerprint)
        if last is None or last[1] != ids or entry_moved(last[0], entry):
            self._published[endpoint.fingerprint] = entry, ids
            self._hub.publish("node", entry)


class BackendFeed:
    """``model`` events of the local backends: each entry when it changed."""

    __slots__ = ("_hub", "_published", "_registry")

    def __init__(self, hub: Hub, registry: BackendRegistry) -> None:
        self._hub = hub
        self._registry = registry
        self._published: dict[str, dict[str, Any]] = {}  # name -> last entry sent
        registry.changes.subscribe(self._changed)

    def __repr__(self) -> str:
        return f"BackendFeed({sorted(self._published)})"

    def _changed(self, _registry: BackendRegistry) -> None:
        for backend in self._registry.backends:
            entry = {"source": "backend", **backend.status()}
            if self._published.get(backend.name) != entry:
                self._published[backend.name] = entry
                self._hub.publish("model", entry)


class SettingsFeed:
    """``settings`` events: after each write, one per section whose GET body changed. The
    bodies are remembered from write to write (a human's action: rare), so a subscriber
    that comes later still hears only of real changes."""

    __slots__ = ("_bodies", "_config", "_external", "_hub", "_identity", "_notifications",
                 "_settings")

    def __init__(self, hub: Hub, settings: Settings, notifications: Notifications, *,
                 external: bool = False, identity: str | None = None) -> None:
        self._hub = hub
        self._identity = identity  # the api section's read-only identity (SPEC §16)
        self._external = external  # the API listener binds every address (discovery's view)
        self._settings = settings
        self._notifications = notifications
        self._config = settings.config
        self._bodies = self._sections(self._config, self._config)
        settings.subscribe(self._changed)

    def __repr__(self) -> str:
        return f"SettingsFeed({sorted(self._bodies)})"

    def _sections(self, old: Config, new: Config) -> dict[str, Any]:
        """Each section's GET body for ``new``; the api section's ``restartRequired`` as its
        PUT answers it (this write changed a field that needs a restart, or one did before)."""
        restart = bool(restart_changes(old, new)) or restart_pending(self._notifications)
        return {"loadBalancing": load_balancing_view(new), "timeouts": timeouts_view(new),
                "api": api_view(new, restart, self._identity), "aliases": aliases_view(new),
                "discovery": discovery_view(new, self._external),
                "nodes": registry_view(new, self._settings.secrets.node_keys)}

    def _changed(self, config: Config) -> None:
        bodies = self._sections(self._config, config)
        self._config = config
        if self._hub.wants("settings"):
            for section, body in bodies.items():
                if body != self._bodies.get(section):
                    self._hub.publish("settings", {"section": section, "value": body})
        self._bodies = bodies


async def run_stats_feed(hub: Hub, router: Router, config: Callable[[], Config]) -> None:
    """Each :data:`STATS_INTERVAL`: let the router look at its breakers (an open circuit
    turns half-open by time alone: a ``circuit`` event within a second); while somebody
    reads ``stats``, publish the routing-stats body when it differs
    from the last one looked at (kept while nobody reads, so a subscriber that comes after
    a change hears of it once, even if the change came between its snapshot and the next
    look). Nobody subscribed: a wake-up a second, and no work on any request."""
    last = routing_stats(router, config())
    while True:
        await trio.sleep(STATS_INTERVAL)
        router.look_at_circuits(trio.current_time())
        if not hub.wants("stats"):
            continue
        body = routing_stats(router, config())
        if body != last:
            hub.publish("stats", body)
            last = body


class StateEvents:
    """The feeds above, for one gateway: made with its parts, run in its nursery."""

    __slots__ = ("backend_feed", "hub", "node_feed", "router", "settings", "settings_feed")

    def __init__(self, hub: Hub, settings: Settings, nodes: NodeIndex,
                 backends: BackendRegistry, router: Router,
                 notifications: Notifications, *, external: bool = False,
                 identity: str | None = None) -> None:
        self.hub = hub
        self.router = router
        self.settings = settings
        self.node_feed = NodeFeed(hub, nodes, settings)
        self.backend_feed = BackendFeed(hub, backends)
        self.settings_feed = SettingsFeed(hub, settings, notifications, external=external,
                                          identity=identity)

    def __repr__(self) -> str:
        return f"StateEvents({self.hub!r})"

    async def run(self) -> None:
        """The once-a-second look (:func:`run_stats_feed`), until cancelled."""
        await run_stats_feed(self.hub, self.router, lambda: self.settings.config)
