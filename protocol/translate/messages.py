"""Anthropic Messages to and from Chat Completions (SPEC §17.1): the request
(:func:`to_chat`), the whole answer (:func:`from_chat`), the context overflow
(:func:`overflow_error`) and the count (:func:`count_answer`); the streamed answer is
:class:`~protocol.translate.messages_stream.Stream`. The face is
:class:`protocol.translate.Translator`'s.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from protocol.errors import Family, SluiceError, bad_request
from protocol.translate.chat import Usage, estimate_tokens, read_answer, text_of_prompt
from protocol.translate.messages_stream import Stream, stop_reason, tool_input, usage_object

__all__ = ["FAMILY", "NAME", "Stream", "answer_options", "count_answer", "from_chat",
           "overflow_error", "to_chat"]

NAME = "messages"
FAMILY = Family.ANTHROPIC

BILLING = "x-anthropic-billing-header:"  # Claude Code's per-request system block: dropped
HOSTED_TOOLS = ("web_search_", "bash_", "text_editor_", "code_execution_", "computer_",
                "web_fetch_", "memory_")
_EFFORT_OF = {"low": "low", "medium": "medium", "high": "high", "max": "high",
              "minimal": "low"}


def _refuse(message: str, param: str | None = None) -> SluiceError:
    return bad_request(message, code="translation_refused", param=param)


def _text_blocks(value: object, where: str) -> list[str]:
    """A string, or a list of text blocks, as its texts."""
    if isinstance(value, str):
        return [value] if value else []
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or a list of blocks", param=where)
    texts = []
    for block in value:
        if isinstance(block, dict) and block.get("type", "text") == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
    return texts


def _system(body: dict[str, Any]) -> list[str]:
    texts = _text_blocks(body.get("system") or [], "system")
    return [text for text in texts if not text.startswith(BILLING)]


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad_request("an image block needs a source", param="messages")
    kind = source.get("type")
    if kind == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _refuse(f"image source type {kind!r} cannot be translated", "messages")
    return {"type": "image_url", "image_url": {"url": url}}


def _document(block: dict[str, Any]) -> str:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        return str(source.get("data", ""))
    raise _refuse("document blocks other than plain text (PDFs) cannot be translated to "
                  "Chat Completions", "messages")


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "image":
                parts.append("[image]")
        text = "\n".join(parts)
    else:
        text = content if isinstance(content, str) else json.dumps(content)
    return "Error: " + text if block.get("is_error") else text


def _user_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user message's content: a plain string when it is text only."""
    if all(part["type"] == "text" for part in parts):
        return "\n\n".join(part["text"] for part in parts)
    return parts


class _Turns:
    """The chat messages being built, with Claude Code's inline system texts waiting for the
    next user turn."""

    def __init__(self, system: list[str]) -> None:
        self.system = system
        self.messages: list[dict[str, Any]] = []
        self.pending: list[str] = []  # inline system texts for the next user turn
        self.seen_user = False

    def inline_system(self, content: object) -> None:
        texts = [t for t in _text_blocks(content, "messages") if not t.startswith(BILLING)]
        if self.seen_user:
            self.pending.extend(texts)
        else:
            self.system.extend(texts)

    def user(self, content: object) -> None:
        self.seen_user = True
        parts: list[dict[str, Any]] = [{"type": "text", "text": t} for t in self.pending]
        self.pending = []
        if isinstance(content, str):
            parts.append({"type": "text", "text": content})
        elif isinstance(content, list):
            for block in content:
                if not isinstance(block, dict):
                    raise bad_request("a content block must be an object", param="messages")
                kind = block.get("type")
                if kind == "text":
                    parts.append({"type": "text", "text": str(block.get("text", ""))})
                elif kind == "image":
                    parts.append(_image(block))
                elif kind == "document":
                    parts.append({"type": "text", "text": _document(block)})
                elif kind == "tool_result":  # all of a turn's tool messages first
                    self.messages.append({"role": "tool",
                                          "tool_call_id": str(block.get("tool_use_id", "")),
                                          "content": _tool_result_text(block)})
                # other blocks (search results, redacted thinking) carry nothing to translate
        else:
            raise bad_request("a message's content must be a string or a list of blocks",
                              param="messages")
        if parts:
            self.messages.append({"role": "user", "content": _user_parts(parts)})

    def assistant(self, content: object, keep_thinking: bool) -> None:
        if isinstance(content, str):
            self.messages.append({"role": "assistant", "content": content})
            return
        if not isinstance(content, list):
            raise bad_request("a message's content must be a string or a list of blocks",
                              param="messages")
        texts, thinking, calls = [], [], []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "thinking" and keep_thinking:
                thinking.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")),
                                           "arguments": json.dumps(block.get("input", {}),
                                                                   ensure_ascii=False)}})
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thinking:
            message["reasoning_content"] = "".join(thinking)
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)


