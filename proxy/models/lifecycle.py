"""Models on demand (SPEC §11): the one owner of every managed model's state, and the only
one that starts or stops a model server.

A request for a model pins it (:meth:`Lifecycle.acquire`, ended by :meth:`Lifecycle.release`).
A loaded model is taken at once, with no await: the warm path pays nothing. Otherwise the
request starts its load, or joins the one under way: the load runs in the lifecycle's own
task, so a client that leaves does not cancel it, and every request waiting for it shares
it. To make room, idle loaded models are unloaded least recently used first, as
:func:`protocol.model_room.make_room` decides; a model that cannot fit is refused with 503
``model_memory_exhausted``. A model idle for its ``keep_alive`` is unloaded by the idle
watcher; one with a request in flight never is. A request that comes while its model unloads
waits for the server to go and loads it again.

The states and their moves are :mod:`protocol.model_state`; what starts and stops a server
is a :class:`Servers` (llama.cpp processes in the gateway, fakes in tests). Time comes from
``trio.current_time()``, so the timers are tested on trio's MockClock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import trio

from protocol.errors import (
    SluiceError,
    gateway_stopping,
    model_load_failed,
    model_load_timeout,
    model_memory_exhausted,
)
from protocol.model_room import Loaded, NoRoom, make_room, no_room_message
from protocol.model_spec import ModelSpec
from protocol.model_state import ModelState, Move, may_retry, move
from proxy.models.managed import EXITED, LoadFailed, Managed, Server, Servers

__all__ = ["EXITED", "Lifecycle", "LoadFailed", "Managed", "ModelSpec", "Server", "Servers"]

log = logging.getLogger("sluice.models")


class Lifecycle:
    """Every managed model's state. ``budget`` (bytes) and ``max_loaded`` (0 = no limit)
    bound what is loaded; ``load_timeout()`` is timeouts.model_load, read at each wait;
    ``on_change`` is told of every state change (events, metrics)."""

    def __init__(self, specs: Iterable[ModelSpec], servers: Servers, *, budget: int,
                 max_loaded: int, load_timeout: Callable[[], float],
                 on_change: Callable[[Managed], None] = lambda m: None,
                 on_removed: Callable[[Managed], None] = lambda m: None,
                 on_idle: Callable[[Managed], None] = lambda m: None) -> None:
        self.models: dict[str, Managed] = {s.name: Managed(s, failure=s.problem)
                                           for s in specs}
        self.servers = servers
        self.budget = budget
        self.max_loaded = max_loaded
        self.load_timeout = load_timeout
        self.on_change = on_change
        self.on_removed = on_removed
        self.on_idle = on_idle  # a loaded model's last request ended: its idle clock starts
        self._tasks: trio.Nursery | None = None
        self._wake = trio.Event()  # the idle watcher looks again

    def __repr__(self) -> str:
        states = ", ".join(f"{m.name}={m.state.value}" for m in self.models.values())
        return f"Lifecycle({states})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Loads, unloads and the idle watcher run here until cancelled; then every model
        server is stopped."""
        try:
            async with trio.open_nursery() as nursery:
                self._tasks = nursery
                for model in self.models.values():
                    if model.spec.preload:
                        self._start_load(model)
                nursery.start_soon(self._watch_idle)
                task_status.started()
        finally:
            self._tasks = None
            with trio.CancelScope(shield=True):
                for model in self.models.values():
                    if model.server is not None:
                        await model.server.stop()

    # ------------------------------------------------------------------ requests

    def take(self, name: str) -> Managed | None:
        """Pin model ``name`` if it is loaded (the warm path: nothing else), else None."""
        model = self.models[name]
        if model.state is not ModelState.LOADED:
            return None
        model.in_flight += 1
        return model

    async def acquire(self, name: str) -> Managed:
        """Pin model ``name`` for a request, loading it first if need be (up to
        timeouts.model_load). Raises SluiceError: 503 model_load_failed or
        model_memory_exhausted, 504 model_load_timeout. Pair with :meth:`release`."""
        taken = self.take(name)
        if taken is not None:
            return taken
        model = self.models[name]
        model.in_flight += 1
        try:
            limit = self.load_timeout()
            with trio.fail_after(limit):
                await self._until_loaded(model)
        except trio.TooSlowError:
            self.release(model)
            raise model_load_timeout(name, limit, self._waited(model.spec)) from None
        except BaseException:
            self.release(model)
            raise
        return model

    def release(self, model: Managed) -> None:
        """A request for it ended (answered, failed or its client left)."""
        model.in_flight -= 1
        model.last_used = trio.current_time()
        if model.in_flight == 0:
            self._poke()
            if model.state is ModelState.LOADED:
                self.on_idle(model)

    async def _until_loaded(self, model: Managed) -> None:
        while True:
            state = model.state
            if state is ModelState.LOADED:
                return
            if state is ModelState.FAILED and not may_retry(model.failed_at,
                                                             trio.current_time()):
                raise model_load_failed(model.name, model.failure or "unknown")
            if state in (ModelState.UNLOADED, ModelState.FAILED):
                error = self._start_load(model)
                if error is not None:
                    raise error
            changed = model.changed
            await changed.wait()
            if model.state is ModelState.FAILED:
                raise model_load_failed(model.name, model.failure or "unknown")

    # ------------------------------------------------------------------ loads and unloads

    def _set(self, model: Managed, how: Move) -> None:
        model.state = move(model.state, how)
        changed, model.changed = model.changed, trio.Event()
        changed.set()
        self.on_change(model)
        self._poke()

    def _start_load(self, model: Managed) -> SluiceError | None:
        """Begin loading (in the lifecycle's own task), making room first; a refusal is
        returned when the model cannot fit."""
        if self._tasks is None:
            return gateway_stopping()
        victims = []
        if model.spec.problem is None:  # a file known to be unusable fails without evicting
            room = make_room(model.name, model.spec.estimate, self._holding(),
                             budget=self.budget, max_loaded=self.max_loaded)
            if isinstance(room, NoRoom):
                return model_memory_exhausted(no_room_message(room))
            victims = [self.models[name] for name in room.unload]
        self._set(model, Move.LOAD)
        for victim in victims:
            self._set(victim, Move.UNLOAD)
        self._tasks.start_soon(self._load, model, victims)
        return None

    def _holding(self) -> list[Loaded]:
        """The models that hold memory now, as the room decision sees them."""
        return [Loaded(m.name, m.held, m.in_flight, m.last_used,
                       busy=m.state is not ModelState.LOADED)
                for m in self.models.values()
                if m.state in (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING)]

    async def _load(self, model: Managed, victims: list[Managed]) -> None:
        for victim in victims:
            await self._stop(victim)
        started = model.started_at = trio.current_time()
        try:
            with trio.fail_after(self.load_timeout()):
                server = await self.servers.start(model.spec)
        except (LoadFailed, trio.TooSlowError) as exc:
            failed = isinstance(exc, LoadFailed)
            reason = str(exc) if failed else self._too_slow(model.spec)
            model.failure = reason
            model.failed_at = trio.current_time()
            model.loads.add("failure" if failed else "timeout", model.failed_at - started)
            log.warning("model %s failed to load: %s", model.name, reason)
            self._set(model, Move.START_FAILED)
            return
        if model.failure == EXITED:
            model.restarts += 1
        model.server = server
        model.memory = server.memory()
        model.loaded_at = trio.current_time()
        model.last_used = model.loaded_at
        model.failure = None
        model.loads.add("success", model.loaded_at - started)
        log.info("model %s loaded in %.2fs (pid %s)", model.name,
                 model.loaded_at - started, server.pid)
        self._set(model, Move.READY)
        assert self._tasks is not None
        self._tasks.start_soon(self._watch_exit, model, server)

    def _too_slow(self, spec: ModelSpec) -> str:
        """Why a load timed out (its lastError)."""
        waited = self._waited(spec)
        return (f"it did not answer within timeouts.model_load ({self.load_timeout():g}s)"
                + (f": {waited}" if waited else ""))

    def _waited(self, spec: ModelSpec) -> str:
        """What a load of ``spec`` waited for and its server's last log line, as far as the
        servers tell (a server that never answered where it was looked for says so)."""
        waited = self.servers.waited_for(spec)
        last = self.servers.last_line(spec)
        words = [f"waited for {waited}" if waited else "",
                 f"its last log line: {last}" if last else ""]
        return "; ".join(w for w in words if w)

    async def _stop(self, model: Managed, reload: bool = False) -> None:
        server, model.server = model.server, None
        if server is not None:
            await server.stop()
        model.memory = 0
        model.loaded_at = None
        model.unload_asked = False
        model.keep_alive = None  # a client's keep_alive lasts for the load it was given in
        self._set(model, Move.STOPPED)
        if model.removed and model.state is ModelState.UNLOADED:
            self._drop(model)
        elif reload and model.state is ModelState.UNLOADED:
            self._start_load(model)  # no room now: it loads with its next request

    async def _watch_exit(self, model: Managed, server: Server) -> None:
        """A loaded server that exits by itself, seen at once: the model is failed (SPEC
        §11.1; its requests in flight lose their connection and end with their dialect's
        error). The next request loads it again, at most one start per RETRY_AFTER_FAILURE
        counted from the start of the server that died (a server that keeps dying is not
        restarted in a loop)."""
        await server.wait()
        if model.server is server and model.state is ModelState.LOADED:
            model.server = None
            model.memory = 0
            model.loaded_at = None
            model.failure = EXITED
            model.failed_at = model.started_at
            log.warning("model %s: its server (pid %s) exited", model.name, server.pid)
            self._set(model, Move.CRASHED)

    # ------------------------------------------------------------------ idle

    def _poke(self) -> None:
        wake, self._wake = self._wake, trio.Event()
        wake.set()

    async def _watch_idle(self) -> None:
        """Unload each model once it has been idle for its keep_alive."""
        while True:
            wake = self._wake
            now = trio.current_time()
            for model in list(self.models.values()):
                if model.unloads_at() <= now:
                    self.unload(model.name, reload=model.spec.preload and not (
                        model.unload_asked or model.removed))
            due = min((m.unloads_at() for m in self.models.values()), default=math.inf)
            with trio.move_on_at(due):
                await wake.wait()

    def unload(self, name: str, *, reload: bool = False) -> bool:
        """Unload a loaded model with no request in flight (False: nothing to do now);
        ``reload``: load it again once it is gone (a ``preload`` model unloaded by idle)."""
        model = self.models[name]
        if model.state is not ModelState.LOADED or model.in_flight or self._tasks is None:
            return False
        self._set(model, Move.UNLOAD)
        self._tasks.start_soon(self._stop, model, reload)
        return True

    def keep_alive(self, model: Managed, seconds: float) -> None:
        """A client's keep_alive for ``model`` (Ollama's): how long it stays loaded once
        idle, until it is unloaded (inf: forever; 0: right after its last request)."""
        model.keep_alive = seconds
        self._poke()

    def ask_unload(self, name: str) -> Managed:
        """Unload model ``name`` as soon as no request is in flight (the API's unload; a
        loading model once it is loaded); a later request loads it again."""
        model = self.models[name]
        if model.state in (ModelState.LOADING, ModelState.LOADED):
            model.unload_asked = True
            self._poke()
        return model

    # ------------------------------------------------------------------ the catalogue

    def add(self, spec: ModelSpec) -> Managed:
        """A model new in the catalogue, or new settings of one it has (a rescan): a model
        with a server keeps it (its next load uses the new spec); an unloaded one shows its
        file's problem, a failed one may be tried again at once."""
        model = self.models.get(spec.name)
        if model is None:
            model = self.models[spec.name] = Managed(spec, failure=spec.problem)
            self.on_change(model)
            return model
        changed = model.spec != spec
        model.spec = spec
        model.removed = False
        if changed and model.state is ModelState.UNLOADED:
            model.failure = spec.problem
        elif changed and model.state is ModelState.FAILED:
            model.failure = spec.problem or model.failure
            model.failed_at = -math.inf
        if changed:
            self.on_change(model)
            self._poke()
        return model

    def remove(self, name: str) -> None:
        """Model ``name``'s file is gone: it leaves the catalogue now if it has no server,
        else once it is idle (a request in flight finishes first)."""
        model = self.models[name]
        model.removed = True
        if model.state in (ModelState.UNLOADED, ModelState.FAILED):
            self._drop(model)
        else:
            self._poke()

    def _drop(self, model: Managed) -> None:
        if self.models.get(model.name) is model:
            del self.models[model.name]
            self.on_removed(model)
