"""The Ollama API's model endpoints (SPEC §12): ``/api/chat``, ``/api/generate``,
``/api/embed`` and ``/api/embeddings``, run through the same routing, failover, breakers and
timeouts as every ``/v1/*`` request, by the same relay.

The request is translated once (:func:`protocol.ollama.translate_request`) into the OpenAI
request the model server gets. The relay then writes to an :class:`OllamaOut` in place of
the client's :class:`~proxy.downstream.Downstream`: it takes the model server's answer as
the relay forwards it and writes Ollama's instead, a stream event by event as each arrives
(:class:`protocol.ollama.StreamTranslator`; nothing is held but an unfinished event), a
whole answer at once. The request log and the metrics see the model server's own answer
(its usage), as for any request. A request with no messages (or prompt, or input) only
loads the model, and with ``keep_alive: 0`` unloads it; a request's ``keep_alive`` is how
long a managed model stays loaded once idle (:meth:`proxy.models.lifecycle.Lifecycle.
keep_alive`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import h11
import trio

from protocol.errors import Family, SluiceError, model_not_available, upstream_bad_response
from protocol.headers import SERVED_BY, Header
from protocol.ollama import (
    JSON_TYPE,
    NDJSON_TYPE,
    PATHS,
    Answer,
    LoadOnly,
    StreamTranslator,
    Timing,
    format_time,
    load_answer,
    translate_request,
    upstream_error,
    whole_answer,
)
from protocol.request_info import parse_request_body

if TYPE_CHECKING:
    from protocol.request_info import RequestInfo
    from proxy.context import GatewayContext
    from proxy.deadline import RequestScope
    from proxy.downstream import Downstream
    from proxy.key_grants import Grant
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
                       body: bytes, info: RequestInfo, out: Downstream | OllamaOut, *,
                       keep_alive: float | None = None) -> None: ...

_NS = 1_000_000_000
_FIRST_EVENTS = 4  # events looked at for the first line before the rest of the read


def _now_text() -> str:
    return format_time(time.time())


class OllamaOut:
    """What the relay writes to for an Ollama request (the interface of
    :class:`~proxy.downstream.Downstream` the relay uses): the model server's answer in,
    Ollama's out to ``real``. The bytes it is given are never chunk-framed
    (:attr:`chunked` is false, so the relay hands over payload only)."""

    chunked = False

    def __init__(self, real: Downstream, answer: Answer, stream: bool,
                 timing: Callable[[], Timing]) -> None:
        self.real = real
        self.response = real.response
        self.answer = answer
        self.timing = timing
        self.translator = StreamTranslator(answer) if stream else None
        self._error_status = 0  # the model server's error answer, gathered until its end
        self._error_body = bytearray()
        self._over = False  # an error line ended the answer early: the rest is dropped
        self._error_headers: list[Header] = []

    def __repr__(self) -> str:
        return f"OllamaOut({self.answer.kind.value}, {self.real!r})"

    @property
    def closing(self) -> bool:
        return self.real.closing

    def frame(self, data: bytes) -> bytes:
        return data

    def _headers(self, given: list[Header], content_type: bytes) -> list[Header]:
        return [(b"content-type", content_type), *((k, v) for k, v in given if k == SERVED_BY)]

    def _translator(self) -> StreamTranslator:
        translator = self.translator
        if translator is None:  # a stream the client did not ask for: Ollama has none
            raise upstream_bad_response("the model server streamed an answer that was "
                                        "asked whole")
        return translator

    def _lines(self, data: bytes) -> bytes:
        translator = self._translator()
        return translator.feed(data, _now_text()) if data else b""

    async def _send_error(self, err: SluiceError, headers: list[Header]) -> None:
        self.real.error_code = err.code
        await self.real.send_whole(err.status, self._headers(headers, JSON_TYPE),
                                   err.body(Family.OLLAMA))

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"") -> None:
        if status >= 400:
            await self._send_error(upstream_error(status, body), headers)
            return
        data = whole_answer(self.answer, body, _now_text(), self.timing())
        await self.real.send_whole(200, self._headers(headers, JSON_TYPE), data)

    async def send_head(self, status: int, headers: list[Header], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        if status >= 400:  # an error answer that came chunked: its whole body first
            self._error_status = status
            self._error_headers = headers
            self._error_body += body
            if end:
                await self._send_error(upstream_error(status, bytes(self._error_body)), headers)
            return
        lines, rest = self._first_lines(body)
        real = self.real
        await real.send_head(200, self._headers(headers, NDJSON_TYPE), b"OK", real.frame(lines),
                             end=False, on_block=on_block)
        if end:
            await self.end(rest, on_block)
        else:
            await self.send_body(rest, on_block)
            self._after()

    def _first_lines(self, data: bytes) -> tuple[bytes, bytes]:
        """The lines of the answer's first events, up to the first one that gives a line,
        and the rest of ``data`` (the first read), to be translated once the head has gone
        out with them: a read can hold many events (a fast server; a gateway that fell
        behind), and the client's first line should not wait for all their translation.
        The translator takes a stream split anywhere: a cut at ``\n\n`` ends an event in
        llama.cpp's and OpenAI's streams; with other line ends the read goes whole."""
        translator = self._translator()
        lines = b""
        at = 0
        for _ in range(_FIRST_EVENTS):
            cut = data.find(b"\n\n", at) + 2
            if cut < 2:
                break
            lines += translator.feed(data[at:cut], _now_text())
            at = cut
            if lines:
                break
        return lines, data[at:]

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        if self._error_status:
            self._error_body += data
            return
        if self._over:
            return
        lines = self._lines(data)
        if lines:
            await self.real.send_body(self.real.frame(lines), on_block)
            self._after()

    def _after(self) -> None:
        """An error line ends the answer (the translator gives nothing after it)."""
        translator = self.translator
        if translator is not None and translator.failed and not self._over:
            self._over = True
            self.response.broken()

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        if self._error_status:
            self._error_body += data
            await self._send_error(upstream_error(self._error_status, bytes(self._error_body)),
                                   self._error_headers)
            return
        if self._over:
            return
        translator = self.translator
        lines = self._lines(data)
        if translator is not None and not translator.failed:
            lines += translator.finish(_now_text(), self.timing())
        real = self.real
        if translator is not None and translator.failed:
            await real.send_broken(lines, "upstream_error")
            return
        await real.end(real.frame(lines), on_block)

    async def error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """A cut stream: Ollama's one ``{"error": ...}`` line."""
        translator = self.translator
        if self._over or translator is None:
            self.response.broken()
            return
        await self.real.send_broken(translator.error(err.message), err.code)


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
                                  load_answer(load, _now_text()))
