"""What the lifecycle (:mod:`proxy.models.lifecycle`) knows of one managed model
(:class:`Managed`, made from its catalogue entry's :class:`~protocol.model_spec.ModelSpec`),
and what it needs of the thing that starts model servers (:class:`Servers`,
:class:`Server`)."""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any, Protocol

import attrs
import trio

from protocol.model_spec import ModelSpec
from protocol.model_state import ModelState

# Upper bounds (seconds) of the load-time histogram: a small model in a second, a large one
# read from a slow disk in minutes (timeouts.model_load is at most 10 minutes).
LOAD_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
                                   600.0)

OUTCOMES = ("success", "failure", "timeout")  # how a load ends (the metrics' outcome label)

EXITED = "its server exited"  # lastError of a model whose loaded server exited by itself


class Server(Protocol):
    """A running model server."""

    url: str
    pid: int | None

    def memory(self) -> int:
        """Its measured memory (RSS) in bytes."""
        ...

    async def wait(self) -> None:
        """Until it exits by itself."""
        ...

    async def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after a grace) and wait until it is gone."""
        ...


class LoadFailed(Exception):
    """A server could not start; the message is the reason shown to clients (no secret)."""


class Servers(Protocol):
    def start(self, spec: ModelSpec) -> Any:
        """An awaitable that returns a :class:`Server` once it answers /health, or raises
        LoadFailed."""
        ...

    def waited_for(self, spec: ModelSpec) -> str:
        """What a start of ``spec`` waits for ("" when it cannot say), for a timeout."""
        ...

    def last_line(self, spec: ModelSpec) -> str:
        """The last line of ``spec``'s server's log ("" when there is none)."""
        ...


@attrs.define
class Managed:
    """One managed model and what the lifecycle knows of it."""

    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    in_flight: int = 0
    last_used: float = -math.inf
    loaded_at: float | None = None
    memory: int = 0  # measured once loaded
    failure: str | None = None
    failed_at: float = -math.inf
    started_at: float = -math.inf  # when its last start began
    restarts: int = 0  # times its server exited by itself and it was loaded again
    server: Server | None = None
    changed: trio.Event = attrs.field(factory=trio.Event)  # set at its next state change
    unload_asked: bool = False  # unload once no request is in flight (the API's unload)
    removed: bool = False  # its file is gone: dropped from the catalogue once unloaded
    loads: LoadFigures = attrs.field(factory=lambda: LoadFigures())
    keep_alive: float | None = None  # a client's keep_alive for this load (Ollama's), else
                                     # the spec's

    @property
    def idle_time(self) -> float:
        """Seconds idle before it is unloaded: a client's keep_alive, else its setting."""
        return self.spec.keep_alive if self.keep_alive is None else self.keep_alive

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def held(self) -> int:
        """Bytes it holds or will hold: measured when loaded, else its estimate; a declared
        size always (a process's RSS says nothing of GPU memory)."""
        if self.state is ModelState.LOADED and not self.spec.declared:
            return self.memory
        return self.spec.estimate

    def unloads_at(self) -> float:
        """When it is unloaded if nothing uses it (inf: in use, or kept forever; -inf: now,
        asked to or its file is gone)."""
        if self.state is not ModelState.LOADED or self.in_flight:
            return math.inf
        if self.unload_asked or self.removed:
            return -math.inf
        return self.last_used + self.idle_time


@attrs.define
class LoadFigures:
    """A model's loads so far, for the metrics (SPEC §11): how many ended each way, and the
    seconds each took, in the buckets of :data:`LOAD_BUCKETS`."""

    outcomes: dict[str, int] = attrs.field(factory=dict)  # success | failure | timeout
    buckets: list[int] = attrs.field(factory=lambda: [0] * (len(LOAD_BUCKETS) + 1))
    seconds: float = 0.0

    def add(self, outcome: str, seconds: float) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.buckets[bisect_left(LOAD_BUCKETS, seconds)] += 1
        self.seconds += seconds
