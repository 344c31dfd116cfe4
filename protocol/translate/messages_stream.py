"""A streamed chat answer as Anthropic's Messages stream (SPEC §17.1): a state machine fed
one parsed chat chunk at a time, giving the SSE bytes to send.

One block is open at a time, indices 0, 1, 2… in opening order. Reasoning opens a
``thinking`` block (``thinking_delta``…, a ``signature_delta`` before its stop), text a
``text`` block (``text_delta``…); a change of kind stops the open block first. Tool calls
are gathered per ``index`` (id, name and arguments, in whatever chunks they come, the
arguments before the name or with it): the first call's ``tool_use`` block opens as soon as
its id and name are known, and every call's arguments go out whole, as **one**
``input_json_delta`` of valid JSON, at its block's stop. Calls after the first (two calls
may come interleaved) and any text after a call has opened are sent at the end, in order,
so nothing is ever sent to a block that is stopped or not started.

``finish_reason`` only notes the reason: the usage chunk that follows it (asked for with
``stream_options.include_usage``) is waited for, and :meth:`Stream.finish` (at ``[DONE]`` or
the end of the body) stops what is open, sends the held calls, then ``message_delta``
(``stop_reason``, ``usage`` with ``input_tokens`` = prompt - cached and
``cache_read_input_tokens`` = cached) and ``message_stop``. Without a usage chunk the counts
are characters ÷ 4 and :attr:`Stream.usage_estimated` says so.
"""

from __future__ import annotations

import json
import secrets
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from protocol.json_text import compact_json
from protocol.translate.chat import Usage, estimate_tokens, read_chunk

__all__ = ["Stream", "event", "stop_reason", "tool_input", "usage_object"]

_STOPS = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal",
          "tool_calls": "tool_use", "function_call": "tool_use"}


def event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {compact_json(data)}\n\n".encode()


