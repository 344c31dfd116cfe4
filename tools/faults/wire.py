"""What a well-behaved llama.cpp server puts on the wire (UPSTREAMS.md), as bytes: the
headers, the JSON answers, the SSE chunks of a stream and the error bodies. No I/O here;
the behaviours (:mod:`tools.faults.behaviours`) cut, stall or bend these."""

from __future__ import annotations

import json
from typing import Any

from protocol.http1 import LAST_CHUNK as LAST_CHUNK
from protocol.http1 import build_response_head, frame_chunk

CREATED = 1_700_000_000  # fixed, so answers are byte-for-byte the same on every run
FINGERPRINT = "b0-faulty"
JSON_HEADERS: list[tuple[str, str]] = [
    ("Server", "llama.cpp"), ("Keep-Alive", "timeout=5, max=100"),
    ("Content-Type", "application/json; charset=utf-8")]
SSE_HEADERS: list[tuple[str, str]] = [
    ("Server", "llama.cpp"), ("Keep-Alive", "timeout=5, max=100"),
    ("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]
DONE = b"data: [DONE]\n\n"


def compact(obj: Any) -> bytes:
    """llama.cpp's JSON: no spaces, UTF-8 as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    return build_response_head(
        status, b"", [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers])


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk: size line, data, CRLF (never empty: that would end the body)."""
    assert data, "an empty chunk is the last chunk"
    return frame_chunk(data)


def whole(status: int, obj: Any, extra: list[tuple[str, str]] | None = None) -> bytes:
    """A whole JSON answer with Content-Length, head and body together."""
    body = compact(obj)
    headers = [*(extra or []), *JSON_HEADERS, ("Content-Length", str(len(body)))]
    return head(status, headers) + body


def error_body(status: int, message: str, type_: str = "server_error") -> dict[str, Any]:
    """llama.cpp's error shape: an integer ``code`` and its own ``type``."""
    return {"error": {"code": status, "message": message, "type": type_}}


LOADING = error_body(503, "Loading model", "unavailable_error")


def models(model_ids: list[str]) -> dict[str, Any]:
    data = [{"id": m, "object": "model", "created": CREATED, "owned_by": "llamacpp",
             "meta": None} for m in model_ids]
    ollama = [{"name": m, "model": m, "modified_at": "", "size": "", "digest": "",
               "type": "model", "description": "", "tags": [""],
               "capabilities": ["completion"], "parameters": "", "details": {}}
              for m in model_ids]
    return {"models": ollama, "object": "list", "data": data}


def _token(i: int) -> str:
    return f"tok{i} "


def completion(chat: bool, model: str, tokens: int) -> dict[str, Any]:
    """A whole (non-streamed) answer of ``tokens`` tokens."""
    text = "".join(_token(i) for i in range(1, tokens + 1))
    usage = {"completion_tokens": tokens, "prompt_tokens": 5, "total_tokens": tokens + 5}
    if chat:
        choice: dict[str, Any] = {"finish_reason": "stop", "index": 0,
                                  "message": {"role": "assistant", "content": text}}
        kind, ident = "chat.completion", "chatcmpl-faulty"
    else:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
        kind, ident = "text_completion", "cmpl-faulty"
    return {"choices": [choice], "created": CREATED, "model": model,
            "system_fingerprint": FINGERPRINT, "object": kind, "usage": usage, "id": ident}


def _event(chat: bool, model: str, delta: dict[str, Any] | None, text: str,
           finish: str | None) -> bytes:
    if chat:
        choice: dict[str, Any] = {"finish_reason": finish, "index": 0, "delta": delta or {}}
        kind, ident = "chat.completion.chunk", "chatcmpl-faulty"
    else:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        kind, ident = "text_completion", "cmpl-faulty"
    obj = {"choices": [choice], "created": CREATED, "id": ident, "model": model,
           "system_fingerprint": FINGERPRINT, "object": kind}
    return b"data: " + compact(obj) + b"\n\n"


def stream_chunks(chat: bool, model: str, tokens: int) -> list[bytes]:
    """The payloads of the HTTP chunks of a stream, as llama.cpp groups them: the role chunk
    and the first token share one HTTP chunk, every other token has its own, then the
    finish chunk, then ``data: [DONE]`` alone (len = tokens + 2 for tokens >= 1)."""
    first = _event(chat, model, {"role": "assistant", "content": None}, "", None) \
        if chat else b""
    tokens = max(tokens, 1)
    events = [_event(chat, model, {"content": _token(i)}, _token(i), None)
              for i in range(1, tokens + 1)]
    finish = _event(chat, model, {}, "", "stop")
    return [first + events[0], *events[1:], finish, DONE]


def error_event(message: str, type_: str = "server_error", code: int = 500) -> bytes:
    """An in-band SSE error event, as llama.cpp sends one mid-stream."""
    return b"data: " + compact({"error": {"code": code, "message": message,
                                          "type": type_}}) + b"\n\n"


def big_event(chat: bool, model: str, size: int) -> bytes:
    """One SSE event of exactly ``size`` bytes (at least ~300): a token of many x's."""
    bare = _event(chat, model, {"content": ""}, "", None)
    return _event(chat, model, {"content": "x" * max(size - len(bare), 0)},
                  "x" * max(size - len(bare), 0), None)
