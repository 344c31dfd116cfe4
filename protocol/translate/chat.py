"""What every translator reads of Chat Completions (SPEC §17.1), as plain values: a stream's
chunk (:func:`read_chunk` -> :class:`Piece`), a whole answer (:func:`read_answer` ->
:class:`Whole`), the usage (:class:`Usage`), the characters ÷ 4 estimate
(:func:`estimate_tokens`), the server's context overflow (:func:`context_overflow`) and
its error answer in the client's API (:func:`upstream_error`).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from protocol.errors import SluiceError, anthropic_type

if TYPE_CHECKING:
    from protocol.translate import Translator

__all__ = [
    "Piece",
    "ToolPiece",
    "Usage",
    "Whole",
    "WholeCall",
    "context_overflow",
    "error_message",
    "estimate_tokens",
    "read_answer",
    "read_chunk",
    "read_usage",
    "text_of_prompt",
    "upstream_error",
]


class Usage(NamedTuple):
    """An answer's token counts (None: not said)."""

    input: int | None = None  # the whole prompt, cached tokens included
    cached: int | None = None  # of them, read from the server's cache
    output: int | None = None


class ToolPiece(NamedTuple):
    """A piece of one streamed tool call, keyed by its ``index``."""

    key: int  # the call's ``index``
    id: str | None
    name: str | None
    arguments: str  # "" when the piece carries none


class Piece(NamedTuple):
    """One chat chunk of a stream, as plain values (the first choice's)."""

    text: str = ""
    reasoning: str = ""
    tools: tuple[ToolPiece, ...] = ()
    finish: str | None = None
    usage: Usage | None = None
    error: str | None = None  # an ``{"error": ...}`` event's message
    matched: str | None = None  # the stop sequence that ended it, when the server says


class WholeCall(NamedTuple):
    id: str
    name: str
    arguments: str


class Whole(NamedTuple):
    """A whole chat answer (its first choice), as plain values."""

    text: str
    reasoning: str
    calls: tuple[WholeCall, ...]
    finish: str | None
    usage: Usage | None
    matched: str | None = None


def _matched(choice: dict[str, Any]) -> str | None:
    """The stop string that ended a choice, when the server says (vLLM's ``stop_reason``,
    SGLang's ``matched_stop``); a token id or nothing is None."""
    for key in ("stop_reason", "matched_stop"):
        value = choice.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def read_usage(usage: object) -> Usage | None:
    """A chat ``usage`` object (``prompt_tokens``, ``completion_tokens``,
    ``prompt_tokens_details.cached_tokens``), or None when it is not one."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(_count(usage.get("prompt_tokens")), cached,
                 _count(usage.get("completion_tokens")))


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def error_message(error: object) -> str:
    """A chat error's message (its ``message``, or itself when a string)."""
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
    if isinstance(error, str):
        return error
    return "the model server reported an error"


def read_chunk(chunk: dict[str, Any]) -> Piece:
    """One parsed chat chunk (``data:`` of a stream) as a :class:`Piece`: the first
    choice's text, reasoning (``reasoning_content``, or ``reasoning`` as vLLM names it),
    tool call pieces, finish reason, and the usage when the chunk has one."""
    if "error" in chunk:
        return Piece(error=error_message(chunk["error"]))
    usage = read_usage(chunk.get("usage"))
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return Piece(usage=usage)
    choice = choices[0]
    for one in choices:  # the first choice is index 0, wherever it is in the list
        if isinstance(one, dict) and one.get("index", 0) == 0:
            choice = one
            break
    if not isinstance(choice, dict):
        return Piece(usage=usage)
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        delta = {}
    finish = choice.get("finish_reason")
    reasoning = delta.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = delta.get("reasoning")
    return Piece(text=_text(delta.get("content")), reasoning=_text(reasoning),
                 tools=_tool_pieces(delta.get("tool_calls")),
                 finish=finish if isinstance(finish, str) else None, usage=usage,
                 matched=_matched(choice) if finish is not None else None)


