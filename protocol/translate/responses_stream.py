"""A streamed Chat Completions answer as the Responses API's events (SPEC §17.1 "Chat →
Responses"), pure: parsed chat chunks in, SSE bytes out; no clock, no I/O.

Every event is ``event: <type>`` and ``data: {"type", "sequence_number", …}``, the sequence
numbers counting from 0. ``response.created`` and ``response.in_progress`` first; then one
open output item at a time: reasoning (``output_item.added``, ``content_part.added``,
``reasoning_text.delta``…, ``reasoning_text.done``, ``content_part.done``,
``output_item.done`` with the whole item) and text (the same with ``output_text``) as they
come; tool calls are gathered per chat ``index`` (their pieces come in any order: arguments
before the name, all in one chunk, two calls interleaved) and sent at the end, each as
``output_item.added``, one ``function_call_arguments.delta`` with the whole arguments
(``custom_tool_call_input.delta`` for a custom tool), its ``.done``, ``output_item.done``.
Last ``response.completed`` (status ``incomplete`` on ``length``), or ``response.failed``.
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any

from protocol.translate.chat import Usage, read_chunk
from protocol.translate.responses_answer import (
    NO_TOOLS,
    ToolNames,
    call_item,
    custom_input,
    estimated,
    message_item,
    new_id,
    reasoning_item,
    reasoning_tokens,
    response_object,
    status_of,
    text_part,
    usage_object,
)

__all__ = ["Stream"]


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_STRING = json.encoder.encode_basestring  # a str as JSON text (in C): a delta's value


def _dumps(value: object) -> bytes:
    # "replace": a lone surrogate (a server's escaped emoji cut in two) cannot be UTF-8
    return _ENCODER.encode(value).encode("utf-8", "replace")


class _Gathered:
    """One streamed tool call's pieces so far."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []


_NONE, _TEXT, _REASONING = 0, 1, 2


