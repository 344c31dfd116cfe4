"""OpenAI tool calls as Ollama's: ``arguments`` is an object, not JSON text.

A stream sends a tool call in pieces (OpenAI's grammar, which llama.cpp follows): the first
delta of a call has its ``index``, ``id``, ``type`` and ``function.name`` with
``arguments: ""``, the next ones the same ``index`` and more ``arguments`` text.
:class:`ToolCallParts` puts them together; :meth:`ToolCallParts.take` gives the whole calls
once the choice has finished.

Arguments that are not a JSON object (a model that wrote broken JSON, or a bare value) are
kept rather than lost: ``{"raw": "<the text>"}``; empty arguments are ``{}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.ollama.wire import NotJson, json_bytes, load_json

__all__ = [
    "ARGUMENTS_CAP",
    "CALLS_CAP",
    "TooManyParts",
    "ToolCallParts",
    "ollama_tool_call",
    "whole_tool_calls",
]

ARGUMENTS_CAP = 1 << 20  # characters of arguments text, all calls of one answer together
CALLS_CAP = 256  # tool calls in one answer


class TooManyParts(ValueError):
    """A stream's tool calls went over :data:`ARGUMENTS_CAP` or :data:`CALLS_CAP`."""


def ollama_tool_call(call_id: str, name: str, arguments: object, index: int) -> dict[str, Any]:
    """One Ollama tool call (``id`` as the model server named it; ``function.index`` its
    position, as Ollama writes it)."""
    function = {"index": index, "name": name, "arguments": _arguments(arguments)}
    return {"id": call_id, "function": function} if call_id else {"function": function}


def _arguments(arguments: object) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return {} if arguments is None else {"raw": arguments}
    if not arguments.strip():
        return {}
    try:
        value = load_json(arguments)
    except NotJson:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"raw": arguments}


def whole_tool_calls(calls: object) -> list[dict[str, Any]]:
    """The Ollama tool calls of a whole OpenAI message's ``tool_calls``."""
    if not isinstance(calls, list):
        return []
    out = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        function = call["function"]
        name = function.get("name")
        call_id = call.get("id")
        out.append(ollama_tool_call(call_id if isinstance(call_id, str) else "",
                                    name if isinstance(name, str) else "",
                                    function.get("arguments"), position))
    return out


@dataclass(slots=True)
class _Call:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallParts:
    """The tool calls of one streamed choice, put together from their deltas."""

    __slots__ = ("_calls", "_size")

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}  # by the delta's index, in order of arrival
        self._size = 0

    def __repr__(self) -> str:
        return f"ToolCallParts(calls={len(self._calls)}, size={self._size})"

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, deltas: object) -> None:
        """Take in one delta's ``tool_calls`` list; raises :class:`TooManyParts`."""
        if not isinstance(deltas, list):
            return
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            index = delta.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                index = position
            call = self._calls.get(index)
            if call is None:
                if len(self._calls) >= CALLS_CAP:
                    raise TooManyParts(f"more than {CALLS_CAP} tool calls")
                call = self._calls[index] = _Call()
            call_id = delta.get("id")
            if isinstance(call_id, str) and call_id and not call.call_id:
                call.call_id = call_id
            function = delta.get("function")
            if isinstance(function, dict):
                self._function(call, function)

    def _function(self, call: _Call, function: dict[str, Any]) -> None:
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        more = function.get("arguments")
        if isinstance(more, dict):  # a server that sends the whole object at once
            more = None if call.arguments else json_bytes(more).decode()
        if isinstance(more, str) and more:
            self._size += len(more)
            if self._size > ARGUMENTS_CAP:
                raise TooManyParts(f"tool call arguments longer than {ARGUMENTS_CAP}")
            call.arguments.append(more)

    def take(self) -> list[dict[str, Any]]:
        """The whole Ollama tool calls so far, in order; none are kept after."""
        calls = [ollama_tool_call(c.call_id, c.name, "".join(c.arguments), position)
                 for position, c in enumerate(self._calls.values())]
        self._calls = {}
        return calls
