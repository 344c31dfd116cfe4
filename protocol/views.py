"""The GET bodies of the settings, of the node pool's entries and of the managed models
(SPEC §8, §9.3, §11, §12, §14), pure: plain values in, JSON-ready dicts out. The endpoints
answer them, and the ``settings``, ``node`` and ``model`` events carry them
(:mod:`proxy.observe.state_events`, :mod:`proxy.models.ondemand`), so an event is always
the body its GET would give.

Each settings body is its section's fields (:mod:`protocol.config.fields`) read from the
config as YAML data (durations as ``"30s"``), then what the server computes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from protocol.config import Config, NodeConfig, by_priority, config_to_dict, discovery_effect
from protocol.config.fields import (
    ALIASES,
    API,
    DISCOVERY,
    LOAD_BALANCING,
    NODES,
    TIMEOUTS,
    Section,
)
from protocol.model_spec import ModelSpec
from protocol.model_state import ModelState
from protocol.request_record import iso_utc

__all__ = ["PAUSED", "UNCHECKED", "LocalModel", "NodeCheck", "aliases_view", "api_view",
           "discovery_view", "endpoint_entry", "listed_models", "load_balancing_view",
           "local_model_entry", "local_models_view", "model_event", "node_entry",
           "registry_view", "timeouts_view"]

UNCHECKED: Final = "unknown"  # a node's status before its first check (proxy.registry.nodes)
PAUSED: Final = "paused"  # every node's status while load balancing is off


def _fields(section: Section, cfg: Config) -> dict[str, Any]:
    """The section's fields as YAML data, each read from the path the GET shows it at."""
    data = config_to_dict(cfg)
    out: dict[str, Any] = {}
    for f in section.fields:
        value: Any = data
        for part in f.shown.split("."):
            value = value[part]
        out[f.json] = value
    return out


def api_view(cfg: Config, restart: bool, identity: str | None = None) -> dict[str, Any]:
    """``GET /api/v1/settings/api``; ``restart``: a change that needs a restart is saved
    and not applied yet (``restartRequired``); ``identity``: this gateway's certificate pin
    (SPEC §16, read-only; null without one)."""
    return {**_fields(API, cfg), "restartRequired": restart, "identity": identity}


def load_balancing_view(cfg: Config) -> dict[str, Any]:
    """``GET /api/v1/settings/load-balancing``."""
    return _fields(LOAD_BALANCING, cfg)


def timeouts_view(cfg: Config) -> dict[str, Any]:
    """``GET /api/v1/settings/timeouts``: the ``timeouts`` tree with the YAML's own keys."""
    return _fields(TIMEOUTS, cfg)


def discovery_view(cfg: Config, external: bool) -> dict[str, Any]:
    """``GET /api/v1/settings/discovery``: the two switches and what they do now
    (``external``: the running API listener binds every address)."""
    announcing, browsing = discovery_effect(cfg, external)
    return {**_fields(DISCOVERY, cfg), "announcing": announcing, "browsing": browsing}


def aliases_view(cfg: Config) -> dict[str, Any]:
    """``GET /api/v1/settings/aliases``: ``{"aliases": {name: target, ...}}`` in file order."""
    return _fields(ALIASES, cfg)


def node_entry(node: NodeConfig, keys: Mapping[str, str]) -> dict[str, Any]:
    """One entry of the registry: the node's fields, whether it has a key (never the
    key), and its link (SPEC §16): ``pinned`` (TLS to its node port, its certificate's
    ``pin``) or ``plain`` (HTTP to its ``baseUrl``)."""
    out = {f.json: getattr(node, f.key) for f in NODES.fields}
    out["hasApiKey"] = node.fingerprint in keys
    out["pin"] = node.pin
    out["link"] = "pinned" if node.pin else "plain"
    return out


def registry_view(cfg: Config, keys: Mapping[str, str]) -> list[dict[str, Any]]:
    """``GET /api/v1/nodes``, top node first; ``keys`` the node keys by fingerprint."""
    return [node_entry(n, keys) for n in by_priority(cfg.nodes)]


class NodeCheck(Protocol):
    """What the last check of a node found (:class:`proxy.registry.nodes.NodeEndpoint`)."""

    @property
    def status(self) -> str: ...
    @property
    def online(self) -> bool: ...
    @property
    def latency_ms(self) -> float | None: ...
    @property
    def loaded_ids(self) -> frozenset[str]: ...
    @property
    def last_error(self) -> str | None: ...


def endpoint_entry(cfg: NodeConfig, endpoint: NodeCheck | None,
                   enabled: bool) -> dict[str, Any]:
    """One entry of ``endpoints`` in ``GET /api/v1/pool/distributed-status``: an enabled
    node (``cfg``) and what its last check found (``endpoint``, None before the poll saw
    it); ``paused`` while load balancing is off (``enabled`` false). Also the data of a
    ``node`` event (SPEC §9.3)."""
    online = enabled and endpoint is not None and endpoint.online
    latency = endpoint.latency_ms if online and endpoint is not None else None
    return {
        "fingerprint": cfg.fingerprint, "baseUrl": cfg.base_url,
        "status": (UNCHECKED if endpoint is None else endpoint.status) if enabled else PAUSED,
        "latencyMs": None if latency is None else round(latency),
        # the models it has loaded (a sluice node also lists its unloaded managed models)
        "loadedModelCount": len(endpoint.loaded_ids) if online and endpoint else 0,
        "priority": cfg.priority,
        "weight": cfg.weight,  # its share under the weighted strategy (SPEC §13)
        # Beyond SPEC: why the last check failed (never a key: status and address).
        "lastError": endpoint.last_error if enabled and endpoint else None}


