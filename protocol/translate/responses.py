"""The Responses API translated to and from Chat Completions (SPEC §17.1), pure: the request
mapping here (:func:`to_chat`, :func:`tool_names`), the answers in :mod:`.responses_answer`
(:func:`from_chat`) and :mod:`.responses_stream` (:class:`Stream`), re-exported.

Request (Responses -> Chat): ``instructions`` and ``developer``/``system`` items make the
system message while no user turn came yet, and are put before the next user turn's text
after one (never between an assistant's tool calls and their outputs); ``input`` (a string
or items) becomes the messages: user ``input_text``/``input_image`` parts, an assistant's
``output_text`` with the ``function_call``/``custom_tool_call`` items after it as one
assistant message with ``tool_calls``, their outputs as ``tool`` messages, ``reasoning``
items with text as the next assistant's ``reasoning_content``; items a chat server has no
use for (``web_search_call``, ``local_shell_call``, ``item_reference``, ``compaction``,
``mcp_*``…) are dropped. Tools: ``function`` as is, each ``namespace`` member as
``<namespace>__<name>``, ``custom`` as a function of one string ``input``; hosted tools
dropped. A request that needs the server's stored state (``previous_response_id``,
``conversation``) is refused: nothing is stored.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.errors import Family, SluiceError, bad_request
from protocol.translate.chat import text_of_prompt
from protocol.translate.responses_answer import (
    NO_TOOLS,
    ToolName,
    ToolNames,
    flat_name,
    from_chat,
)
from protocol.translate.responses_stream import Stream

__all__ = ["FAMILY", "NAME", "NO_TOOLS", "Stream", "ToolName", "ToolNames", "count_answer",
           "from_chat", "overflow_error", "to_chat", "tool_names"]

NAME = "responses"
FAMILY = Family.RESPONSES

# Fields that name state the server would have stored: refused, with their error code.
_STATEFUL = {"previous_response_id": "previous_response_not_supported",
             "conversation": "conversation_not_supported"}
# Request fields that keep their name and value in Chat Completions.
_SAME = ("model", "temperature", "top_p", "parallel_tool_calls", "user")
# Content part types that carry text, by the side that sends them.
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text",
                         "reasoning_text", "refusal"})


def _bad(message: str, param: str, code: str = "invalid_request") -> SluiceError:
    return bad_request(message, code=code, param=param)


def _member_tools(tool: dict[str, Any], at: str) -> list[tuple[str, dict[str, Any]]]:
    """``(chat name, tool)`` for a tool of the request: itself, a namespace's members, or
    nothing for a hosted tool."""
    kind = tool.get("type")
    if kind == "function" or kind == "custom":
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{at}.name must be a non-empty string", f"{at}.name")
        return [(name, tool)]
    if kind == "namespace":
        space = tool.get("name")
        members = tool.get("tools")
        if not isinstance(space, str) or not space or not isinstance(members, list):
            raise _bad(f"{at} must have a name and a list of tools", at)
        found = []
        for n, member in enumerate(members):
            inner = f"{at}.tools[{n}]"
            if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                raise _bad(f"{inner} must be a function or custom tool", inner)
            for name, one in _member_tools(member, inner):
                found.append((flat_name(space, name), {**one, "namespace": space}))
        return found
    return []  # a hosted tool (web_search, file_search, mcp, computer_use…): dropped


def _tools(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    found = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{n}] must be an object", f"tools[{n}]")
        found.extend(_member_tools(tool, f"tools[{n}]"))
    return found


def tool_names(body: dict[str, Any]) -> ToolNames:
    """The request's tool table: what each chat function name stands for, so the answer
    gives namespace members and custom tools back as the client named them."""
    return ToolNames({chat: ToolName(tool["name"], tool.get("namespace"),
                                     tool.get("type") == "custom")
                      for chat, tool in _tools(body)})


def _chat_tool(chat: str, tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": chat}
    description = tool.get("description")
    if tool.get("type") == "custom":
        text = description if isinstance(description, str) else ""
        form = tool.get("format")
        if isinstance(form, dict) and isinstance(form.get("definition"), str):
            text += (f"\n\nThe input follows this {form.get('syntax', '')} grammar:\n"
                     f"{form['definition']}")
        if text:
            function["description"] = text.strip()
        function["parameters"] = {"type": "object", "properties": {"input": {"type": "string"}},
                                  "required": ["input"]}
        return {"type": "function", "function": function}
    if isinstance(description, str):
        function["description"] = description
    parameters = tool.get("parameters")
    function["parameters"] = parameters if isinstance(parameters, dict) \
        else {"type": "object", "properties": {}}
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object, names: set[str]) -> object:
    """The chat ``tool_choice`` (None: leave it out)."""
    if choice in ("auto", "none", "required"):
        return choice
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        name = choice["name"]
        space = choice.get("namespace")
        chat = flat_name(space, name) if isinstance(space, str) and space else name
        return {"type": "function", "function": {"name": chat}} if chat in names else None
    if kind == "allowed_tools":
        return "required" if choice.get("mode") == "required" else "auto"
    return None  # a hosted tool's choice: the tool was dropped


def _response_format(text: object) -> dict[str, Any] | None:
    form = text.get("format") if isinstance(text, dict) else None
    if not isinstance(form, dict):
        return None
    kind = form.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: dict[str, Any] = {"name": form.get("name") or "response",
                                  "schema": form.get("schema", {})}
        for key in ("strict", "description"):
            if key in form:
                schema[key] = form[key]
        return {"type": "json_schema", "json_schema": schema}
    return None


def _text_of(value: object) -> str:
    """The text of a tool output or a reasoning list: a string, or its text parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n\n".join(part["text"] for part in value if isinstance(part, dict)
                           and part.get("type") in _TEXT_PARTS
                           and isinstance(part.get("text"), str))
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])  # an older Codex's {"content", "success"}
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _parts(content: object, at: str) -> list[dict[str, Any]]:
    """A message's content as chat content parts (text and image_url)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{at} must be a string or a list of content parts", at)
    parts = []
    for n, part in enumerate(content):
        where = f"{at}[{n}]"
        if not isinstance(part, dict):
            raise _bad(f"{where} must be an object", where)
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _bad(f"{where}: only images given by image_url (a data: or http URL) "
                           "can be translated for this model's server", where,
                           "unsupported_content")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind in ("input_file", "input_audio"):
            raise _bad(f"{where}: {kind} parts cannot be translated to Chat Completions for "
                       "this model's server", where, "unsupported_content")
    return parts


def _collapse(parts: list[dict[str, Any]]) -> object:
    """Text-only content as one string (every chat server reads that)."""
    if all(part["type"] == "text" for part in parts):
        return "\n\n".join(part["text"] for part in parts)
    return parts


class _Messages:
    """The chat messages built item by item (the placement rules of the module)."""

    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.pending_system: list[str] = []  # said after a user turn: before the next one
        self.pending_reasoning: list[str] = []
        self.assistant: dict[str, Any] | None = None  # the one tool calls still join
        self.user: list[dict[str, Any]] | None = None  # the last message's parts, a user's
        self.seen_user = False

    def say_system(self, text: str) -> None:
        if not text:
            return
        if not self.seen_user:
            self.system.append(text)
        else:
            self.pending_system.append(text)

    def say_user(self, parts: list[dict[str, Any]]) -> None:
        if self.pending_system:
            parts = [{"type": "text", "text": "\n\n".join(self.pending_system)}, *parts]
            self.pending_system = []
        if self.user is not None:
            self.user.extend(parts)
        else:
            self.user = list(parts)
            self.messages.append({"role": "user", "content": self.user})
        self.assistant = None
        self.seen_user = True

    def _reasoning_to(self, message: dict[str, Any]) -> None:
        if self.pending_reasoning:
            said = message.get("reasoning_content")
            message["reasoning_content"] = "\n\n".join(
                ([said] if said else []) + self.pending_reasoning)
            self.pending_reasoning = []

    def say_assistant(self, text: str) -> None:
        if self.assistant is not None and "tool_calls" not in self.assistant:
            self.assistant["content"] = "\n\n".join(t for t in (self.assistant["content"],
                                                                text) if t)
        else:
            self.assistant = {"role": "assistant", "content": text}
            self.messages.append(self.assistant)
            self.user = None
        self._reasoning_to(self.assistant)

    def call(self, call_id: str, name: str, arguments: str) -> None:
        if self.assistant is None:
            self.say_assistant("")
        assert self.assistant is not None
        self._reasoning_to(self.assistant)
        self.assistant.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": arguments}})

    def output(self, call_id: str, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.assistant = None
        self.user = None

    def chat_messages(self) -> list[dict[str, Any]]:
        if self.pending_system:  # said after the last user turn: a last user turn of its own
            self.say_user([])
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": "\n\n".join(self.system)})
        for message in self.messages:
            if message["role"] == "user":
                out.append({"role": "user", "content": _collapse(message["content"])})
            else:
                out.append(message)
        return out


def _string(item: dict[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{at}.{key} must be a string", f"{at}.{key}")
    return value


def _item(built: _Messages, item: object, at: str) -> None:
    if not isinstance(item, dict):
        raise _bad(f"{at} must be an object", at)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        parts = _parts(item.get("content"), f"{at}.content")
        if role in ("system", "developer"):
            built.say_system(_text_of([p for p in parts if p["type"] == "text"]))
        elif role == "user":
            built.say_user(parts)
        elif role == "assistant":
            built.say_assistant("".join(p["text"] for p in parts if p["type"] == "text"))
        else:
            raise _bad(f"{at}.role must be user, assistant, system or developer", f"{at}.role")
    elif kind in ("function_call", "custom_tool_call"):
        name = _string(item, "name", at)
        space = item.get("namespace")
        if isinstance(space, str) and space:
            name = flat_name(space, name)
        arguments = _string(item, "arguments", at) if kind == "function_call" \
            else json.dumps({"input": _string(item, "input", at)}, ensure_ascii=False)
        built.call(_string(item, "call_id", at), name, arguments)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        built.output(_string(item, "call_id", at), _text_of(item.get("output")))
    elif kind == "reasoning":
        text = _text_of(item.get("content")) or _text_of(item.get("summary"))
        if text:
            built.pending_reasoning.append(text)
    # anything else (web_search_call, local_shell_call, item_reference, compaction, mcp_*…)
    # is the hosted API's own state: dropped


def prompt_estimate(chat: dict[str, Any]) -> int:
    """The translated prompt's tokens, over-estimated (characters ÷ 3: code and JSON run
    nearer 3 characters a token than 4) so that a clamped ``max_tokens`` still fits."""
    return (text_of_prompt(chat) + 2) // 3


def to_chat(body: dict[str, Any], *, context: int | None) -> dict[str, Any]:
    """A Responses request body (parsed) as a Chat Completions body. ``context``: the
    served context in tokens when known (``max_tokens`` is clamped to it minus the
    prompt's estimate). A refused request raises a 400 :class:`SluiceError`."""
    for key, code in _STATEFUL.items():
        if body.get(key) is not None:
            raise _bad(f"{key} needs the responses stored by the server; this model's server "
                       "stores none (send the whole conversation in input)", key, code)
    built = _Messages()
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        built.say_system(instructions)
    elif instructions is not None:
        raise _bad("instructions must be a string", "instructions")
    given = body.get("input")
    if isinstance(given, str):
        built.say_user([{"type": "text", "text": given}])
    elif isinstance(given, list):
        for n, item in enumerate(given):
            _item(built, item, f"input[{n}]")
    elif given is not None:
        raise _bad("input must be a string or a list of items", "input")
    chat: dict[str, Any] = {key: body[key] for key in _SAME if body.get(key) is not None}
    chat["messages"] = built.chat_messages()
    tools = _tools(body)
    if tools:
        chat["tools"] = [_chat_tool(name, tool) for name, tool in tools]
        choice = _tool_choice(body.get("tool_choice"), {name for name, _ in tools})
        if choice is not None:
            chat["tool_choice"] = choice
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    form = _response_format(body.get("text"))
    if form is not None:
        chat["response_format"] = form
    asked = body.get("max_output_tokens")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        if context is not None:
            asked = max(1, min(asked, context - prompt_estimate(chat)))
        chat["max_tokens"] = asked
    return chat


def overflow_error(tokens: int | None, maximum: int | None) -> SluiceError:
    """The server's context overflow as the Responses API's 400 ``context_length_exceeded``
    (Codex compacts its history on exactly this code); in a stream already begun, send
    ``Stream.fail("context_length_exceeded", error.message)`` instead."""
    said = ""
    if tokens is not None and maximum is not None:
        said = f" ({tokens} tokens > {maximum} maximum)"
    elif maximum is not None:
        said = f" ({maximum} tokens)"
    return bad_request(f"Your input exceeds the context window of this model{said}. "
                       "Please adjust your input and try again.",
                       code="context_length_exceeded", param="input")


def count_answer(tokens: int) -> dict[str, Any]:
    """The answer of ``POST /v1/responses/input_tokens`` for the server's exact count."""
    return {"object": "response.input_tokens", "input_tokens": tokens}