def _tool_pieces(calls: object) -> tuple[ToolPiece, ...]:
    if not isinstance(calls, list) or not calls:
        return ()
    pieces = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        index = call.get("index")
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        ident = call.get("id")
        name = function.get("name")
        pieces.append(ToolPiece(
            index if isinstance(index, int) else position,
            ident if isinstance(ident, str) and ident else None,
            name if isinstance(name, str) and name else None,
            _arguments(function.get("arguments"))))
    return tuple(pieces)


def _arguments(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # some servers send the object itself
        return json.dumps(value, ensure_ascii=False)
    return ""


def read_answer(answer: dict[str, Any]) -> Whole:
    """A whole chat answer's first choice as a :class:`Whole`."""
    usage = read_usage(answer.get("usage"))
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    if not isinstance(choice, dict):
        choice = {}
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = message.get("reasoning")
    calls = []
    raw_calls = message.get("tool_calls")
    for n, call in enumerate(raw_calls if isinstance(raw_calls, list) else ()):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            continue
        ident = call.get("id")
        calls.append(WholeCall(ident if isinstance(ident, str) and ident else f"call_{n}",
                               _text(function.get("name")),
                               _arguments(function.get("arguments"))))
    finish = choice.get("finish_reason")
    return Whole(_text(message.get("content")), _text(reasoning), tuple(calls),
                 finish if isinstance(finish, str) else None, usage, _matched(choice))


def estimate_tokens(characters: int) -> int:
    """SPEC §17.1's estimate when the server says no usage: characters ÷ 4, rounded up."""
    return (characters + 3) // 4


def text_of_prompt(chat: dict[str, Any]) -> int:
    """The characters of a chat body's prompt (message texts, tool call arguments and the
    tools' definitions), for the estimate."""
    total = 0
    for message in chat.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"])
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                total += len(_text(function.get("arguments"))) + len(_text(function.get("name")))
    tools = chat.get("tools")
    if tools:
        total += len(json.dumps(tools))
    return total


_MAXIMUM = re.compile(r"maximum context length is (\d+)")
_ASKED = re.compile(r"(?:you requested|resulted in|prompt (?:is|has|contains)) (\d+) tokens")
_OVERFLOW_WORDS = ("exceed_context_size_error", "maximum context length",
                   "context_length_exceeded", "exceeds the available context size")


def context_overflow(status: int, body: bytes) -> tuple[int | None, int | None] | None:
    """The server's answer says the prompt does not fit its context: ``(tokens, maximum)``
    as far as it says them (llama.cpp's ``exceed_context_size_error`` with
    ``n_prompt_tokens`` and ``n_ctx``; vLLM's and OpenAI's "maximum context length is M
    tokens ... you requested N tokens"); None when it says something else."""
    if status != 400 and status != 413 and status != 422:
        return None
    if not any(word.encode() in body for word in _OVERFLOW_WORDS):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        tokens = _count(error.get("n_prompt_tokens"))
        maximum = _count(error.get("n_ctx"))
        if tokens is not None or maximum is not None:
            return tokens, maximum
        text = _text(error.get("message"))
    else:
        text = body.decode("utf-8", "replace")
    found_max = _MAXIMUM.search(text)
    found_asked = _ASKED.search(text)
    return (int(found_asked.group(1)) if found_asked else None,
            int(found_max.group(1)) if found_max else None)


def upstream_error(translator: Translator, status: int, body: bytes) -> SluiceError:
    """A model server's error answer as the client's: its context overflow in the API's
    words (SPEC §17.1), else its status with its message."""
    overflow = context_overflow(status, body)
    if overflow is not None:
        return translator.overflow_error(*overflow)
    message = ""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = error["message"]
    elif isinstance(error, str):
        message = error
    if not message:
        message = body[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return SluiceError(status, f"the model server answered {status}: {message}",
                       type=anthropic_type(status) if status < 500 else "server_error",
                       code=None)
