"""The writer of an Ollama answer (SPEC §12): what the relay writes to for an Ollama request.

:class:`OllamaOut` is an :class:`~proxy.downstream.AnswerSink` in place of the client's
:class:`~proxy.downstream.Downstream`: it takes the model server's OpenAI answer as the relay
forwards it and writes Ollama's to the Downstream, a stream event by event as each arrives
(:class:`protocol.ollama.StreamTranslator`; nothing is held but an unfinished event), a whole
answer at once, an error answer in Ollama's shape. The wall clock (each line's
``created_at``) is read here.

States (``OllamaOut.state``; every move by the one table :data:`MOVES`, an illegal one is a
bug and raises):

- ``IDLE`` — nothing of the model server's answer yet;
- ``GATHERING_ERROR`` — its error answer came chunked: the body is gathered to its end, then
  sent whole in Ollama's shape. A head while gathering is the next node's answer (the relay
  failed over when the first one's was cut): the gathered one is dropped;
- ``STREAMING`` — Ollama's head is out; a line goes out per event with text, the last
  line at the model server's ``[DONE]`` (the answer then ends with the upstream body);
- ``DONE`` — the whole answer is out: a whole one, an error answer, or a stream's last line;
- ``BROKEN`` — an error line ended the stream (the model server's error event, a stream cut
  before it said it was finished, a cut the relay reports): the answer ends without its
  last chunk, and whatever the model server sends after it is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol.errors import Family, SluiceError, upstream_bad_response
from protocol.headers import Header
from protocol.ollama import (
    JSON_TYPE,
    NDJSON_TYPE,
    Answer,
    StreamTranslator,
    Timing,
    format_time,
    upstream_error,
    whole_answer,
)
from proxy.answer_writer import MOVES, AnswerWriter, State
from proxy.timestamps import wall

if TYPE_CHECKING:
    from proxy.downstream import Downstream

__all__ = ["MOVES", "OllamaOut", "State", "now_text"]  # the states: proxy/answer_writer.py


_FIRST_EVENTS = 4  # events looked at for the first line before the rest of the read


def now_text() -> str:
    """Now, as Ollama writes a time (an answer's ``created_at``)."""
    return format_time(wall())


class OllamaOut(AnswerWriter):
    """See the module (and :class:`~proxy.answer_writer.AnswerWriter`, the states and the
    plumbing it shares with the translated writer). ``real``: the client's Downstream;
    ``stream``: the client asked for a stream (else Ollama has none); ``timing``: the
    request's figures for the last line."""

    KIND = "Ollama"
    ERROR_TYPE = JSON_TYPE  # Ollama's, with its charset

    def __init__(self, real: Downstream, answer: Answer, stream: bool,
                 timing: Callable[[], Timing]) -> None:
        super().__init__(real)
        self.answer = answer
        self.timing = timing
        self.translator = StreamTranslator(answer) if stream else None

    def __repr__(self) -> str:
        return f"OllamaOut({self.answer.kind.value}, {self.state.value}, {self.real!r})"

    @property
    def family(self) -> Family:
        return Family.OLLAMA

    def upstream_error(self, status: int, body: bytes) -> SluiceError:
        return upstream_error(status, body)

    def _translator(self) -> StreamTranslator:
        translator = self.translator
        if translator is None:  # a stream the client did not ask for: Ollama has none
            raise upstream_bad_response("the model server streamed an answer that was "
                                        "asked whole")
        return translator

    def _lines(self, data: bytes) -> bytes:
        """The lines for ``data``; with the model server's ``[DONE]`` the last line too: an
        Ollama app may leave once it has it, before the upstream body's last chunk."""
        translator = self._translator()
        lines = translator.feed(data, now_text()) if data else b""
        if translator.done and not translator.closed:
            lines += translator.finish(now_text(), self.timing())
        return lines

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"") -> None:
        self._new_answer()
        if status >= 400:
            await self._send_error(self.upstream_error(status, body), headers)
            return
        data = whole_answer(self.answer, body, now_text(), self.timing())
        self._move(State.DONE)
        await self.real.send_whole(200, self._headers(headers, JSON_TYPE), data)

    async def send_head(self, status: int, headers: list[Header], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        self._new_answer()
        if status >= 400:  # an error answer that came chunked: its whole body first
            await self._gather(status, headers, body, end=end)
            return
        lines, rest = self._first_lines(body)
        self._move(State.STREAMING)
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
            lines += translator.feed(data[at:cut], now_text())
            at = cut
            if lines:
                break
        return lines, data[at:]

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        state = self.state
        if state is State.STREAMING:
            lines = self._lines(data)
            if lines:
                await self.real.send_body(self.real.frame(lines), on_block)
                self._after()
        elif state is State.GATHERING_ERROR:
            self._error_body += data
        elif state is not State.BROKEN:  # after an error line the rest is dropped
            raise self._wrong("body bytes")

    def _after(self) -> None:
        """An error line ends the answer (the translator gives nothing after it)."""
        translator = self.translator
        if self.state is State.STREAMING and translator is not None and translator.failed:
            self._move(State.BROKEN)
            self.response.broken()

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        state = self.state
        if state is State.GATHERING_ERROR:
            await self._send_gathered(data)
            return
        if state is State.BROKEN:
            return
        if state is not State.STREAMING:
            raise self._wrong("the end")
        translator = self._translator()
        lines = self._lines(data)
        if not translator.failed:
            lines += translator.finish(now_text(), self.timing())
        real = self.real
        if translator.failed:  # the model server's error event, or a stream cut short
            self._move(State.BROKEN)
            await real.send_broken(lines, "upstream_error")
            return
        self._move(State.DONE)
        await real.end(real.frame(lines), on_block)

    async def error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """A cut stream: Ollama's one ``{"error": ...}`` line."""
        if self.state is State.BROKEN:  # an error line went out already
            self.response.broken()
            return
        if self.state is not State.STREAMING:
            raise self._wrong("a cut")
        self._move(State.BROKEN)
        await self.real.send_broken(self._translator().error(err.message), err.code)