class RunningServer(Protocol):
    """A managed model's server while it runs (:class:`proxy.models.process.ServerProcess`)."""

    @property
    def url(self) -> str: ...
    @property
    def pid(self) -> int | None: ...


class LocalModel(Protocol):
    """A managed model as its lifecycle knows it (:class:`proxy.models.managed.Managed`);
    times are on the lifecycle's clock."""

    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> ModelSpec: ...
    @property
    def state(self) -> ModelState: ...
    @property
    def idle_time(self) -> float: ...
    @property
    def loaded_at(self) -> float | None: ...
    @property
    def last_used(self) -> float: ...
    @property
    def memory(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def restarts(self) -> int: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def server(self) -> RunningServer | None: ...
    def unloads_at(self) -> float: ...


def _at(at: float | None, now: float, wall_now: float) -> str | None:
    """A time on the lifecycle's clock (``now`` there, ``wall_now`` on the wall clock) as
    ISO 8601 UTC; None for never."""
    if at is None or math.isinf(at):
        return None
    return iso_utc(wall_now + (at - now))


def local_model_entry(model: LocalModel, *, source: str, log: str, now: float,
                      wall_now: float, context: int | None = None) -> dict[str, Any]:
    """A managed model as ``GET /api/v1/models/local`` lists it (SPEC §11): ``source`` its
    catalogue entry's (config or folder), ``log`` its server's log file, ``context`` what
    one request can use (SPEC §17.2: served once loaded, else planned)."""
    spec = model.spec
    server = model.server
    return {
        "name": model.name, "path": spec.path, "source": source,
        "state": model.state.value,
        "keepAlive": None if math.isinf(model.idle_time) else model.idle_time,
        "preload": spec.preload,
        "loadedAt": _at(model.loaded_at, now, wall_now),
        "lastUsedAt": _at(model.last_used, now, wall_now),
        "unloadsAt": _at(model.unloads_at(), now, wall_now),
        "estimatedBytes": spec.estimate, "memoryBytes": model.memory,
        "contextLength": context,
        "activeRequests": model.in_flight,
        "pid": server.pid if server is not None else None,
        "address": server.url if server is not None else None,
        "transport": None if server is None else
        ("unix" if server.url.startswith("unix:") else "tcp"),
        "restarts": model.restarts, "lastError": model.failure,
        "engine": spec.engine.name, "kind": spec.kind, "log": log,
    }


def local_models_view(models: list[dict[str, Any]], *, budget: int, in_use: int,
                      max_loaded: int, backends: list[str] | None) -> dict[str, Any]:
    """``GET /api/v1/models/local`` (SPEC §11): the entries of :func:`local_model_entry`,
    the memory budget and what the loaded models hold of it (bytes), the limit of loaded
    models, and the installed llama.cpp's compute backends (§11.1; null: not installed)."""
    return {"models": models, "memoryBudget": budget, "memoryInUse": in_use,
            "maxLoaded": max_loaded, "llamaBackends": backends}


def model_event(entry: dict[str, Any]) -> dict[str, Any]:
    """The ``model`` event of a managed model's change (SPEC §9.3): its entry, ``source:
    "managed"`` as every managed server's event says (a backend's says ``backend``), the
    entry's own source (config or folder) as ``origin``."""
    return {**entry, "source": "managed", "origin": entry["source"]}


def listed_models(entries: Iterable[dict[str, Any]], models: Mapping[str, LocalModel]
                  ) -> list[dict[str, Any]]:
    """``/v1/models``' local ``entries`` with every managed model in it, loaded or not, each
    with ``"sluice": {"state": S}`` (SPEC §11)."""
    out = []
    for entry in entries:
        model = models.get(entry.get("id", ""))
        out.append(entry if model is None else
                   {**entry, "sluice": {"state": model.state.value}})
    shown = {entry.get("id") for entry in out}
    out += [{"id": name, "object": "model", "created": 0, "owned_by": model.spec.engine.owner,
             "sluice": {"state": model.state.value}}
            for name, model in models.items() if name not in shown]
    return out


# -- the queue (SPEC §18) --------------------------------------------------------------------


@attrs.frozen
class Waiting:
    """One waiting request: its id, class now, client and seconds waited."""

    id: str
    priority: str
    client: str
    waited: float


@attrs.frozen
class QueueLine:
    """One model's line: who waits, in serving order; sluice's requests of it in flight;
    its slots over its servers (None: unknown, unlimited)."""

    model: str
    waiting: list[Waiting]
    in_flight: int
    slots: int | None


def queue_view(lines: Sequence[QueueLine]) -> dict[str, Any]:
    """``GET /api/v1/queue`` (admin: it names clients)."""
    return {"models": [{"model": line.model,
                        "waiting": [{"id": w.id, "priority": w.priority, "client": w.client,
                                     "waitedMs": round(w.waited * 1000)} for w in line.waiting],
                        "inFlight": line.in_flight, "slots": line.slots}
                       for line in lines]}
