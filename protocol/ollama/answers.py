"""Whole answers: a model server's OpenAI answer (not streamed) as Ollama's, and the answer
to a request that only loads or unloads a model.

- chat: ``{"model", "created_at", "message": {"role": "assistant", "content",
  ("tool_calls"), ("thinking")}, "done": true, "done_reason", <figures>}``;
- generate: the same with ``"response"`` for ``message``;
- embed: ``{"model", "embeddings": [[...], ...], "total_duration", "load_duration",
  "prompt_eval_count"}``, in the order of the inputs;
- embeddings (legacy): ``{"embedding": [...]}``.

The figures are :mod:`protocol.ollama.metrics`'. An answer that is not the OpenAI shape
(or an error inside a 2xx answer) is a 502 ``upstream_bad_response``; a model server's
error answer (status >= 400) is :func:`protocol.ollama.errors.upstream_error`. Whole
answers are sent as ``application/json``, streams as ``application/x-ndjson``
(Ollama's two content types).
"""

from __future__ import annotations

from typing import Any

from protocol.errors import SluiceError, upstream_bad_response
from protocol.ollama.errors import upstream_message
from protocol.ollama.metrics import Timing, Usage, done_reason
from protocol.ollama.requests import Answer, Kind, LoadOnly
from protocol.ollama.tool_calls import whole_tool_calls
from protocol.ollama.wire import NotJson, json_bytes, load_json

__all__ = ["JSON_TYPE", "NDJSON_TYPE", "load_answer", "whole_answer"]

JSON_TYPE = b"application/json; charset=utf-8"
NDJSON_TYPE = b"application/x-ndjson"


def whole_answer(answer: Answer, body: bytes, created_at: str, timing: Timing) -> bytes:
    """The Ollama answer (JSON bytes) for a model server's whole 2xx answer ``body``."""
    try:
        doc = load_json(body)
    except NotJson:
        raise _bad("its answer is not JSON") from None
    if not isinstance(doc, dict):
        raise _bad("its answer is not a JSON object")
    message = upstream_message(doc)
    if message is not None:
        raise upstream_bad_response(message)
    usage = Usage()
    usage.see(doc)
    if answer.kind is Kind.EMBED:
        return json_bytes({
            "model": answer.model,
            "embeddings": _embeddings(doc),
            "total_duration": max(0, timing.total_ns),
            "load_duration": max(0, timing.load_ns),
            "prompt_eval_count": usage.prompt_tokens or 0,
        })
    if answer.kind is Kind.EMBEDDINGS:
        vectors = _embeddings(doc)
        return json_bytes({"embedding": vectors[0] if vectors else []})
    choice = _choice(doc)
    if answer.text_completion:
        out = answer.line(created_at, _text(choice.get("text")), done=True)
    else:
        reply = choice.get("message")
        if not isinstance(reply, dict):
            raise _bad("its choice has no message")
        out = answer.line(created_at, _text(reply.get("content")), done=True,
                          thinking=_text(reply.get("reasoning_content")))
        calls = whole_tool_calls(reply.get("tool_calls")) if answer.kind is Kind.CHAT else []
        if calls:
            out["message"]["tool_calls"] = calls
    out["done_reason"] = done_reason(choice.get("finish_reason"))
    out.update(usage.fields(timing))
    return json_bytes(out)


def load_answer(load: LoadOnly, created_at: str) -> bytes:
    """The answer to a request that only loaded (or unloaded) its model, as Ollama's:
    ``done_reason`` ``load`` or ``unload``; embed answers no vectors."""
    answer = load.answer
    if answer.kind is Kind.EMBED:
        return json_bytes({"model": answer.model, "embeddings": []})
    if answer.kind is Kind.EMBEDDINGS:
        return json_bytes({"embedding": []})
    out: dict[str, Any] = {"model": answer.model, "created_at": created_at}
    if answer.kind is Kind.CHAT:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out["done"] = True
    out["done_reason"] = "unload" if load.unload else "load"
    return json_bytes(out)


def _bad(what: str) -> SluiceError:
    return upstream_bad_response(f"the model server's answer cannot be translated: {what}")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _choice(doc: dict[str, Any]) -> dict[str, Any]:
    choices = doc.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                return choice
    raise _bad("it has no choice")


def _embeddings(doc: dict[str, Any]) -> list[list[float]]:
    data = doc.get("data")
    if not isinstance(data, list):
        raise _bad("it has no data list")
    items: list[tuple[int, list[float]]] = []
    for position, item in enumerate(data):
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
            raise _bad(f"data[{position}] has no embedding (a list of numbers)")
        index = item.get("index")
        items.append((index if type(index) is int else position, vector))
    items.sort(key=lambda pair: pair[0])
    return [vector for _, vector in items]
