"""A model server's OpenAI stream (SSE) as Ollama's (NDJSON), event by event.

The endpoint gives :meth:`StreamTranslator.feed` each piece of the upstream body as it
arrives (de-chunked; pieces of any size) and writes what it returns at once: the lines of
every event the piece finished, nothing held back but an unfinished event. At the model
server's ``data: [DONE]`` (:attr:`StreamTranslator.done`; an Ollama app may leave once it
has the last line), else when the upstream body ends, :meth:`StreamTranslator.finish`
gives the last line; when the stream
breaks (an upstream that went away, a timeout), :meth:`StreamTranslator.error` gives the one
``{"error": ...}`` line Ollama ends a broken stream with.

Lines, one per event that carries text (``model`` the name the client sent, ``created_at``
the time the endpoint gives with the piece):

- chat: ``{"model", "created_at", "message": {"role": "assistant", "content"}, "done":
  false}``, with ``thinking`` when the server sends a reasoning model's
  ``reasoning_content``;
- generate: ``{"model", "created_at", "response", "done": false}`` (and ``thinking``).

Events with no text give no line: the role chunk (``"content": null``), the finish chunk
(``"delta": {}``), the usage chunk (``"choices": []``), ``data: [DONE]``, comments and
other fields. (Ollama itself writes a line per token, and an empty line of text says
nothing; clients such as ollama-python read every line as JSON, so a line is never empty.)
Only the first choice (index 0) is read: Ollama has no ``n``.

Most events are read without parsing them (:mod:`protocol.ollama.text_delta`): once an
event of text has been parsed, a later one that is the same bytes around another JSON
string means the same with that text, and a read of many such events is taken at once.

Tool calls come in pieces (:mod:`protocol.ollama.tool_calls`) and are written whole, as
Ollama writes them, in one line of their own with ``"content": ""`` when the choice
finishes (or at the end, for a stream that ended without saying so).

The last line: ``done: true``, ``done_reason`` and the figures of
:mod:`protocol.ollama.metrics`; chat's has ``message: {role: assistant, content: ""}``,
generate's ``response: ""``, as Ollama's. A stream that ends before it said it was finished
(no ``finish_reason``, no ``[DONE]``) was cut: its end is an error line instead.

An event that says ``{"error": ...}`` (llama.cpp sends one when generation fails midway),
an event that is not a JSON object, or an event over the size caps ends the stream with one
error line (:attr:`failed` says so); after it, as after the last line (:attr:`closed`),
``feed``, ``finish`` and ``error`` give nothing, so the endpoint stops reading and ends the
answer.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any

from protocol.ollama.errors import error_line, upstream_message
from protocol.ollama.metrics import Timing, Usage, done_reason
from protocol.ollama.requests import Answer, Kind
from protocol.ollama.sse_reader import EventTooLarge, SseReader
from protocol.ollama.text_delta import TextDelta, string_text
from protocol.ollama.tool_calls import ToolCallParts, TooManyParts
from protocol.ollama.wire import NotJson, load_json, ndjson_line

__all__ = ["CUT_MESSAGE", "StreamTranslator"]

CUT_MESSAGE = "the model server's stream ended before the answer was complete"


class StreamTranslator:
    """One streamed answer's translation (see the module). Not for embeddings."""

    __slots__ = ("_answer", "_calls", "_chat", "_closed", "_delta", "_done", "_ended", "_failed",
                 "_finish_reason", "_head", "_pieces", "_prefix", "_prefix_at", "_reader",
                 "_suffix", "_tail", "_usage")

    def __init__(self, answer: Answer) -> None:
        if answer.kind not in (Kind.CHAT, Kind.GENERATE):
            raise ValueError(f"{answer.kind.value} answers are not streamed")
        self._answer = answer
        self._reader = SseReader()
        self._usage = Usage()
        self._calls = ToolCallParts()
        self._finish_reason: str | None = None
        self._ended = False  # a finish_reason or [DONE] was seen
        self._done = False  # [DONE] was seen: the model server's last event
        self._failed = False  # an error line was given
        self._closed = False  # the last line or an error line was given: nothing follows
        self._pieces = 0
        self._chat = answer.kind is Kind.CHAT
        # A line of text is written from its parts (see _text_line): what comes before the
        # text for the last created_at seen, and what follows it.
        self._prefix_at: str | None = None
        self._prefix = ""
        self._suffix = '},"done":false}\n' if self._chat else ',"done":false}\n'
        self._head: bytes | None = None
        self._tail = self._suffix.encode()
        self._delta: TextDelta | None = None  # the bytes around a parsed event's text

    def __repr__(self) -> str:
        return (f"StreamTranslator(kind={self._answer.kind.value}, pieces={self._pieces}, "
                f"ended={self._ended}, failed={self._failed}, closed={self._closed})")

    @property
    def failed(self) -> bool:
        """An error line was given; the endpoint should end the answer after it (as a
        broken one). False after a clean :meth:`finish`."""
        return self._failed

    @property
    def closed(self) -> bool:
        """The last line (or an error line) was given: every call gives b"" from now."""
        return self._closed

    @property
    def complete(self) -> bool:
        """The model server said the answer is finished (``finish_reason`` or ``[DONE]``)."""
        return self._ended

    @property
    def done(self) -> bool:
        """The model server sent ``[DONE]``, its stream's last event: the last line may be
        given (:meth:`finish`) without waiting for the body's end."""
        return self._done

    def feed(self, piece: bytes, created_at: str) -> bytes:
        """The NDJSON lines for the events that ``piece`` finishes (often b"")."""
        if self._closed:
            return b""
        out = b""
        template = self._delta
        if (template is not None and self._reader.at_event_start
                and 0 <= piece.find(b"\n\n") < len(piece) - 2):  # more than one event
            head = self._head if created_at == self._prefix_at else self._heads(created_at)
            many = template.many(piece) if head is not None else None
            if head is not None and many is not None:  # a read of many: their lines at once
                strings, piece = many
                out = self._plain_lines(head, strings, template.thinking)
                if not piece:
                    return out
        try:
            events = self._reader.feed(piece)
        except EventTooLarge as err:  # (the piece's lines go with it, as they always did)
            return self.error(f"the model server sent {err}")
        if not events:
            return out
        lines = [self._event(data, created_at) for data in events]
        return out + b"".join(lines)

    def _plain_lines(self, head: bytes, strings: list[bytes], thinking: bool) -> bytes:
        """The lines of plain strings (:meth:`TextDelta.many`), one join: each is
        ``head``, the string in quotes (after ``"","thinking":`` for thinking) and
        :attr:`_tail`; an empty string has none."""
        texts = [text for text in strings if text]
        if not texts:
            return b""
        self._pieces += len(texts)
        start = head + (b'"","thinking":"' if thinking else b'"')
        end = b'"' + self._tail
        return start + (end + start).join(texts) + end

    def finish(self, created_at: str, timing: Timing) -> bytes:
        """The stream's last line(s), once the upstream body ended (see the module)."""
        if self._closed:
            return b""
        if not self._ended:
            return self.error(CUT_MESSAGE)
        out = self._tool_call_line(created_at)
        line = self._base(created_at, "", done=True)
        line["done_reason"] = done_reason(self._finish_reason)
        line.update(self._usage.fields(timing, self._pieces))
        self._closed = True  # the answer is over: nothing may follow the last line
        return out + ndjson_line(line)

    def error(self, message: str) -> bytes:
        """The one line that ends a broken stream (b"" once the stream has ended)."""
        if self._closed:
            return b""
        self._failed = self._closed = True
        return error_line(message)

    def _event(self, data: bytes, created_at: str) -> bytes:
        if self._closed:
            return b""
        template = self._delta
        if template is not None:  # most events: the last one parsed, with other text
            token = template.plain_token(data)
            if token is not None:  # (inline, as it is nearly every event's path)
                if len(token) == 2:  # "": no text, no line
                    return b""
                head = self._head if created_at == self._prefix_at else self._heads(created_at)
                if head is not None:
                    self._pieces += 1
                    if template.thinking:
                        return b"".join((head, b'"","thinking":', token, self._tail))
                    return b"".join((head, token, self._tail))
            token = template.token(data)
            text = None if token is None else string_text(token)
            if text is not None:
                if not text:
                    return b""
                self._pieces += 1
                if template.thinking:
                    return self._text_line(created_at, "", text)
                return self._text_line(created_at, text, "")
        if data == b"[DONE]":
            self._ended = self._done = True
            return b""
        try:
            doc = load_json(data)
        except NotJson:
            return self.error("the model server sent an event that is not JSON")
        if not isinstance(doc, dict):
            return self.error("the model server sent an event that is not a JSON object")
        if "error" in doc:
            return self.error(upstream_message(doc) or "")
        if "usage" in doc or "timings" in doc:
            self._usage.see(doc)
        elif not self._answer.text_completion:
            self._delta = TextDelta.learn(data, doc) or self._delta
        choices = doc.get("choices")
        if not isinstance(choices, list):
            return b""
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                return self._choice(choice, created_at)
        return b""

    def _choice(self, choice: dict[str, Any], created_at: str) -> bytes:
        if self._answer.text_completion:
            text, thinking = choice.get("text"), None
        else:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = {}
            text, thinking = delta.get("content"), delta.get("reasoning_content")
            calls = delta.get("tool_calls")
            if calls is not None and self._chat:  # generate has no tools
                try:
                    self._calls.add(calls)
                except TooManyParts as err:
                    return self.error(f"the model server sent {err}")
        out = b""
        text = text if isinstance(text, str) else ""
        thinking = thinking if isinstance(thinking, str) else ""
        if text or thinking:
            self._pieces += 1
            out = self._text_line(created_at, text, thinking)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish_reason = reason
            self._ended = True
            out += self._tool_call_line(created_at)
        return out

    def _text_line(self, created_at: str, text: str, thinking: str) -> bytes:
        """``ndjson_line(self._base(created_at, text, thinking=thinking))``, the same bytes,
        written from parts: the line before the text is the same for every line of one
        ``created_at``, and the C string encoder is all the text needs. (A line per event:
        building the dict and encoding it whole cost more than the rest of the event.)"""
        self._heads(created_at)
        middle = encode_basestring(text)
        if thinking:
            middle += ',"thinking":' + encode_basestring(thinking)
        try:
            return (self._prefix + middle + self._suffix).encode()
        except UnicodeEncodeError:  # a lone surrogate: json_bytes writes it escaped
            return ndjson_line(self._base(created_at, text, thinking=thinking))

    def _heads(self, created_at: str) -> bytes | None:
        """What comes before the text in a line of ``created_at`` (made once per time: the
        str in ``_prefix``, its bytes returned, None when they cannot be UTF-8)."""
        if created_at != self._prefix_at:
            answer = ('"message":{"role":"assistant","content":' if self._chat
                      else '"response":')
            self._prefix = (f'{{"model":{encode_basestring(self._answer.model)},'
                            f'"created_at":{encode_basestring(created_at)},{answer}')
            self._prefix_at = created_at
            try:
                self._head = self._prefix.encode()
            except UnicodeEncodeError:
                self._head = None
        return self._head

    def _tool_call_line(self, created_at: str) -> bytes:
        if not self._calls:
            return b""
        line = self._base(created_at, "")
        line["message"]["tool_calls"] = self._calls.take()
        return ndjson_line(line)

    def _base(self, created_at: str, text: str, *, thinking: str = "",
              done: bool = False) -> dict[str, Any]:
        return self._answer.line(created_at, text, thinking=thinking, done=done)