def stop_reason(finish: str | None, any_tool: bool, matched: str | None) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a chat ``finish_reason``."""
    if any_tool:
        return "tool_use", None
    if finish == "stop" and matched is not None:
        return "stop_sequence", matched
    return _STOPS.get(finish or "stop", "end_turn"), None


def usage_object(usage: Usage) -> dict[str, int]:
    prompt = usage.input or 0
    cached = min(usage.cached or 0, prompt)
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": usage.output or 0}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's gathered arguments as the ``input`` object: ``{}`` when empty; text that is
    not a JSON object is kept whole under ``arguments`` rather than lost."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class _Call:
    __slots__ = ("arguments", "id", "name", "opened")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []
        self.opened = False


_TEXT_DELTA = b',"delta":{"type":"text_delta","text":"'
_THINKING_DELTA = b',"delta":{"type":"thinking_delta","thinking":"'
_DELTA_END = b'"}}\n\n'
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_TEXT_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'


class Stream:
    """One streamed answer (see the module). ``model``: the name the client asked for;
    ``prompt_chars``: the translated prompt's characters, for the estimate."""

    def __init__(self, model: str, *, prompt_chars: int = 0, **options: Any) -> None:
        self.model = model
        self.prompt_chars = prompt_chars
        self.usage = Usage()
        self.usage_estimated = False
        self._index = -1  # the last block opened
        self._open: str | None = None  # the open block's kind: thinking, text, tool_use
        self._calls: dict[int, _Call] = {}
        self._tool_open: _Call | None = None
        self._calls_going = False  # a tool_use block was opened: later text waits for the end
        self._held_text: list[str] = []  # text after a tool block opened: sent at the end
        self._finish: str | None = None
        self._matched: str | None = None
        self._chars = 0  # characters of the answer, for the estimate
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        return f"Stream({self.model!r}, open={self._open}, closed={self._closed})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def finished(self) -> bool:
        """The upstream said the choice is finished (a ``finish_reason``)."""
        return self._finish is not None

    def start(self) -> bytes:
        if self._started or self._closed:
            return b""
        self._started = True
        return event("message_start", {"type": "message_start", "message": {
            "id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def ping(self) -> bytes:
        if self._closed or self._index >= 0:
            return b""
        return b'event: ping\ndata: {"type":"ping"}\n\n'

    def _stop(self) -> bytes:
        kind = self._open
        if kind is None:
            return b""
        out = b""
        index = self._index
        if kind == "thinking":
            out = event("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": ""}})
        elif kind == "tool_use":
            call = self._tool_open
            self._tool_open = None
            if call is not None:
                out = self._json_delta(index, call)
        self._open = None
        return out + event("content_block_stop", {"type": "content_block_stop",
                                                  "index": index})

    def _json_delta(self, index: int, call: _Call) -> bytes:
        whole = compact_json(tool_input("".join(call.arguments)))
        return event("content_block_delta", {
            "type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": whole}})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._stop()
        self._index += 1
        self._open = kind
        return out + event("content_block_start", {"type": "content_block_start",
                                                   "index": self._index,
                                                   "content_block": block})

    def _delta(self, kind: str, field: str, text: str) -> bytes:
        out = b""
        if self._open != kind:
            block: dict[str, Any] = ({"type": "thinking", "thinking": "", "signature": ""}
                                     if kind == "thinking" else {"type": "text", "text": ""})
            out = self._open_block(kind, block)
        self._chars += len(text)
        return out + (_TEXT_HEAD + b"%d" % self._index + b',"delta":{"type":"' + kind.encode()
                      + b'_delta","' + field.encode() + b'":' + _quote(text).encode()
                      + b"}}\n\n")

    def plain(self, strings: list[bytes], thinking: bool) -> bytes:
        """The fast path of :meth:`feed` for chunks that carry only text (or only
        reasoning): ``strings`` are the bodies of plain JSON strings (no escapes, no control
        characters, UTF-8: :func:`protocol.ollama.text_delta.is_plain`), so they are the
        text's JSON as it is, and their deltas are made without parsing or quoting."""
        if self._calls_going or self._closed:
            return b"".join(self.feed({"choices": [{"index": 0, "delta": {
                "reasoning_content" if thinking else "content": text.decode()}}]})
                for text in strings)
        if len(strings) != 1:
            strings = [text for text in strings if text]
            if not strings:
                return b""
        elif not strings[0]:
            return b""
        out = b""
        if thinking:
            if self._open != "thinking":
                out = self._open_block("thinking", {"type": "thinking", "thinking": "",
                                                    "signature": ""})
            head = _TEXT_HEAD + b"%d" % self._index + _THINKING_DELTA
        else:
            if self._open != "text":
                out = self._open_block("text", {"type": "text", "text": ""})
            head = _TEXT_HEAD + b"%d" % self._index + _TEXT_DELTA
        joint = _DELTA_END + head
        deltas = joint.join(strings)
        # the strings' bytes, not characters (it is an estimate), from the length of the join
        self._chars += len(deltas) - (len(strings) - 1) * len(joint)
        return out + head + deltas + _DELTA_END

    def _tool_block(self, call: _Call) -> bytes:
        call.opened = True
        self._calls_going = True
        out = self._open_block("tool_use", {"type": "tool_use", "id": call.id,
                                            "name": call.name, "input": {}})
        self._tool_open = call
        return out

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if self._closed:
            return b""
        piece = read_chunk(chunk)
        if piece.error is not None:
            return self.fail("upstream_error", piece.error)
        out = b""
        if piece.usage is not None and piece.usage.input is not None:
            self.usage = piece.usage
        calls_going = self._calls_going
        if piece.reasoning and not calls_going:
            out += self._delta("thinking", "thinking", piece.reasoning)
        if piece.text:
            if calls_going:
                self._held_text.append(piece.text)
                self._chars += len(piece.text)
            else:
                out += self._delta("text", "text", piece.text)
        for part in piece.tools:
            call = self._calls.get(part.key)
            if call is None:
                call = self._calls[part.key] = _Call()
            if part.id is not None and call.id is None:
                call.id = part.id
            if part.name is not None and call.name is None:
                call.name = part.name
            if part.arguments:
                call.arguments.append(part.arguments)
                self._chars += len(part.arguments)
            if (not call.opened and call.id is not None and call.name is not None
                    and not self._calls_going):
                out += self._tool_block(call)
        if piece.finish is not None:
            self._finish = piece.finish
            self._matched = piece.matched
        return out

    def finish(self) -> bytes:
        """The end: what is open stopped, the held calls and text sent, then
        ``message_delta`` and ``message_stop``."""
        if self._closed:
            return b""
        out = self.start() + self._stop()
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.opened:
                continue
            if call.name is None:  # arguments with no name: nothing a client could run
                continue
            if call.id is None:
                call.id = "toolu_" + secrets.token_hex(12)
            out += self._tool_block(call) + self._stop()
        if self._held_text:
            out += self._delta("text", "text", "".join(self._held_text)) + self._stop()
            self._chars -= sum(len(t) for t in self._held_text)  # counted when held
            self._held_text = []
        usage = self.usage
        if usage.input is None or usage.output is None:
            self.usage_estimated = True
            usage = self.usage = Usage(
                estimate_tokens(self.prompt_chars) if usage.input is None else usage.input,
                usage.cached,
                estimate_tokens(self._chars) if usage.output is None else usage.output)
        any_tool = any(c.opened for c in self._calls.values())
        reason, sequence = stop_reason(self._finish, any_tool, self._matched)
        self._closed = True
        return out + event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_object(usage)}) + _MESSAGE_STOP

    def fail(self, code: str, message: str) -> bytes:
        """The stream cannot be completed: Anthropic's error event, and nothing after it."""
        if self._closed:
            return b""
        self._closed = True
        kind = "invalid_request_error" if code == "context_length_exceeded" else (
            "overloaded_error" if code == "server_overloaded" else "api_error")
        return event("error", {"type": "error", "error": {
            "type": kind, "message": f"{message} ({code})"}})
