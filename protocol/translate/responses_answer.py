"""Chat Completions answers as the Responses API's (SPEC §17.1 "Chat → Responses"), pure:
parsed chat values in, Responses JSON values out; no clock (``created_at`` is given), no
I/O.

- :func:`from_chat`: a whole chat answer -> ``{id: "resp_…", object: "response", status,
  output: [reasoning?, message?, function_call* | custom_tool_call*], usage, store: false}``.
- The output items and the response object both answers are made of, for
  :class:`~protocol.translate.responses_stream.Stream` too.
- :class:`ToolNames`: the request's tool table, to restore what the request flattened
  (``namespace`` members, ``custom`` tools) in the answer's items.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from protocol.errors import upstream_bad_response
from protocol.translate.chat import Usage, estimate_tokens, read_answer

__all__ = ["NO_TOOLS", "ToolName", "ToolNames", "call_item", "custom_input", "estimated",
           "flat_name", "from_chat", "message_item", "new_id", "reasoning_item",
           "reasoning_tokens", "response_object", "status_of", "text_part", "usage_object"]


class ToolName(NamedTuple):
    """What a chat function name stands for in the Responses request."""

    name: str
    namespace: str | None = None  # the ``namespace`` tool it is a member of
    custom: bool = False  # a ``custom`` tool: answered as ``custom_tool_call``


def flat_name(namespace: str, name: str) -> str:
    """A namespace member's chat function name, ``<namespace>__<name>`` with no doubled
    ``__`` (Codex's MCP namespaces end in ``__`` already)."""
    head = namespace.rstrip("_") or namespace
    tail = name.lstrip("_") or name
    return f"{head}__{tail}"


@dataclass(frozen=True)
class ToolNames:
    """The request's tools by chat function name (built by
    :func:`protocol.translate.responses.tool_names`)."""

    by_chat: Mapping[str, ToolName] = field(default_factory=dict)

    def restore(self, chat_name: str) -> ToolName:
        found = self.by_chat.get(chat_name)
        return found if found is not None else ToolName(chat_name)


NO_TOOLS = ToolNames()


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(ident: str, text: str | None, status: str) -> dict[str, Any]:
    return {"id": ident, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [text_part(text)]}


def reasoning_item(ident: str, text: str | None, status: str) -> dict[str, Any]:
    return {"id": ident, "type": "reasoning", "status": status, "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments of the function it was given as
    (``{"input": "..."}``); the arguments as they are when they are not that."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        found = value.get("input")
        if isinstance(found, str):
            return found
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return arguments


def call_item(ident: str, call_id: str, tool: ToolName, arguments: str | None,
          status: str) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` item; ``arguments`` None: just added."""
    item: dict[str, Any]
    if tool.custom:
        item = {"id": ident, "type": "custom_tool_call", "call_id": call_id, "name": tool.name,
                "input": "" if arguments is None else custom_input(arguments)}
    else:
        item = {"id": ident, "type": "function_call", "call_id": call_id, "name": tool.name,
                "arguments": arguments or "", "status": status}
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item


def usage_object(usage: Usage, thinking: int) -> dict[str, Any]:
    """The Responses ``usage`` (``thinking``: the reasoning tokens among the output)."""
    prompt = usage.input or 0
    output = usage.output or 0
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": usage.cached or 0,
                                     "cache_write_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": thinking},
            "total_tokens": prompt + output}


def reasoning_tokens(usage: object) -> int:
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    found = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else 0


def status_of(finish: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(ident: str, model: str, created_at: float, status: str,
              output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
              incomplete: dict[str, Any] | None = None,
              error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": ident, "object": "response", "created_at": created_at, "status": status,
            "model": model, "output": output, "usage": usage, "error": error,
            "incomplete_details": incomplete, "instructions": None, "metadata": {},
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False}


def estimated(got: Usage | None, prompt_chars: int, output_chars: int) -> tuple[Usage, bool]:
    """The usage said, its missing counts estimated (characters ÷ 4); True: estimated."""
    if got is not None and got.input is not None and got.output is not None:
        return got, False
    cached = got.cached if got is not None else None
    prompt = got.input if got is not None and got.input is not None \
        else estimate_tokens(prompt_chars)
    output = got.output if got is not None and got.output is not None \
        else estimate_tokens(output_chars)
    return Usage(prompt, cached, output), True


def from_chat(answer: dict[str, Any], *, model: str, tools: ToolNames = NO_TOOLS,
              prompt_chars: int = 0, created_at: float | None = None) -> dict[str, Any]:
    """A whole chat answer (parsed) as the Responses answer. ``model``: the name the client
    asked for; ``prompt_chars``: the translated prompt's characters, for the estimate when
    the answer has no usage; ``created_at``: Unix seconds (else the chat answer's
    ``created``). An answer without choices is a 502 ``upstream_bad_response``."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        error = answer.get("error")
        said = error.get("message") if isinstance(error, dict) else error
        raise upstream_bad_response("the model server's answer has no choices"
                                    + (f": {said}" if isinstance(said, str) else ""))
    whole = read_answer(answer)
    output: list[dict[str, Any]] = []
    if whole.reasoning:
        output.append(reasoning_item(new_id("rs_"), whole.reasoning, "completed"))
    if whole.text or not whole.calls:
        output.append(message_item(new_id("msg_"), whole.text, "completed"))
    for call in whole.calls:
        if call.name:  # a call without a name cannot be answered
            tool = tools.restore(call.name)
            output.append(call_item(new_id("ctc_" if tool.custom else "fc_"), call.id, tool,
                                    call.arguments, "completed"))
    chars = len(whole.text) + len(whole.reasoning) + sum(len(c.arguments) for c in whole.calls)
    usage, _ = estimated(whole.usage, prompt_chars, chars)
    status, incomplete = status_of(whole.finish)
    if created_at is None:
        created = answer.get("created")
        created_at = created if isinstance(created, int | float) else 0
    return response_object(new_id("resp_"), model, created_at, status, output,
                           usage_object(usage, reasoning_tokens(answer.get("usage"))),
                           incomplete)
