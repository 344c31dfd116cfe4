"""Network nodes (``nodes:``): the distributed model index (SPEC §7.2).

:class:`NodeIndex` holds the enabled nodes in priority order and what each one's last health
check found (:mod:`proxy.registry.node_checks` runs the checks and reports them here, through
:meth:`NodeIndex.checked`). A node is *online* when its last check answered 200 and its URL
parses: :attr:`NodeEndpoint.online` is the one definition, used by routing, the model list
and the status answers. :attr:`NodeIndex.changes` hears of every node whose state may have
changed (a check's result, its config, a pause); the ``node`` events are made from it
(:mod:`proxy.observe.state_events`).

A sluice node marks each managed model of its ``/v1/models`` with ``"sluice": {"state": S}``
(SPEC §11); the entries are kept as the node sent them, and :attr:`NodeEndpoint.loaded_ids`,
made once per check, names the models it has loaded (:func:`is_loaded`), so routing's
loaded-first order costs a set lookup per candidate.

A sluice node also reports each model's slots, summed over its own servers (SPEC §15
"Load"): ``"sluice": {"state": S, "slots": {"busy": B, "total": T}}``.
:attr:`NodeEndpoint.slots` holds them per model id as :class:`~protocol.slots.Slots`, as
reported (routing sets them against its own in-flight count); a model without ``slots`` is
absent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import trio

from protocol.config import NodeConfig, by_priority
from protocol.model_state import ModelState
from protocol.slots import Slots, node_slots
from protocol.strategies import LatencyAverage
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from protocol.views import UNCHECKED
from proxy.publish import Subscribers

log = logging.getLogger("sluice.nodes")

ONLINE, OFFLINE, WARMING = "online", "offline", "warming"
UNKNOWN = UNCHECKED  # not checked yet (the word the views answer with)
_LOADED = ModelState.LOADED.value


def is_loaded(entry: dict[str, Any]) -> bool:
    """Whether a node's ``/v1/models`` entry is a model it has loaded: one it marks
    ``"sluice": {"state": "loaded"}``, or one that says no state at all (no ``sluice``
    object, or one without a string ``state``: llama.cpp, Ollama, a backend the node
    serves as it is). Any other state (unloaded, loading, unloading, failed) is not."""
    extra = entry.get("sluice")
    if not isinstance(extra, dict):
        return True
    state = extra.get("state")
    return not isinstance(state, str) or state == _LOADED


class NodeEndpoint:
    """One enabled node and what its last health check found."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        try:  # its base_url: where a plain link goes, and a pinned link asks its node port
            self.plain: UpstreamAddress | None = parse_upstream_url(cfg.base_url)
        except ValueError:
            self.plain = None  # never online: its checks fail with the reason
        # Where requests go: the plain address, or (SPEC §16) for a node with a pin, the
        # pinned TLS link to its node port once a check has learnt the port (None until).
        self.address: UpstreamAddress | None = self.plain if cfg.pin is None else None
        self.node_port: int | None = None
        self.presented: str | None = None  # the pin of a certificate that was not its pin
        self.status = UNKNOWN  # not checked yet
        self.models: list[dict[str, Any]] = []
        self.model_ids: frozenset[str] = frozenset()
        self.loaded_ids: frozenset[str] = frozenset()  # those of model_ids it has loaded
        self.slots: dict[str, Slots] = {}  # model id -> its slots, for those that report them
        self.latency_ms: float | None = None  # the last health check's round trip
        # For ``fastest``: health-check round trips and request times to first byte.
        self.speed = LatencyAverage()
        self.last_error: str | None = None

    def __repr__(self) -> str:  # never shows the key
        return (f"NodeEndpoint({self.cfg.fingerprint!r}, {self.cfg.base_url}, "
                f"{self.status}, models={[m['id'] for m in self.models]})")

    @property
    def fingerprint(self) -> str:
        return self.cfg.fingerprint

    def link(self, node_port: int | None) -> None:
        """A pinned node's node port (None: forget it, to be asked again): requests go over
        TLS to it, the certificate checked against ``cfg.pin``."""
        self.node_port = node_port
        if self.cfg.pin is not None:
            self.address = None if node_port is None or self.plain is None else \
                self.plain.pinned(self.cfg.pin, node_port)

    @property
    def online(self) -> bool:
        """Its last health check answered (and its URL parses): it may be routed to."""
        return self.status == ONLINE and self.address is not None