class Stream:
    """One streamed answer (see the module): ``start()``, ``feed(chunk)`` per parsed chat
    chunk, ``ping()``, then ``finish()`` or ``fail(code, message)``; after either, every
    method gives ``b""``. ``usage`` and ``usage_estimated`` are set by ``finish``/``fail``
    (estimated as characters ÷ 4 when no usage chunk came)."""

    __slots__ = (
        "_calls",
        "_chars",
        "_created_at",
        "_done",
        "_finish",
        "_got",
        "_item",
        "_model",
        "_open",
        "_output",
        "_parts",
        "_prefix",
        "_prompt_chars",
        "_reasoning_tokens",
        "_seq",
        "_tools",
        "id",
        "usage",
        "usage_estimated",
    )

    def __init__(self, model: str, tools: ToolNames = NO_TOOLS, *, prompt_chars: int = 0,
                 created_at: float = 0) -> None:
        self.id = new_id("resp_")
        self._model = model
        self._tools = tools
        self._prompt_chars = prompt_chars
        self._created_at = created_at
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # the items done
        self._open = _NONE  # the kind of the open item
        self._item = ""  # the open item's id
        self._parts: list[str] = []  # the open item's text so far
        self._prefix = b""  # the open item's delta event up to the delta's value
        self._calls: dict[int, _Gathered] = {}
        self._finish: str | None = None
        self._got: Usage | None = None
        self._reasoning_tokens = 0
        self._done = False
        self._chars = 0  # characters answered, for the estimate
        self.usage = Usage()
        self.usage_estimated = False

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        return self._event_of(kind, _dumps(fields)[1:])

    def _event_of(self, kind: str, rest: bytes) -> bytes:
        """The event with its fields' JSON after the type and number (``rest``: a JSON
        object's members and its closing brace)."""
        seq = self._seq
        self._seq = seq + 1
        head = f'event: {kind}\ndata: {{"type":"{kind}","sequence_number":{seq},'.encode()
        return head + rest + b"\n\n"

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        if self._done or self._seq:
            return b""
        shown = _dumps({"response": response_object(self.id, self._model, self._created_at,
                                                    "in_progress", [])})[1:]  # once for both
        return (self._event_of("response.created", shown)
                + self._event_of("response.in_progress", shown))

    def ping(self) -> bytes:
        """A keep-alive: the Responses API has no ping event, so an SSE comment."""
        return b"" if self._done else b": ping\n\n"

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One parsed chat chunk: the events it makes (often none)."""
        if self._done:
            return b""
        piece = read_chunk(chunk)
        if piece.error is not None:
            return self.fail("server_error", piece.error)
        out = b""
        if piece.reasoning:
            out += self._delta(_REASONING, piece.reasoning)
        if piece.text:
            out += self._delta(_TEXT, piece.text)
        if piece.tools:
            for index, ident, name, arguments in piece.tools:
                gathered = self._calls.get(index)
                if gathered is None:
                    gathered = self._calls[index] = _Gathered()
                if ident is not None and gathered.id is None:
                    gathered.id = ident
                if name is not None and gathered.name is None:
                    gathered.name = name
                if arguments:
                    gathered.arguments.append(arguments)
                    self._chars += len(arguments)
            out += self._close()
        if piece.finish is not None:
            self._finish = piece.finish
        if piece.usage is not None:
            self._got = piece.usage
            self._reasoning_tokens = reasoning_tokens(chunk.get("usage"))
        return out

    def _delta(self, kind: int, text: str) -> bytes:
        out = b""
        if self._open != kind:
            out = self._close() + self._open_item(kind)
        self._parts.append(text)
        self._chars += len(text)
        seq = self._seq
        self._seq = seq + 1
        return (out + self._prefix + _STRING(text).encode("utf-8", "replace")
                + b',"sequence_number":%d}\n\n' % seq)

    def plain(self, strings: list[bytes], thinking: bool) -> bytes:
        """The fast path of :meth:`feed` for chunks of text (or reasoning) alone, as the
        relay's writer finds them (protocol/ollama/text_delta.py): ``strings`` are the
        bodies of plain JSON strings (no escapes, UTF-8), so each is its delta's JSON as
        it is."""
        if self._done:
            return b""
        if len(strings) != 1 or not strings[0]:
            strings = [raw for raw in strings if raw]
            if not strings:
                return b""
        kind = _REASONING if thinking else _TEXT
        out = b""
        if self._open != kind:
            out = self._close() + self._open_item(kind)
        text = b"".join(strings).decode()  # each string is whole UTF-8: one decode for all
        self._parts.append(text)
        self._chars += len(text)
        seq = self._seq
        count = len(strings)
        self._seq = seq + count
        if count == 1:  # a read of one event
            return out + self._prefix + b'"' + strings[0] + b'","sequence_number":%d}\n\n' % seq
        # each event is the open item's prefix, the string and its number: one formatting
        # of the prefix (its "%" escaped) repeated, for all of them at once, in C
        form = self._prefix.replace(b"%", b"%%") + b'"%s","sequence_number":%d}\n\n'
        return out + (form * count) % tuple(chain.from_iterable(
            zip(strings, range(seq, seq + count), strict=True)))

    def _open_item(self, kind: int) -> bytes:
        index = len(self._output)
        if kind == _TEXT:
            self._item = ident = new_id("msg_")
            added = message_item(ident, None, "in_progress")
            part: dict[str, Any] = text_part("")
            name = "response.output_text.delta"
            extra = ',"logprobs":[]'
        else:
            self._item = ident = new_id("rs_")
            added = reasoning_item(ident, None, "in_progress")
            part = {"type": "reasoning_text", "text": ""}
            name = "response.reasoning_text.delta"
            extra = ""
        self._open = kind
        self._parts = []
        self._prefix = (f'event: {name}\ndata: {{"type":"{name}","item_id":"{ident}",'
                        f'"output_index":{index},"content_index":0{extra},"delta":').encode()
        return (self._event("response.output_item.added", {"output_index": index,
                                                           "item": added})
                + self._event("response.content_part.added", {
                    "item_id": ident, "output_index": index, "content_index": 0,
                    "part": part}))

    def _close(self, status: str = "completed") -> bytes:
        """Close the open text or reasoning item (b"" when none is open)."""
        if self._open == _NONE:
            return b""
        text = "".join(self._parts)
        index = len(self._output)
        where = {"item_id": self._item, "output_index": index, "content_index": 0}
        if self._open == _TEXT:
            done = self._event("response.output_text.done", {**where, "text": text,
                                                              "logprobs": []})
            part: dict[str, Any] = text_part(text)
            item = message_item(self._item, text, status)
        else:
            done = self._event("response.reasoning_text.done", {**where, "text": text})
            part = {"type": "reasoning_text", "text": text}
            item = reasoning_item(self._item, text, status)
        self._open = _NONE
        self._parts = []
        self._output.append(item)
        return (done + self._event("response.content_part.done", {**where, "part": part})
                + self._event("response.output_item.done", {"output_index": index,
                                                            "item": item}))

    def _send_calls(self) -> bytes:
        """Every gathered tool call with a name, in index order, each opened and done."""
        out = b""
        for position, key in enumerate(sorted(self._calls)):
            gathered = self._calls[key]
            if gathered.name is None:
                continue  # a call without a name cannot be answered
            tool = self._tools.restore(gathered.name)
            ident = new_id("ctc_" if tool.custom else "fc_")
            call_id = gathered.id or f"call_{position}"
            arguments = "".join(gathered.arguments)
            index = len(self._output)
            added = call_item(ident, call_id, tool, None, "in_progress")
            out += self._event("response.output_item.added", {"output_index": index,
                                                              "item": added})
            where = {"item_id": ident, "output_index": index}
            if tool.custom:
                value = custom_input(arguments)
                if value:
                    out += self._event("response.custom_tool_call_input.delta",
                                       {**where, "delta": value})
                out += self._event("response.custom_tool_call_input.done",
                                   {**where, "input": value})
            else:
                if arguments:
                    out += self._event("response.function_call_arguments.delta",
                                       {**where, "delta": arguments})
                out += self._event("response.function_call_arguments.done",
                                   {**where, "arguments": arguments})
            item = call_item(ident, call_id, tool, arguments, "completed")
            self._output.append(item)
            out += self._event("response.output_item.done", {"output_index": index,
                                                             "item": item})
        self._calls.clear()
        return out

    def _settle_usage(self) -> dict[str, Any]:
        self.usage, self.usage_estimated = estimated(self._got, self._prompt_chars, self._chars)
        return usage_object(self.usage, self._reasoning_tokens)

    def finish(self) -> bytes:
        """The end of the chat stream: close the open item, send the tool calls, then
        ``response.completed`` with the whole response (status ``incomplete`` when the
        server stopped at its token limit)."""
        if self._done:
            return b""
        out = self._close() + self._send_calls()
        self._done = True
        status, incomplete = status_of(self._finish)
        shown = response_object(self.id, self._model, self._created_at, status, self._output,
                                self._settle_usage(), incomplete)
        return out + self._event("response.completed", {"response": shown})

    def fail(self, code: str, message: str) -> bytes:
        """The stream was cut or the server failed midway: the open item closed as
        ``incomplete`` (tool calls still gathered are not sent: their arguments may be cut),
        then ``response.failed`` with ``error: {code, message}`` (``context_length_exceeded``
        for a context overflow) and the items done so far."""
        if self._done:
            return b""
        out = self._close("incomplete")
        self._done = True
        shown = response_object(self.id, self._model, self._created_at, "failed", self._output,
                                self._settle_usage(), error={"code": code, "message": message})
        return out + self._event("response.failed", {"response": shown})
