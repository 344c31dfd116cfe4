"""One request on a client connection, as ordered phases (pingora's per-request context):

=========  ==================================================================  ==============
phase      what happens                                                        where
=========  ==================================================================  ==============
read       the request head; the body once the request may proceed             RequestSource
authorize  the Host/Origin guard, the admin token, access keys (SPEC §5)        proxy.access.auth
route      one of the gateway's endpoints, or the routing decision:            proxy.api,
           a local backend, a network node or 503 (SPEC §7.1)                  Router.plan
relay      the upstream exchange and the pipe to the client (SPEC §6)          proxy.relay
settle     the last attempt's outcome, recorded once: breaker and counters     Exchange.settle
report     the request's outcome, decided once (SPEC §9.1); the access-log    Exchange.report
           line and an OpenAI call's record on the hub (SPEC §9)
=========  ==================================================================  ==============

The exchange writes only to its :class:`~proxy.downstream.Downstream`. An error before the
answer started is sent as an answer in the request family's shape (OpenAI's, Anthropic's,
the Responses API's, Ollama's); after that the relay ends the stream. The
cancel scope of the request belongs to the connection (its reader cancels it when the client
leaves); the exchange hands it to the relay. A new phase hook goes here, between the phases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import h11
import trio

from protocol.affinity import session_key
from protocol.api_modes import API_OF_PATH
from protocol.errors import SluiceError, family_of
from protocol.forms import FormReader, form_reader
from protocol.headers import PRIORITY, Header, connection_tokens, header_value
from protocol.queue_order import client_of, request_class
from protocol.rebinding import PREFLIGHT_METHODS, preflight_headers
from protocol.request_info import RequestInfo, parse_request_body, request_path
from protocol.response import Response
from proxy import aliasing
from proxy.access import auth
from proxy.api.call import Body, Takeover
from proxy.api.ollama_routes import TRANSLATED
from proxy.api.routes import NEEDS_LLAMA, NEEDS_MODELS, AnyHandler, Call, access_level, route
from proxy.errors import ClientGone
from proxy.relay import Relay
from proxy.routing.attempts import Outcome
from proxy.timestamps import wall

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext
    from proxy.deadline import RequestScope
    from proxy.downstream import AnswerSink, Downstream
    from proxy.link.listener import Peer
    from proxy.models.managed import Managed
    from proxy.models.ondemand import OnDemand
    from proxy.routing.scheduler import Ticket
    from proxy.translated import Way

DENIED_BODY_CAP = 64 * 1024  # a denied request's body is read (to keep the connection) up to

# An attempt's outcome in the request log's words (SPEC §9.1): a 4xx is the client's, "refused".
_IN_THE_LOG = {Outcome.SUCCESS: "success", Outcome.CLIENT_ERROR: "refused",
               Outcome.FAILURE: "failure", Outcome.ABORTED: "aborted"}


class RequestSource(Protocol):
    """The read side of the connection (:class:`proxy.connection.ClientConnection`)."""

    headers: list[Header]  # the current request's, as a plain list

    async def read_head(self) -> h11.Request: ...

    async def read_body(self, limit: int,
                        feed: Callable[[bytes], None] | None = None) -> bytes: ...


class SwitchProtocols(Exception):
    """An endpoint takes the connection over (:class:`~proxy.api.call.Takeover`): raised by
    :meth:`Exchange.call` instead of an answer, for the connection to hand its stream over.
    ``method`` and ``target`` are the request's, to replay its head."""

    def __init__(self, takeover: Takeover, method: bytes, target: bytes) -> None:
        super().__init__(takeover.name)
        self.takeover = takeover
        self.method = method
        self.target = target


def _small_body(headers: list[Header]) -> bool:
    """No body, or a Content-Length one of at most DENIED_BODY_CAP bytes."""
    length = header_value(headers, b"content-length")
    if length is None:
        return header_value(headers, b"transfer-encoding") is None
    return int(length) <= DENIED_BODY_CAP