class NodeIndex:
    """The enabled nodes in priority order (top first) and the models each one serves."""

    def __init__(self) -> None:
        self.endpoints: list[NodeEndpoint] = []
        self._wake = trio.Event()
        self._first_round = trio.Event()  # set once every node was checked with LB on
        # A node's state changed: a check found another status, models, error or latency;
        # its config changed (added, edited, reordered); a pause.
        self.changes: Subscribers[NodeEndpoint] = Subscribers()

    def __repr__(self) -> str:
        return f"NodeIndex({self.endpoints!r})"

    def wake(self) -> None:
        """Start a round at once (a settings change: load balancing on, a node added)."""
        self._wake.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until woken; True when woken."""
        with trio.move_on_after(seconds):
            await self._wake.wait()
        woken = self._wake.is_set()
        if woken:
            self._wake = trio.Event()
        return woken

    def sync(self, nodes: Iterable[NodeConfig]) -> None:
        """Follow the configured nodes: only enabled ones, in priority order; a node whose
        URL or pin changed starts over as unchecked."""
        old = {e.fingerprint: e for e in self.endpoints}
        out = []
        changed = []
        for cfg in by_priority(n for n in nodes if n.enabled):
            endpoint = old.get(cfg.fingerprint)
            if endpoint is None or endpoint.cfg.base_url != cfg.base_url or \
                    endpoint.cfg.pin != cfg.pin:  # another link: start over
                endpoint = NodeEndpoint(cfg)
                changed.append(endpoint)
            elif endpoint.cfg != cfg:
                changed.append(endpoint)
            endpoint.cfg = cfg
            out.append(endpoint)
        self.endpoints = out
        for endpoint in changed:
            self.changes.publish(endpoint)

    def pause(self) -> None:
        """Load balancing is off: forget what the nodes serve."""
        for endpoint in self.endpoints:
            endpoint.status, endpoint.models, endpoint.latency_ms = UNKNOWN, [], None
            endpoint.model_ids, endpoint.speed = frozenset(), LatencyAverage()
            endpoint.loaded_ids, endpoint.slots = frozenset(), {}
            self.changes.publish(endpoint)
        if self._first_round.is_set():
            self._first_round = trio.Event()

    def round_done(self) -> None:
        self._first_round.set()

    async def first_round(self, timeout: float) -> bool:
        """Right after start (or after load balancing is switched on), wait up to
        ``timeout`` for the first health checks, so a request is not refused only because
        the nodes have not been asked yet. Whether it had to wait (without an await when
        the round is done)."""
        if self._first_round.is_set():
            return False
        with trio.move_on_after(timeout):
            await self._first_round.wait()
        return True

    def endpoint(self, fingerprint: str) -> NodeEndpoint | None:
        for endpoint in self.endpoints:
            if endpoint.fingerprint == fingerprint:
                return endpoint
        return None

    def online(self) -> list[NodeEndpoint]:
        return [e for e in self.endpoints if e.online]

    def remote_models(self) -> list[dict[str, Any]]:
        """Every online node's models, top node first; an id listed once."""
        seen: set[str] = set()
        out = []
        for endpoint in self.online():
            for entry in endpoint.models:
                if entry["id"] not in seen:
                    seen.add(entry["id"])
                    out.append(entry)
        return out

    def holders(self) -> dict[str, list[str]]:
        """model id -> fingerprints of the online nodes serving it, top node first."""
        out: dict[str, list[str]] = {}
        for endpoint in self.online():
            for entry in endpoint.models:
                fps = out.setdefault(entry["id"], [])
                if endpoint.fingerprint not in fps:
                    fps.append(endpoint.fingerprint)
        return out

    def loaded_on(self) -> dict[str, list[str]]:
        """model id -> fingerprints of the online nodes that have it loaded, top node first;
        a model loaded nowhere is left out."""
        out: dict[str, list[str]] = {}
        for endpoint in self.online():
            for model in endpoint.loaded_ids:
                out.setdefault(model, []).append(endpoint.fingerprint)
        return out

    @staticmethod
    def _slots(models: list[dict[str, Any]]) -> dict[str, Slots]:
        """The slots each model reports, as reported (the first entry of an id counts)."""
        out: dict[str, Slots] = {}
        for entry in models:
            counted = node_slots(entry)
            if counted is None or entry["id"] in out:
                continue
            busy, total = counted
            out[entry["id"]] = Slots(total, busy)
        return out

    def checked(self, endpoint: NodeEndpoint, status: str, models: list[dict[str, Any]],
                error: str | None, latency_ms: float | None) -> None:
        """A health check's result for ``endpoint``."""
        was = endpoint.status
        before = (was, endpoint.models, endpoint.last_error, endpoint.latency_ms)
        endpoint.status, endpoint.models, endpoint.last_error = status, models, error
        endpoint.model_ids = frozenset(m["id"] for m in models)
        loaded = frozenset(m["id"] for m in models if is_loaded(m))
        endpoint.loaded_ids = endpoint.model_ids if loaded == endpoint.model_ids else loaded
        endpoint.slots = self._slots(models) if status == ONLINE else {}
        endpoint.latency_ms = latency_ms if status == ONLINE else None
        if endpoint.latency_ms is not None:
            endpoint.speed.add(endpoint.latency_ms)
        if status != was:
            log.info("node %s is %s%s", endpoint.fingerprint, status,
                     f": {error}" if error else "")
        if before != (status, models, error, endpoint.latency_ms):
            self.changes.publish(endpoint)
