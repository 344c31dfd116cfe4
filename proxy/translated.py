"""Translation on the request's way (SPEC §17.1): where the routed server lacks the client's
API, the relay sends the request to the server's ``/v1/chat/completions`` in Chat
Completions (:mod:`protocol.translate`) and writes the client's answer through a
:class:`~proxy.translated_out.TranslatedOut`.

:class:`Way` is made by the exchange once the request is routed, for a path of
:data:`protocol.translate.TRANSLATORS` or :data:`~protocol.translate.COUNT_PATHS`. The
server's ``apis`` (:class:`protocol.api_modes.ApiModes`) decide: ``native`` relays as
it came (the relay untouched), ``translate`` relays the chat request; not known yet relays
as it came, and a 404 or 405 before any byte (:meth:`Way.missing`, the relay's hook) marks
the server and sends the request again translated, once. A failover after that stays
translated (a sluice node takes Chat Completions too). A count (``count_tokens``) on a
translated server is the server's ``/tokenize`` of the translated prompt (llama.cpp: its
``/apply-template`` first; vLLM: messages), else 404.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from protocol.api_modes import NATIVE, ApiModes
from protocol.errors import SluiceError, bad_request, not_found
from protocol.headers import Header
from protocol.translate import CHAT_PATH, COUNT_PATHS, Translator, translator_for
from protocol.translate.chat import text_of_prompt
from proxy.answer_writer import JSON_TYPE
from proxy.routing.attempts import Outcome
from proxy.translated_out import TRANSLATED, TranslatedOut
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, whole_exchange

if TYPE_CHECKING:
    from collections.abc import Callable

    from protocol.request_info import RequestInfo
    from proxy.context import GatewayContext
    from proxy.downstream import AnswerSink, Downstream
    from proxy.relay import Relay
    from proxy.routing.router import Plan
    from proxy.routing.upstreams import Upstream

__all__ = ["Way", "served_context"]

log = logging.getLogger("sluice.translate")

COUNT_CAP = 16 * 1024 * 1024  # a tokenize answer lists every token
PING_EVERY = 10.0  # seconds between keep-alives while the prompt is read (SPEC §17.1)


def _modes(upstream: Upstream) -> ApiModes:
    modes = getattr(upstream, "apis", None)  # a local backend's; a node is native
    return modes if isinstance(modes, ApiModes) else NATIVE


def served_context(ctx: GatewayContext, upstream: Upstream, model: str) -> int | None:
    """The context one request can use on the server, when known: its model entry's
    ``context_length``, ``max_model_len`` or ``meta.n_ctx``; a managed bundled model's
    configured context shared by its slots."""
    for entry in getattr(upstream, "models", ()) or ():
        if entry.get("id") != model:
            continue
        meta = entry.get("meta")
        for value in (entry.get("context_length"), entry.get("max_model_len"),
                      meta.get("n_ctx") if isinstance(meta, dict) else None):
            if isinstance(value, int) and value > 0:
                return value
    ondemand = ctx.ondemand
    if ondemand is not None and ondemand.holds(model):
        spec = ondemand.lifecycle.models[model].spec
        if spec.engine.name == "bundled":
            return max(spec.context // max(spec.parallel, 1), 1)
    return None


class Way:
    """One request's translation (see the module). ``active``: the relay sends the chat
    request (from the start, or since :meth:`missing` switched it)."""

    @classmethod
    def make(cls, ctx: GatewayContext, plan: Plan, path: str, body: bytes, info: RequestInfo,
             asked: str, real: Downstream) -> Way | None:
        """The request's way, or None when no translator takes its path."""
        translator = translator_for(path)
        if translator is None:
            return None
        return cls(ctx, plan, translator, path in COUNT_PATHS, body, info, asked, real)

    def __init__(self, ctx: GatewayContext, plan: Plan, translator: Translator, counting: bool,
                 body: bytes, info: RequestInfo, asked: str, real: Downstream) -> None:
        self.ctx = ctx
        self.plan = plan
        self.translator = translator
        self.counting = counting
        self.info = info
        self.asked = asked  # the model as the client named it (before an alias)
        self.real = real
        self.body = body
        self.active = False
        self.options: dict[str, Any] = {}  # the translator's answer_options of the request
        self.sink: TranslatedOut | None = None
        self.mode = _modes(plan.upstream).of(translator.NAME)
        self._nursery: trio.Nursery | None = None  # while relay() runs: the pinger's
        self._pinger = False  # the pinger was started

    def __repr__(self) -> str:
        return f"Way({self.translator.NAME}, {self.mode}, active={self.active})"

    @property
    def name(self) -> str:
        return self.translator.NAME

    @property
    def usage_estimated(self) -> bool:
        return self.sink is not None and self.sink.usage_estimated

    def _chat(self, upstream: Upstream) -> dict[str, Any]:
        doc = self.info.doc  # parsed once already (never changed; the model is set below)
        if doc is None:
            try:
                doc = json.loads(self.body)
            except ValueError:
                raise bad_request("the request body is not JSON") from None
        if not isinstance(doc, dict):
            raise bad_request("the request body must be a JSON object")
        self.options = self.translator.answer_options(doc)
        model = self.info.model
        chat = self.translator.to_chat(doc, context=served_context(self.ctx, upstream, model))
        chat["model"] = model
        return chat

    def start(self) -> tuple[bytes, bytes, TranslatedOut]:
        """Translate now: the chat target, body and the answer's writer."""
        chat = self._chat(self.plan.upstream)
        self.active = True
        self.sink = TranslatedOut(self.real, self.translator, self.asked,
                                  stream=self.info.stream, prompt_chars=text_of_prompt(chat),
                                  options=self.options,
                                  on_waiting=None if self._nursery is None else self._waiting)
        return CHAT_PATH.encode(), json.dumps(chat, separators=(",", ":"),
                                              ensure_ascii=False).encode(), self.sink

    async def relay(self, relay: Relay) -> None:
        """Run a streamed request's relay with the keep-alive of its translated answer
        beside it: a ping every :data:`PING_EVERY` seconds while the prompt is read. The
        pinger starts only when the answer's head went out with nothing after it yet
        (:meth:`TranslatedOut.send_head <proxy.translated_out.TranslatedOut.send_head>`
        calls :meth:`_waiting`): a stream that comes whole, or with its first content,
        costs no task."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.sink is not None:
                self.sink.on_waiting = self._waiting
            try:
                await relay.run()
            finally:
                self._nursery = None  # no cycle (way -> sink -> way) left for the collector
                if self.sink is not None:
                    self.sink.on_waiting = None
                nursery.cancel_scope.cancel()

    def _waiting(self) -> None:
        nursery = self._nursery
        if nursery is not None and not self._pinger:
            self._pinger = True
            nursery.start_soon(self._pings)

    async def _pings(self) -> None:
        while True:
            await trio.sleep(PING_EVERY)
            sink = self.sink
            if sink is not None and not await sink.ping():
                return  # the answer's content began (or it ended): no more pings

    def missing(self, relay: Relay) -> bool:
        """The relay's hook: the server answered 404/405 before any byte. When its API was
        not known, it lacks it: mark it and switch the relay to the chat request."""
        if self.active or self.counting:
            return False
        upstream = relay.plan.upstream
        if _modes(upstream).of(self.name) is not None:
            return False
        from proxy.registry.backends import LocalBackend

        if isinstance(upstream, LocalBackend):
            self.ctx.backends.lacks(upstream, self.name)
        try:
            relay.target, relay.body, relay.out = self.start()
        except SluiceError:
            return False  # refused in translation: the server's own 404 goes to the client
        return True

    async def count(self) -> None:
        """``count_tokens`` on a translated server: the server's own count of the
        translated prompt, else 404 (SPEC §17.1)."""
        plan = self.plan
        upstream = plan.upstream
        attempt = plan.attempt
        outcome = Outcome.FAILURE
        try:
            chat = self._chat(upstream)
            tokens = await _tokenize(self.ctx.connections, upstream, chat)
            outcome = Outcome.SUCCESS
            attempt.answered(trio.current_time())
        except SluiceError:
            outcome = Outcome.CLIENT_ERROR
            raise
        finally:
            attempt.finish(outcome, trio.current_time())
        if tokens is None:
            raise not_found(f"the model server of {self.info.model!r} has no /tokenize: "
                            "it cannot count the translated prompt")
        self.active = True
        body = json.dumps(self.translator.count_answer(tokens)).encode()
        await self.real.send_whole(200, [(b"content-type", JSON_TYPE), (TRANSLATED, b"chat")],
                                   body)


async def _post(connections: ConnectionPool, upstream: Upstream, path: bytes,
                doc: dict[str, Any]) -> tuple[int, Any]:
    address = upstream.address
    if address is None:
        raise UpstreamFailure("the model server is restarting", connect=True)
    data = json.dumps(doc).encode()
    headers: list[Header] = [(b"host", address.authority), (b"accept", JSON_TYPE),
                             (b"content-type", JSON_TYPE),
                             (b"content-length", str(len(data)).encode())]
    if upstream.api_key:
        headers.append((b"authorization", b"Bearer " + upstream.api_key.encode()))
    head, body = await whole_exchange(connections, address, b"POST", address.target(path),
                                      headers, data, cap=COUNT_CAP)
    try:
        return head.status_code, json.loads(body)
    except ValueError:
        return head.status_code, None


async def _tokenize(connections: ConnectionPool, upstream: Upstream,
                    chat: dict[str, Any]) -> int | None:
    """llama.cpp: ``/apply-template`` then ``/tokenize`` of its prompt; vLLM: ``/tokenize``
    of the messages. None when the server has neither."""
    try:
        status, doc = await _post(connections, upstream, b"/apply-template",
                                  {k: chat[k] for k in ("messages", "tools") if k in chat})
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
            status, doc = await _post(connections, upstream, b"/tokenize",
                                      {"content": doc["prompt"]})
            if status == 200 and isinstance(doc, dict) and isinstance(doc.get("tokens"), list):
                return len(doc["tokens"])
        status, doc = await _post(connections, upstream, b"/tokenize",
                                  {"model": chat["model"], "messages": chat["messages"]})
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get("count"), int):
            return int(doc["count"])
    except UpstreamFailure as failure:
        log.info("count_tokens: %s", failure)
    return None


class Routed(Protocol):
    """What :func:`take_way` reads and sets of the request's exchange."""

    info: RequestInfo | None  # the request as the client asked it (before an alias)
    out: Downstream
    translation: Way | None


async def take_way(exchange: Routed, ctx: GatewayContext, plan: Plan, path: str,
                   target: bytes, body: bytes, info: RequestInfo
                   ) -> tuple[bytes, bytes, AnswerSink, Callable[[Relay], bool] | None] | None:
    """A Messages or Responses request once routed (SPEC §17.1): the target, body and sink
    it goes with, and the relay's safety net while the server's API is not known; None when
    it was answered here (a count). The exchange keeps its :class:`Way` for the report."""
    asked = info.model if exchange.info is None else exchange.info.model
    out: AnswerSink = exchange.out
    way = exchange.translation = Way.make(ctx, plan, path, body, info, asked, exchange.out)
    if way is None:  # no translator for this API yet: relayed as it came
        return target, body, out, None
    if way.mode == "translate":
        if way.counting:
            await way.count()
            return None
        target, body, out = way.start()
        return target, body, out, None
    return target, body, out, way.missing if way.mode is None else None
