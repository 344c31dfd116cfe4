"""Ollama chat messages and tools as OpenAI chat messages and tools.

- ``content`` (a string; absent or null is ``""``) with ``images`` becomes a list of
  content parts: the text first (when there is some), then one ``image_url`` part per
  image (:mod:`protocol.ollama.images`). Which roles may carry images is the model
  server's business, as it is Ollama's template's.
- An assistant's ``tool_calls`` (``{function: {name, arguments: {...}}}``) become OpenAI
  tool calls: ``arguments`` as compact JSON text, ``type: function``, and the call's ``id``
  when the client sent one, else one made up from the positions, ``call_<message>_<call>``,
  so the same conversation always translates to the same bytes.
- A ``tool`` message is the answer to one of those calls: its ``tool_call_id`` when given,
  else the first unanswered call of the latest assistant message with the same name as its
  ``tool_name``, else the first unanswered one, else ``call_<message>``.
- ``thinking`` (a thinking model's earlier reasoning) is dropped.
"""

from __future__ import annotations

from typing import Any

from protocol.json_text import compact_json
from protocol.ollama.errors import invalid
from protocol.ollama.images import image_parts

__all__ = ["ROLES", "content_value", "openai_messages", "openai_tools"]

ROLES = ("system", "user", "assistant", "tool")


def openai_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The OpenAI ``messages`` for an Ollama chat's ``messages`` (a list)."""
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the latest assistant's calls
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(ROLES)}")
        text = message.get("content")
        if text is None:
            text = ""
        elif not isinstance(text, str):
            raise invalid(f"{where}.content must be a string")
        translated: dict[str, Any] = {
            "role": role,
            "content": content_value(text, image_parts(message.get("images"), f"{where}.images")),
        }
        if role == "assistant":
            calls = _tool_calls(message.get("tool_calls"), i)
            if calls:
                translated["tool_calls"] = calls
                unanswered = [(c["id"], c["function"]["name"]) for c in calls]
        elif role == "tool":
            translated["tool_call_id"] = _answered(message, unanswered, i)
        out.append(translated)
    return out


def content_value(text: str, images: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's OpenAI ``content``: the text alone, or parts when there are images."""
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + images


def openai_tools(tools: object) -> list[dict[str, Any]] | None:
    """A request's ``tools`` as OpenAI tools (Ollama's are OpenAI's shape already; a
    missing ``type`` is ``function``, as in Ollama's clients); None for none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise invalid(f"tools[{i}] must be an object with a function")
        out.append(tool if "type" in tool else {"type": "function", **tool})
    return out or None


def _tool_calls(calls: object, message: int) -> list[dict[str, Any]]:
    if calls is None:
        return []
    where = f"messages[{message}].tool_calls"
    if not isinstance(calls, list):
        raise invalid(f"{where} must be a list")
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise invalid(f"{where}[{k}] must be an object with a function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}[{k}].function.name must be a non-empty string")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, dict):
            arguments = compact_json(arguments)
        elif not isinstance(arguments, str):  # a JSON text is let through as it is
            raise invalid(f"{where}[{k}].function.arguments must be an object")
        given = call.get("id")
        call_id = given if isinstance(given, str) and given else f"call_{message}_{k}"
        out.append({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}})
    return out


def _answered(message: dict[str, Any], unanswered: list[tuple[str, str]], index: int) -> str:
    given = message.get("tool_call_id")
    if isinstance(given, str) and given:
        for pair in unanswered:
            if pair[0] == given:
                unanswered.remove(pair)
                break
        return given
    name = message.get("tool_name")
    for pair in unanswered:
        if pair[1] == name:
            unanswered.remove(pair)
            return pair[0]
    if unanswered:
        return unanswered.pop(0)[0]
    return f"call_{index}"
