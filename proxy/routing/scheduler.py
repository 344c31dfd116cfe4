"""The queue in front of every server (SPEC §18): the one owner of "which waiting request
goes to which free slot".

Each request for a model takes a :class:`Ticket` when it arrives (:meth:`Scheduler.enter`,
before a managed model's load, so a load's waiters keep their arrival order and count as
waiting), then asks for its place (:meth:`Scheduler.place`). Placing is the router's choice
among the candidates with a free slot (:meth:`~proxy.routing.router.Router.place` with
``queue=True``); the order among the waiting is :class:`protocol.queue_order.QueueOrder`.
Whenever a slot may have freed — an attempt ended anywhere (``Router.freed``), a server
reported fewer busy slots or came up (the registries' ``changes``), a request arrived — the
waiting requests of each model are dispatched in order until the first that finds no free
slot; a placed request's ticket holds its :class:`~proxy.routing.router.Plan` (already in
flight, so its slot is taken at once) and its task is woken.

A ticket waits at most ``timeouts.request.queue`` (then 504 ``queue_timeout``); a model
with ``scheduling.max_waiting`` waiting refuses more (429 ``queue_full`` with
``Retry-After`` from the recent service times). A client that leaves while waiting is
removed and nothing is sent; a plan handed to a ticket whose client has just left is
finished as aborted, which frees its slot for the next. ``scheduling.queue: false``: no
ticket, the router places every request at once, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from protocol.errors import SluiceError, queue_full, queue_timeout
from protocol.queue_order import Entry, QueueOrder, retry_after
from protocol.slots import capacity
from protocol.views import QueueLine, Waiting
from proxy.routing.attempts import Outcome

if TYPE_CHECKING:
    from protocol.headers import Header
    from protocol.request_info import RequestInfo
    from proxy.routing.router import Plan, Router
    from proxy.settings.store import Settings

SERVICE_SAMPLES = 20  # recent service times kept per model, for Retry-After


class Ticket:
    """One request's place in its model's line, and what it was given."""

    __slots__ = ("done", "entered", "entry", "error", "headers", "info", "line", "model",
                 "placed", "plan", "request_id", "woken")

    def __init__(self, model: str, line: Line, entry: Entry, now: float,
                 request_id: str = "") -> None:
        self.model = model
        self.line = line
        self.entry = entry
        self.request_id = request_id
        self.done = False
        self.entered = now
        self.info: RequestInfo | None = None  # set once it may be placed
        self.headers: Sequence[Header] = ()
        self.plan: Plan | None = None
        self.error: SluiceError | None = None
        self.placed: float | None = None  # when it left the line
        self.woken: trio.Event | None = None  # made when it waits (most never do)

    def __repr__(self) -> str:
        return (f"Ticket({self.model!r}, {self.entry.client!r}, {self.entry.priority}, "
                f"placed={self.placed is not None})")

    @property
    def priority(self) -> str:
        return self.entry.priority

    def waited(self, now: float) -> float:
        """Seconds in the line: until placed, or until ``now``."""
        end = self.placed if self.placed is not None else now
        return max(0.0, end - self.entered)


class Line:
    """The requests waiting for one model."""

    __slots__ = ("in_flight", "order", "service", "tickets")

    def __init__(self, promote_after: float) -> None:
        self.order = QueueOrder(promote_after)
        self.tickets: dict[int, Ticket] = {}  # by entry.seq
        self.service: deque[float] = deque(maxlen=SERVICE_SAMPLES)
        self.in_flight = 0  # its requests placed and not yet done

    def __repr__(self) -> str:
        return f"Line({len(self.tickets)} waiting)"


class Scheduler:
    """The queue (see the module docstring)."""

    def __init__(self, settings: Settings, router: Router) -> None:
        self.settings = settings
        self.router = router
        # One per model with someone waiting, or that was served (its service times and
        # rounds are kept); a ticket holds its own line.
        self.lines: dict[str, Line] = {}
        self._dispatching = False
        self._pending: set[str] = set()  # models to dispatch once the current one is done
        router.freed.subscribe(self._wake)
        router.backends.changes.subscribe(self._wake)
        router.nodes.changes.subscribe(self._wake)

    def __repr__(self) -> str:
        return f"Scheduler({self.lines!r})"

    @property
    def on(self) -> bool:
        return self.settings.config.scheduling.queue

    def enter(self, model: str, client: str, priority: str,
              request_id: str = "") -> Ticket | None:
        """A request for ``model`` arrives: its ticket, or None with the queue off. Raises
        429 ``queue_full`` when ``max_waiting`` requests already wait for the model."""
        config = self.settings.config.scheduling
        if not config.queue:
            return None
        line = self.lines.get(model)
        if line is None:
            line = self.lines[model] = Line(config.promote_after)
        line.order.promote_after = config.promote_after
        if len(line.tickets) >= config.max_waiting:
            raise queue_full(model, retry_after(line.service, len(line.tickets),
                                                self._slots(model)))
        now = trio.current_time()
        entry = line.order.add(client, priority, now)
        ticket = line.tickets[entry.seq] = Ticket(model, line, entry, now, request_id)
        self._changed()
        return ticket

    def place_now(self, ticket: Ticket, info: RequestInfo,
                  headers: Sequence[Header]) -> Plan | None:
        """The common case without an await: a local server holds the model, and this
        request's turn and a free slot are there now (its plan; raises its error). None:
        :meth:`place` must wait."""
        if self.router.backends.holder_of(info.model) is None:
            return None  # the router may have to wait for the first checks (ready_for)
        ticket.info, ticket.headers = info, headers
        self.dispatch(ticket.model)
        if ticket.error is not None:
            self.leave(ticket)
            raise ticket.error
        return ticket.plan

    async def place(self, ticket: Ticket | None, info: RequestInfo,
                    headers: Sequence[Header]) -> Plan:
        """Where the request goes: at once without a ticket (the queue off); else when its
        turn comes and a slot is free. Raises 503 (nobody holds the model), 504
        ``queue_timeout``; a cancellation (the client left) leaves the line, nothing sent.
        Call inside the request's cancel scope."""
        if ticket is None:
            return await self.router.plan(info, headers)
        try:
            await self.router.ready_for(info, headers)
            ticket.info, ticket.headers = info, headers
            self.dispatch(ticket.model)
            if ticket.plan is None and ticket.error is None:
                limit = self.settings.config.timeouts.request.queue
                woken = ticket.woken = trio.Event()
                with trio.move_on_at(ticket.entered + limit):
                    await woken.wait()
        except BaseException:
            if ticket.plan is not None:  # placed as its client left: give the slot back
                ticket.plan.attempt.finish(Outcome.ABORTED, trio.current_time())
            self.leave(ticket)
            raise
        if ticket.error is not None:
            self.leave(ticket)
            raise ticket.error
        if ticket.plan is None:
            self.leave(ticket)
            raise queue_timeout(ticket.model, self.settings.config.timeouts.request.queue)
        return ticket.plan

    def served(self, model: str, seconds: float) -> None:
        """A request of ``model`` was answered in ``seconds`` (for Retry-After)."""
        line = self.lines.get(model)
        if line is None:  # a model that was served exists: its line is kept from now on
            line = self.lines[model] = Line(self.settings.config.scheduling.promote_after)
        line.service.append(seconds)

    def leave(self, ticket: Ticket) -> None:
        """The request is over (answered, refused, failed to load, gone); idempotent."""
        if ticket.done:
            return
        ticket.done = True
        line = ticket.line
        if ticket.placed is None:
            ticket.placed = trio.current_time()
        if ticket.plan is not None:
            line.in_flight -= 1
        if line.tickets.pop(ticket.entry.seq, None) is not None:
            line.order.remove(ticket.entry)
            self._changed()
        if not line.tickets and not line.service and self.lines.get(ticket.model) is line:
            del self.lines[ticket.model]  # never served (no such model?): not kept

    def _wake(self, _: Any = None) -> None:
        """A slot may have freed: the models with someone waiting are dispatched (a cheap
        look when nobody waits: this runs at the end of every attempt)."""
        waiting = [model for model, line in self.lines.items() if line.tickets]
        for model in waiting:
            self.dispatch(model)

    def dispatch(self, model: str) -> None:
        """Place the waiting requests of ``model`` in order, until one finds no free slot.
        Re-entered (a placement's side effects may free or report): done once more after."""
        self._pending.add(model)
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._pending:
                self._dispatch(self._pending.pop())
        finally:
            self._dispatching = False

    def _dispatch(self, model: str) -> None:
        line = self.lines.get(model)
        if line is None:
            return
        now = trio.current_time()
        while line.tickets:
            entry = line.order.next(now)
            assert entry is not None
            ticket = line.tickets[entry.seq]
            if ticket.info is None:  # not ready (its model loads): the next ready one goes
                ready = [e for e in line.order.ordered(now)
                         if line.tickets[e.seq].info is not None]
                if not ready:
                    return
                entry = ready[0]
                ticket = line.tickets[entry.seq]
            info = ticket.info
            assert info is not None
            try:
                plan = self.router.place(info, ticket.headers, queue=True)
            except SluiceError as err:  # nobody holds it now (503): it leaves the line
                ticket.error = err
                line.order.remove(entry)
            else:
                if plan is None:
                    return  # no free slot: the rest wait too
                ticket.plan = plan
                line.in_flight += 1
                line.order.served(entry, now)
            line.tickets.pop(entry.seq)
            ticket.placed = now
            if ticket.woken is not None:
                ticket.woken.set()
            self._changed()

    def _slots(self, model: str) -> int | None:
        """The model's slots over its local servers and the nodes that report them, None
        when none is known."""
        total = 0
        for backend in self.router.backends.holders_of(model):
            slots = capacity(backend.slots, backend.max_concurrent)
            if slots is not None:
                total += slots.total
        if self.settings.config.load_balancing.enabled:
            for endpoint in self.router.nodes.online():
                reported = endpoint.slots.get(model)
                if reported is not None:
                    total += reported.total
        return total or None

    # -- reporting (SPEC §18) -----------------------------------------------------------------

    def _changed(self) -> None:
        """The waiting counts changed: a ``queue`` event, when somebody listens."""
        hub = self.router.hub
        if hub is not None and hub.wants("queue"):
            hub.publish("queue", self.counts())

    def counts(self) -> dict[str, Any]:
        """The ``queue`` event's body: each model's waiting counts by class, and the
        longest wait now."""
        now = trio.current_time()
        models = [{"model": model, "waiting": line.order.waiting(now)}
                  for model, line in sorted(self.lines.items()) if line.tickets]
        return {"models": models, "longestMs": round(self.longest() * 1000)}

    def waiting(self) -> dict[str, dict[str, int]]:
        """model -> class -> how many wait now (models with nobody waiting left out)."""
        now = trio.current_time()
        return {model: line.order.waiting(now) for model, line in self.lines.items()
                if line.tickets}

    def waiting_for(self, model: str) -> int:
        line = self.lines.get(model)
        return 0 if line is None else len(line.tickets)

    def longest(self) -> float:
        """Seconds the longest-waiting request has waited (0 with none)."""
        now = trio.current_time()
        oldest = min((t.entered for line in self.lines.values()
                      for t in line.tickets.values()), default=None)
        return 0.0 if oldest is None else now - oldest

    def snapshot(self) -> list[QueueLine]:
        """Every model's line as ``GET /api/v1/queue`` shows it, in order."""
        now = trio.current_time()
        out = []
        for model, line in sorted(self.lines.items()):
            waiting = [Waiting(t.request_id, line.order.class_at(t.entry, now),
                               t.entry.client, t.waited(now))
                       for t in (line.tickets[e.seq] for e in line.order.ordered(now))]
            out.append(QueueLine(model, waiting, line.in_flight, self._slots(model)))
        return out
