"""The Ollama API's model endpoints (SPEC §12): ``/api/chat``, ``/api/generate``,
``/api/embed`` and ``/api/embeddings``, run through the same routing, failover, breakers and
timeouts as every ``/v1/*`` request, by the same relay.

The request is translated once (:func:`protocol.ollama.translate_request`) into the OpenAI
request the model server gets. The relay then writes to an
:class:`~proxy.ollama_out.OllamaOut` in place of the client's
:class:`~proxy.downstream.Downstream`: it takes the model server's answer as the relay
forwards it and writes Ollama's instead, a stream event by event as each arrives, a whole
answer at once. The request log and the metrics see the model server's own answer
(its usage), as for any request. A request with no messages (or prompt, or input) only
loads the model, and with ``keep_alive: 0`` unloads it; a request's ``keep_alive`` is how
long a managed model stays loaded once idle (:meth:`proxy.models.lifecycle.Lifecycle.
keep_alive`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import h11
import trio

from protocol.errors import model_not_available
from protocol.headers import Header
from protocol.ollama import JSON_TYPE, PATHS, LoadOnly, Timing, load_answer, translate_request
from protocol.request_info import parse_request_body
from proxy.ollama_out import OllamaOut, now_text

if TYPE_CHECKING:
    from protocol.request_info import RequestInfo
    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext
    from proxy.deadline import RequestScope
    from proxy.downstream import AnswerSink, Downstream
    from proxy.models.managed import Managed
    from proxy.models.ondemand import OnDemand
    from proxy.relay import Relay


class ModelExchange(Protocol):
    """What this module uses of the request's :class:`~proxy.exchange.Exchange`."""

    ctx: GatewayContext
    out: Downstream
    scope: RequestScope
    info: RequestInfo | None
    started: float
    load_wait: float | None
    grant: Grant | None
    relay: Relay | None

    async def wait_for_load(self, ondemand: OnDemand, model: str) -> Managed: ...

    async def to_model(self, method: bytes, target: bytes, path: str, headers: list[Header],
                       body: bytes, info: RequestInfo, out: AnswerSink, *,
                       keep_alive: float | None = None) -> None: ...


_NS = 1_000_000_000


async def answer(exchange: ModelExchange, request: h11.Request, path: str, headers: list[Header],
                 body: bytes) -> None:
    """One Ollama model request, translated and relayed (see the module)."""
    translated = translate_request(PATHS[path], body)  # raises 400 for bad input
    if isinstance(translated, LoadOnly):
        await _load_only(exchange, translated)
        return
    target = translated.path.encode()
    exchange.info = info = parse_request_body(translated.path, translated.body)
    started = exchange.started

    def timing() -> Timing:
        # Without llama.cpp's own timings the prompt took until the first event with data
        # (keep-alive comments before it are still the prompt being read).
        load = exchange.load_wait or 0.0
        relay = exchange.relay
        first = None if relay is None else relay.first_event_at
        return Timing(total_ns=int((trio.current_time() - started) * _NS),
                      load_ns=int(load * _NS),
                      prompt_ns=None if first is None else int((first - started - load) * _NS))

    out = OllamaOut(exchange.out, translated.answer, translated.stream, timing)
    await exchange.to_model(request.method, target, translated.path, headers,
                            translated.body, info, out, keep_alive=translated.keep_alive)


async def _load_only(exchange: ModelExchange, load: LoadOnly) -> None:
    """Ollama's way to load a model (a request with nothing to answer), or with
    ``keep_alive: 0`` to unload it. A limited access key may load only its models."""
    ondemand = exchange.ctx.ondemand
    name = load.model
    if exchange.grant is not None:
        exchange.ctx.key_grants.check_model(exchange.grant, name)
    if ondemand is None or not ondemand.holds(name):
        if exchange.ctx.backends.holder_of(name) is None:
            raise model_not_available(name)
    elif load.unload:
        await ondemand.unload(name)
    else:
        model = await exchange.wait_for_load(ondemand, name)
        try:
            if load.keep_alive is not None:
                ondemand.lifecycle.keep_alive(model, load.keep_alive)
        finally:
            ondemand.release(model)
    await exchange.out.send_whole(200, [(b"content-type", JSON_TYPE)],
                                  load_answer(load, now_text()))