def _has_text(content: object) -> bool:
    if isinstance(content, str):
        return bool(content)
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("text", "image", "document") for b in content)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    given = body.get("messages")
    if not isinstance(given, list):
        raise bad_request("messages must be a list", param="messages")
    turns = _Turns(_system(body))
    # thinking is kept only after the last user turn with text (the tool loop under way)
    last_text = max((n for n, m in enumerate(given) if isinstance(m, dict)
                     and m.get("role") == "user" and _has_text(m.get("content"))), default=-1)
    for n, message in enumerate(given):
        if not isinstance(message, dict):
            raise bad_request("each message must be an object", param="messages")
        role, content = message.get("role"), message.get("content", "")
        if role == "user":
            turns.user(content)
        elif role == "assistant":
            turns.assistant(content, keep_thinking=n > last_text)
        elif role == "system":
            turns.inline_system(content)
        else:
            raise bad_request(f"unknown message role {role!r}", param="messages")
    if turns.pending:  # inline system texts after the last user turn
        turns.messages.append({"role": "user", "content": "\n\n".join(turns.pending)})
    system = "\n\n".join(turns.system)
    return ([{"role": "system", "content": system}] if system else []) + turns.messages


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("tools must be a list", param="tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise bad_request("each tool must be an object", param="tools")
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith(HOSTED_TOOLS):
            continue  # Anthropic's hosted tools: the server has none of them
        function: dict[str, Any] = {"name": str(tool.get("name", "")),
                                    "parameters": tool.get("input_schema") or
                                    {"type": "object", "properties": {}}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, Any], chat: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind == "none":
        chat["tool_choice"] = "none"
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _effort(body: dict[str, Any]) -> str | None:
    config = body.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("effort"), str):
        return _EFFORT_OF.get(config["effort"])
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int):
            return "low" if budget <= 2048 else "medium" if budget <= 8192 else "high"
        return "medium"
    return None


def to_chat(body: dict[str, Any], *, context: int | None) -> dict[str, Any]:
    """A Messages request body as a Chat Completions body (see the module)."""
    if body.get("mcp_servers"):
        raise _refuse("mcp_servers cannot be translated to Chat Completions", "mcp_servers")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    if body.get("tools"):
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
            if isinstance(body.get("tool_choice"), dict):
                _tool_choice(body["tool_choice"], chat)
    for name in ("temperature", "top_p", "top_k"):
        if name in body:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    effort = _effort(body)
    if effort is not None:
        chat["reasoning_effort"] = effort
    config = body.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("format"), dict):
        fmt = config["format"]
        if fmt.get("type") == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": fmt.get("schema", {}), "strict": True}}
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        if context is not None:
            room = context - estimate_tokens(text_of_prompt(chat))
            max_tokens = max(1, min(max_tokens, room))
        chat["max_tokens"] = max_tokens
    return chat


def new_id() -> str:
    return "msg_" + secrets.token_hex(12)


def from_chat(answer: dict[str, Any], *, model: str, prompt_chars: int = 0,
              **options: Any) -> dict[str, Any]:
    """A whole chat answer as a Messages answer (see the module)."""
    whole = read_answer(answer)
    content: list[dict[str, Any]] = []
    if whole.reasoning:
        content.append({"type": "thinking", "thinking": whole.reasoning, "signature": ""})
    if whole.text:
        content.append({"type": "text", "text": whole.text})
    for call in whole.calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": tool_input(call.arguments)})
    usage = whole.usage
    if usage is None or usage.input is None or usage.output is None:
        usage = Usage(estimate_tokens(prompt_chars), None,
                      estimate_tokens(len(whole.text) + len(whole.reasoning)
                                      + sum(len(c.arguments) for c in whole.calls)))
    reason, sequence = stop_reason(whole.finish, bool(whole.calls), whole.matched)
    return {"id": new_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage_object(usage)}


def overflow_error(tokens: int | None, maximum: int | None) -> SluiceError:
    """Anthropic's words for a prompt over the context (Claude Code compacts on them)."""
    if tokens is not None and maximum is not None:
        message = f"prompt is too long: {tokens} tokens > {maximum} maximum"
    elif maximum is not None:
        message = f"prompt is too long: more tokens than the {maximum} maximum"
    else:
        message = "prompt is too long for the model's context"
    return SluiceError(400, message, type="invalid_request_error", code=None)


def count_answer(tokens: int) -> dict[str, Any]:
    return {"input_tokens": tokens}


def answer_options(body: dict[str, Any]) -> dict[str, Any]:
    """Nothing of the request but its model shapes a Messages answer."""
    return {}