class Exchange:
    """One request (see the module docstring)."""

    __slots__ = ("ctx", "form", "grant", "info", "learned", "load_wait", "out", "outcome",
                 "peer", "priority", "queue_ms", "relay", "request", "scope", "source",
                 "started", "translation", "wall")

    def __init__(self, ctx: GatewayContext, source: RequestSource, out: Downstream,
                 scope: RequestScope, peer: Peer) -> None:
        self.ctx = ctx
        self.source = source
        self.out = out
        self.scope = scope
        self.peer = peer
        self.request: h11.Request | None = None  # once its head was read
        self.started = 0.0  # trio clock, when the head was read
        self.wall = 0.0  # the same moment, wall-clock (for the request log)
        self.info: RequestInfo | None = None  # an OpenAI call's model and stream
        self.relay: Relay | None = None
        self.outcome = ""  # the request log's word for it, once decided (see decide)
        self.load_wait: float | None = None  # seconds it waited for its model to load
        self.grant: Grant | None = None  # the access key it presented, with its limits
        self.learned = False  # the routing index learned its answer (learn)
        self.priority: str | None = None  # its class in the queue (SPEC §18), for a model
        self.queue_ms: int | None = None  # ms it waited in the queue (0: not queued)
        self.translation: Way | None = None  # SPEC §17.1: a Messages/Responses request's
        self.form: FormReader | None = None  # an upload's reader (SPEC §17.2), fed its body

    def __repr__(self) -> str:
        return f"Exchange({self.peer.listener.name}, {self.out!r})"

    async def run(self) -> None:
        """All the phases of one request. Raises CloseQuietly or ClientGone when the
        connection must end without (more of) an answer; whether it may carry another request
        afterwards is ``out.response.reusable``."""
        out = self.out
        response = Response()
        out.begin(response)
        denied: SluiceError | None = None
        try:
            request = await self.source.read_head()
            response.request_id = self.ctx.request_log.next_id()
            self.request = request
            path = request_path(request.target)
            response.family = family_of(path)  # our errors' shape
            self.started = trio.current_time()
            self.wall = wall()
            headers = self.source.headers
            response.request_allows(http11=request.http_version == b"1.1",
                                    keep_alive=b"close" not in connection_tokens(headers),
                                    head=request.method == b"HEAD")
            denied = await self.authorize(request, headers)
            form = None
            if request.method == b"POST" and denied is None:
                self.form = form = form_reader(path, headers)  # an upload, read as it comes
            body = await self.source.read_body(self.ctx.config.api.max_body_size,
                                               None if form is None else form.feed)
        except SluiceError as err:  # the request cannot be read: answer, then close
            out.response.close_after()
            if response.request_id is None:
                response.request_id = self.ctx.request_log.next_id()
            try:
                await out.send_error(err)
            finally:
                self.report()
            return
        try:
            if denied is not None:
                raise denied
            await self.answer(request, headers, body)
        except SluiceError as err:
            await out.send_error(err)
        finally:
            self.report()

    async def authorize(self, request: h11.Request, headers: list[Header]) -> SluiceError | None:
        """The DNS-rebinding guard, the admin token and access keys (SPEC §5). A refusal is
        raised when the body is large (the connection closes without reading it), else
        returned, to be answered once the body has been read."""
        ctx, peer = self.ctx, self.peer
        try:
            self.out.response.cors_origin = auth.guard(ctx, peer.listener.host_guard, headers)
            level = access_level(request.method, request_path(request.target))
            grant = auth.authorize(ctx, peer, level, headers)
        except SluiceError as denied:
            if not _small_body(headers):
                raise
            return denied
        if grant is not None:
            self.grant = grant
            await ctx.settings.keys.used(grant.key_id)
        return None

    async def answer(self, request: h11.Request, headers: list[Header], body: bytes) -> None:
        """Route the request, then answer it: preflight, an endpoint of ours, or a relay."""
        path = request_path(request.target)
        if request.method == b"OPTIONS":  # CORS preflight, on any path
            await self.out.send_whole(204, [(b"allow", PREFLIGHT_METHODS)], b"",
                                      cors=preflight_headers())
            return
        handler = route(request.method, path)  # raises 404 / 405
        if handler is not None:
            if handler in TRANSLATED:  # Ollama's model endpoints (proxy/ollama.py)
                from proxy import ollama  # loaded by the first one (proxy/api/ollama_routes)

                await ollama.answer(self, request, path, headers, body)
                return
            await self.call(handler, request.method, path, body, request.target)
            return
        form = self.form
        self.info = info = parse_request_body(path, body) if form is None else form.info(path)
        await self.to_model(request.method, request.target, path, headers, body, info,
                            self.out)

    async def to_model(self, method: bytes, target: bytes, path: str, headers: list[Header],
                       body: bytes, info: RequestInfo, out: AnswerSink, *,
                       keep_alive: float | None = None) -> None:
        """A request for a model, relayed to ``out``: its alias resolved, its access key's
        limits checked, a managed model loaded first if need be (``keep_alive``: a
        client's, Ollama's)."""
        ctx = self.ctx
        asked = info.model
        # SPEC §12: served as another model (self.info stays as asked); a form's model is
        # read, never rewritten (SPEC §17.2: its body goes byte for byte)
        if ctx.config.aliases and info.doc is not None:
            info, body = await aliasing.apply(ctx, info, headers, body)
        if self.grant is not None:  # SPEC §13: the key's models and rpm
            ctx.key_grants.admit(self.grant, asked, info.model)
        ticket = self.enter_queue(headers, info)  # SPEC §18: before a load, in arrival order
        try:
            ondemand = ctx.ondemand
            if ondemand is None or not ondemand.holds(info.model):
                await self.relay_to(ctx, method, target, path, headers, body, info, out, ticket)
                return
            # A managed model on demand (SPEC §11): loaded (or its load joined) first, pinned
            # while the request runs. No await when it is loaded already.
            managed = ondemand.take(info.model)
            if managed is None:
                managed = await self.wait_for_load(ondemand, info.model)
            try:
                if keep_alive is not None:
                    ondemand.lifecycle.keep_alive(managed, keep_alive)
                await self.relay_to(ctx, method, target, path, headers, body, info, out,
                                    ticket)
            finally:
                ondemand.release(managed)
        finally:
            if ticket is not None:
                ctx.scheduler.leave(ticket)

    def enter_queue(self, headers: list[Header], info: RequestInfo) -> Ticket | None:
        """The request's ticket in its model's queue (None with the queue off): its class
        and its client (SPEC §18). Raises 429 ``queue_full``."""
        scheduler = self.ctx.scheduler
        if not scheduler.on:
            return None
        grant = self.grant
        doc = info.doc if isinstance(info.doc, dict) else {}
        self.priority = request_class(None if grant is None else grant.limits.priority,
                                      header_value(headers, PRIORITY), doc)
        client = client_of(None if grant is None else grant.key_id,
                           session_key(headers, doc),
                           self.peer.address or None)
        self.queue_ms = 0
        request_id = self.out.response.request_id
        return scheduler.enter(info.model, client, self.priority,
                               "" if request_id is None else request_id.decode())

    async def wait_for_load(self, ondemand: OnDemand, model: str) -> Managed:
        """Pin managed ``model``, waiting for its load (``load_wait``: how long) inside the
        request's scope: a client that leaves stops waiting, the load goes on."""
        began = trio.current_time()
        managed = None
        try:
            with self.scope.open():
                managed = await ondemand.acquire(model)
        finally:
            self.load_wait = trio.current_time() - began
        if managed is None:  # the client left while it loaded
            raise ClientGone
        return managed

    async def relay_to(self, ctx: GatewayContext, method: bytes, target: bytes, path: str,
                       headers: list[Header], body: bytes, info: RequestInfo,
                       out: AnswerSink, ticket: Ticket | None = None) -> None:
        if ticket is None:
            plan = await ctx.router.plan(info, headers)
        else:  # its turn and a free slot (SPEC §18); a client that leaves is dropped unsent
            placed = None
            try:
                placed = ctx.scheduler.place_now(ticket, info, headers)
                if placed is None:
                    with self.scope.open():
                        placed = await ctx.scheduler.place(ticket, info, headers)
            finally:
                waited = ticket.waited(trio.current_time()) - (self.load_wait or 0.0)
                self.queue_ms = self.out.response.queue_ms = max(0, round(waited * 1000))
            if placed is None:
                raise ClientGone
            plan = placed
        missing = None
        if path in API_OF_PATH and out is self.out:  # SPEC §17.1: the server may lack it
            from proxy.translated import take_way

            taken = await take_way(self, ctx, plan, path, target, body, info)
            if taken is None:
                return  # answered here: count_tokens / input_tokens
            target, body, out, missing = taken
        self.relay = relay = Relay(plan, method, target, path, headers, body,
                                   info, out=out, scope=self.scope,
                                   connections=ctx.connections, timeouts=ctx.config.timeouts,
                                   on_answer=None if plan.conversation is None else self.learn,
                                   missing=missing)
        try:
            if not self.scope.cancelled:  # the client may have left while it was routed
                translation = self.translation
                if translation is not None and info.stream and translation.mode != "native":
                    await translation.relay(relay)  # with its pings (SPEC §17.1)
                else:
                    await relay.run()
        finally:
            self.settle(relay)
        if self.scope.cancelled:
            raise ClientGone

    async def call(self, handler: AnyHandler, method: bytes, path: str, body: bytes,
                   target: bytes) -> None:
        """One of the gateway's own endpoints (``proxy.api``). Raises SwitchProtocols when
        the endpoint takes the connection over."""
        backends = self.ctx.backends
        if handler in NEEDS_MODELS and not backends.ready.is_set():
            await backends.ready.wait()
        if handler in NEEDS_LLAMA and not self.ctx.llama.known:
            await self.ctx.llama.ask()
        query = target.partition(b"?")[2].decode("latin-1")
        reply = handler(Call(self.ctx, method, path, body, query, self.source.headers,
                             self.peer.listener, self.grant, self.peer.address))
        if not isinstance(reply, tuple):  # an async handler
            reply = await reply
        status, payload = reply
        if isinstance(payload, Takeover):
            self.out.response.status = status  # the head the takeover sends (for the log)
            raise SwitchProtocols(payload, method, target)
        if isinstance(payload, Body):
            await self.out.send_whole(status, [(b"content-type", payload.content_type),
                                               *payload.headers], payload.data)
        else:
            await self.out.send_json(status, payload)

    def settle(self, relay: Relay) -> None:
        """Record the outcome of the last attempt, once (see proxy.routing.attempts)."""
        attempt = relay.plan.attempt
        if attempt.finished:
            return
        if relay.done or relay.delivered:
            status = relay.status
            outcome = (Outcome.SUCCESS if status < 400 else
                       Outcome.CLIENT_ERROR if status < 500 else Outcome.FAILURE)
        elif self.scope.cancelled or self.out.gone or relay.interrupted:
            outcome = Outcome.ABORTED
        else:
            outcome = Outcome.FAILURE
        self.outcome = _IN_THE_LOG[outcome]
        now = trio.current_time()
        attempt.finish(outcome, now)
        if self.queue_ms is not None and outcome is Outcome.SUCCESS:  # for Retry-After
            self.ctx.scheduler.served(relay.info.model, now - attempt.started)
        if outcome is Outcome.SUCCESS and relay.plan.conversation is not None:
            self.learn(relay)  # a stream that ended without its last event (else learned)

    def learn(self, relay: Relay) -> None:
        """The relay read the upstream's whole answer (a 2xx or 3xx) and is about to relay
        its end, or the answer succeeded: the routing index learns the conversation (SPEC
        §15), once, before the client can read that end and send its next turn."""
        if not self.learned and relay.status < 400:
            self.learned = True
            self.ctx.router.served(relay.plan, relay.cached_tokens)

    def decide(self, left: bool) -> str:
        """The request's outcome in the request log's words (SPEC §9.1), once it is over;
        ``left``: the client went away (or its scope was cancelled). A relayed request's is
        its last attempt's (:meth:`settle`; none settled: aborted). Any other request's (our
        own endpoints and refusals) is aborted if the client left before the answer began,
        else refused for a 4xx or 5xx answer, else success."""
        if not self.outcome:
            response = self.out.response
            if self.relay is not None or (left and not response.started):
                self.outcome = "aborted"
            else:
                self.outcome = "refused" if response.status >= 400 else "success"
        return self.outcome

    def report(self) -> None:
        """The request is over: its outcome is decided, and its facts go to the report
        phase's batch (:mod:`proxy.observe.reports`: the access-log line, the record on the
        hub)."""
        if self.request is None:
            return
        out = self.out
        self.decide(out.gone or self.scope.cancelled)
        self.ctx.reports.add(self, out.response, out.first_at, out.bytes_sent, out.error_code)
