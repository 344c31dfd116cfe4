"""The writer of a translated answer (SPEC §17.1): what the relay writes to when the model
server was asked in Chat Completions for a client that speaks another API.

:class:`TranslatedOut` is an :class:`~proxy.downstream.AnswerSink` in place of the client's
:class:`~proxy.downstream.Downstream`, as :class:`proxy.ollama_out.OllamaOut` is for the
Ollama API: it takes the server's chat answer as the relay forwards it and writes the
client's (a translator of :data:`protocol.translate.TRANSLATORS`): a stream event by event,
each chat chunk parsed and fed to the translator's ``Stream`` as it arrives (only an
unfinished event is held), a whole answer at once, an error answer in the client's family
(the server's context overflow in the words agents compact on). Every answer says
``x-sluice-translated: chat``.

States (``TranslatedOut.state``, with the chunked error answer's gathering shared with the
Ollama writer in :class:`proxy.answer_writer.AnswerWriter`): ``IDLE`` → ``GATHERING_ERROR``
(a chunked error answer, gathered to its end; a head after it is the next node's answer) →
``STREAMING`` → ``DONE`` or ``BROKEN`` (an error event ended it: the server's error event, a
cut, a relay failure; whatever follows is dropped).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from protocol.errors import Family, SluiceError
from protocol.headers import Header
from protocol.ollama.sse_reader import EventTooLarge, SseReader
from protocol.ollama.stream import CUT_MESSAGE
from protocol.ollama.text_delta import TextDelta
from protocol.ollama.wire import NotJson, load_json
from protocol.translate.chat import context_overflow, error_message, upstream_error
from proxy.answer_writer import JSON_TYPE, AnswerWriter, State

if TYPE_CHECKING:
    from protocol.translate import StreamTranslator, Translator
    from proxy.downstream import Downstream

__all__ = ["TRANSLATED", "State", "TranslatedOut"]

TRANSLATED = b"x-sluice-translated"
SSE_TYPE = b"text/event-stream"
_DONE = b"[DONE]"
_PEEL = 4  # events of a read taken one by one while no text chunk is learned (see _events)


class TranslatedOut(AnswerWriter):
    """See the module. ``real``: the client's Downstream; ``model``: the name the client
    asked for; ``stream``: the client asked for a stream; ``prompt_chars``: the translated
    prompt's characters (the estimate when the server says no usage)."""

    KIND = "translated"
    EXTRA_HEADERS = ((TRANSLATED, b"chat"),)

    def __init__(self, real: Downstream, translator: Translator, model: str, *, stream: bool,
                 prompt_chars: int, options: dict[str, Any] | None = None,
                 on_waiting: Callable[[], None] | None = None) -> None:
        super().__init__(real)
        self.translator = translator
        self.model = model
        self.stream_asked = stream
        self.prompt_chars = prompt_chars
        self.options = options or {}  # the translator's answer_options of the request
        self.stream: StreamTranslator | None = None  # once a stream began
        self.usage_estimated = False
        self._said_finish = False  # a chunk had a finish_reason
        self._closed = False  # the stream's finish or fail was called: nothing follows
        self._failed = False  # ... and it was fail
        self._reader = SseReader()
        # The fast path of text chunks (a stream with ``plain``): the bytes around a parsed
        # chunk's text (protocol/ollama/text_delta.py), and the stream's plain(strings, thinking)
        self._template: TextDelta | None = None
        self._plain: Callable[[list[bytes], bool], bytes] | None = None
        # Called once the head went out with nothing more yet to say (a ping would be sent
        # now): the keep-alive's pinger starts (proxy.translated.Way)
        self.on_waiting = on_waiting
        self._pinging = False  # a keep-alive is being written: the relay's writes wait
        self._pinged: trio.Event | None = None  # set when that write is over

    def __repr__(self) -> str:
        return f"TranslatedOut({self.translator.NAME}, {self.state.value}, {self.real!r})"

    @property
    def family(self) -> Family:
        return self.translator.FAMILY

    def upstream_error(self, status: int, body: bytes) -> SluiceError:
        return upstream_error(self.translator, status, body)

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"") -> None:
        self._new_answer()
        if status >= 400:
            await self._send_error(self.upstream_error(status, body), headers)
            return
        try:
            answer = load_json(body)
        except NotJson:
            answer = None
        if not isinstance(answer, dict):
            await self._send_error(SluiceError(502, "the model server's chat answer is not a "
                                               "JSON object", type="server_error",
                                               code="upstream_protocol_error"), headers)
            return
        if self.stream_asked:  # a stream asked, a whole answer given: one chunk of it
            await self._whole_as_stream(answer, headers)
            return
        out = self.translator.from_chat(answer, model=self.model, prompt_chars=self.prompt_chars,
                                        **self.options)
        if answer.get("usage") is None:
            self.usage_estimated = True
        self._move(State.DONE)
        await self.real.send_whole(200, self._headers(headers, JSON_TYPE),
                                   json.dumps(out, separators=(",", ":"),
                                              ensure_ascii=False).encode())

    async def _whole_as_stream(self, answer: dict[str, Any], headers: list[Header]) -> None:
        choices = answer.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else {}
        message = choice.get("message") if isinstance(choice, dict) else None
        delta = dict(message) if isinstance(message, dict) else {}
        if isinstance(delta.get("tool_calls"), list):
            delta["tool_calls"] = [{**c, "index": n} for n, c in enumerate(delta["tool_calls"])
                                   if isinstance(c, dict)]
        stream = self._stream()
        data = stream.start() + stream.feed({"choices": [{
            "index": 0, "delta": delta,
            "finish_reason": choice.get("finish_reason") if isinstance(choice, dict) else None}],
            "usage": answer.get("usage")})
        data += self._finish(stream)
        self._move(State.DONE)
        await self.real.send_head(200, self._headers(headers, SSE_TYPE), b"OK",
                                  self.real.frame(data), end=True)

    def _stream(self) -> StreamTranslator:
        stream = self.stream
        if stream is None:
            stream = self.stream = self.translator.Stream(
                self.model, prompt_chars=self.prompt_chars, **self.options)
            self._plain = getattr(stream, "plain", None)
        return stream

    async def send_head(self, status: int, headers: list[Header], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        self._new_answer()
        if status >= 400:  # an error answer that came chunked: its whole body first
            await self._gather(status, headers, body, end=end)
            return
        stream = self._stream()
        self._move(State.STREAMING)
        data = stream.start() + self._events(body)
        real = self.real
        if end:  # the whole stream in one read: its end in the same write when it is sound
            tail = self._tail(stream)
            if not self._failed:
                self._move(State.DONE)
                await real.send_head(200, self._headers(headers, SSE_TYPE), b"OK",
                                     real.frame(data + tail), end=True, on_block=on_block)
                return
        await real.send_head(200, self._headers(headers, SSE_TYPE), b"OK", real.frame(data),
                             end=False, on_block=on_block)
        if end:
            await self._end_with(tail, on_block)
            return
        self._after()
        if self.on_waiting is not None and not self._closed and stream.ping():
            self.on_waiting()

    def _finish(self, stream: StreamTranslator) -> bytes:
        self._closed = True
        out = stream.finish()
        self.usage_estimated = stream.usage_estimated
        return out

    def _fail(self, stream: StreamTranslator, code: str, message: str) -> bytes:
        self._closed = self._failed = True
        return stream.fail(code, message)

    def _events(self, data: bytes) -> bytes:
        """The client's events for the chat events ``data`` finishes."""
        stream = self.stream
        if stream is None or not data or self._closed:
            return b""
        out = b""
        template, plain = self._template, self._plain
        if template is None and plain is not None and self._reader.between_events:
            out, data = self._peel(data)
            if not data:
                return out
            template = self._template
        if (template is not None and plain is not None and self._reader.at_event_start
                and 0 <= data.find(b"\n\n") < len(data) - 2):  # a read of many events
            many = template.many(data)
            if many is not None:
                strings, data = many
                out += plain(strings, template.thinking)
                if not data:
                    return out
        reader = self._reader
        if (reader.at_event_start and data[:6] == b"data: " and data.count(b"\n") == 2
                and data[-2:] == b"\n\n" and b"\r" not in data):
            events = [data[6:-2]]  # one whole event: most reads of a slow stream
        else:
            # a keep-alive comment begins the read (not a ":" of an event cut before it)
            comment = data[:1] == b":" and reader.between_events
            try:
                events = reader.feed(data)
            except EventTooLarge:
                return out + self._fail(stream, "upstream_protocol_error", "the model server "
                                        "sent an event larger than the gateway reads")
            if not events:  # a keep-alive comment, or part of an event
                return out + stream.ping() if comment else out
        for event in events:
            if template is not None and plain is not None:
                token = template.plain_token(event)
                if token is not None:  # the learned chunk with another plain text
                    out += plain([token[1:-1]], template.thinking)
                    continue
            if event == _DONE:
                return out + self._finish(stream)
            try:
                chunk = load_json(event)
            except NotJson:
                chunk = None
            if not isinstance(chunk, dict):
                return out + self._fail(stream, "upstream_protocol_error",
                                        "the model server sent an event that is not JSON")
            if "error" in chunk:  # llama.cpp's error event midway
                overflow = context_overflow(400, event)
                if overflow is not None:
                    return out + self._fail(stream, "context_length_exceeded",
                                            self.translator.overflow_error(*overflow).message)
                return out + self._fail(stream, "upstream_error", error_message(chunk["error"]))
            choices = chunk.get("choices")
            if choices and type(choices) is list and type(choices[0]) is dict \
                    and choices[0].get("finish_reason"):
                self._said_finish = True
            elif template is None and plain is not None:
                template = self._template = TextDelta.learn(event, chunk)
            out += stream.feed(chunk)
        return out

    def _peel(self, data: bytes) -> tuple[bytes, bytes]:
        """A read of many events while no text chunk is learned yet: its first data events
        one by one (perhaps learned from), so that the rest of the read can take the
        many-events path (a fast server's whole stream may come in one read). The client's
        events for them, and the rest (b"" once the stream is over)."""
        out = b""
        peeled = 0
        while (self._template is None and peeled < _PEEL and data[:6] == b"data: "
               and 0 <= (cut := data.find(b"\n\n")) < len(data) - 2):
            out += self._events(data[:cut + 2])
            data, peeled = data[cut + 2:], peeled + 1
            if self._closed:
                return out, b""
        return out, data

    def _after(self) -> None:
        """An error event ends the answer."""
        if self._failed and self.state is State.STREAMING:
            self._move(State.BROKEN)
            self.response.broken()

    async def ping(self) -> bool:
        """A keep-alive while the prompt is read (the stream's ``ping``), written between
        the relay's writes; False once there is no more to send (content began, the answer
        ended)."""
        stream = self.stream
        if self.state is State.IDLE or self.state is State.GATHERING_ERROR:
            return True  # no answer yet: perhaps later
        if self.state is not State.STREAMING or stream is None or self._closed:
            return False
        data = stream.ping()
        if not data:
            return False
        self._pinging = True
        self._pinged = pinged = trio.Event()
        try:
            await self.real.send_body(self.real.frame(data))
        finally:
            self._pinging = False
            pinged.set()
        return True

    async def _wait_for_ping(self) -> None:
        pinged = self._pinged
        if pinged is not None:
            await pinged.wait()

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        state = self.state
        if state is State.STREAMING:
            out = self._events(data)
            if self._pinging:
                await self._wait_for_ping()
            if out:
                await self.real.send_body(self.real.frame(out), on_block)
            self._after()
        elif state is State.GATHERING_ERROR:
            self._error_body += data
        elif state is not State.BROKEN and state is not State.DONE:
            raise self._wrong("body bytes")

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        state = self.state
        if state is State.GATHERING_ERROR:
            await self._send_gathered(data)
            return
        if state is State.BROKEN or state is State.DONE:
            return
        if state is not State.STREAMING:
            raise self._wrong("the end")
        stream = self._stream()
        out = self._events(data)
        await self._end_with(out + self._tail(stream), on_block)

    def _tail(self, stream: StreamTranslator) -> bytes:
        """The stream's last events, once the chat answer's bytes are over: [DONE] is the
        end; a finish_reason without it will do; else the stream was cut."""
        if self._closed:
            return b""
        return self._finish(stream) if self._said_finish else self._fail(
            stream, "upstream_error", CUT_MESSAGE)

    async def _end_with(self, out: bytes, on_block: Callable[[], None] | None) -> None:
        real = self.real
        if self._pinging:
            await self._wait_for_ping()
        if self._failed:
            self._move(State.BROKEN)
            await real.send_broken(out, "upstream_error")
            return
        self._move(State.DONE)
        await real.end(real.frame(out), on_block)

    async def error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """A cut stream: the client's error event."""
        if self.state is not State.STREAMING:
            self.response.broken()
            return
        self._move(State.BROKEN)
        if self._pinging:
            await self._wait_for_ping()
        data = b"" if self._closed else self._fail(self._stream(), err.code or "upstream_error",
                                                   err.message)
        await self.real.send_broken(data, err.code)

