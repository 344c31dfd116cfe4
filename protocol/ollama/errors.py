"""The Ollama API's errors: a body ``{"error": "<message>"}`` with the status, and in a
stream one such line (SPEC §12).

The gateway's errors are :class:`protocol.errors.SluiceError` values; a request of the
Ollama family (``protocol.errors.Family.OLLAMA``) has them written in Ollama's shape by the
response, so the constructors here only choose status and message. A model server speaks
OpenAI's error shape (``{"error": {"message": ...}}``; llama.cpp adds an integer ``code``):
:func:`upstream_error` and :func:`upstream_message` read the message out of it.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import SluiceError, Source, bad_request
from protocol.ollama.wire import load_json, ndjson_line

__all__ = [
    "NOT_SUPPORTED_STATUS",
    "error_line",
    "invalid",
    "model_not_found",
    "not_supported",
    "upstream_error",
    "upstream_message",
]

# Pulling, pushing, creating, copying and deleting models are valid Ollama requests that
# sluice does not implement (RFC 9110 §15.6.2: 501 is "the server does not support the
# functionality required"); a client shows the message, which says what to do instead.
NOT_SUPPORTED_STATUS = 501

_WHAT = {
    "/api/pull": "download models",
    "/api/push": "upload models",
    "/api/create": "create models",
    "/api/copy": "copy models",
    "/api/delete": "delete models",
    "/api/blobs": "store model blobs",
}
_MESSAGE_CAP = 1000  # characters of an upstream's error message kept


def invalid(message: str) -> SluiceError:
    """400: the client's Ollama request is not one we can translate."""
    return bad_request(message, code="invalid_ollama_request")


def model_not_found(name: str) -> SluiceError:
    """404 with Ollama's own wording, for ``/api/show`` of a model nobody serves."""
    return SluiceError(404, f"model '{name}' not found", type="invalid_request_error",
                       code="model_not_found", param="model", source=Source.CLIENT)


def not_supported(path: str) -> SluiceError:
    """501 for an Ollama endpoint that manages model files (``/api/pull``, ``/api/push``,
    ``/api/create``, ``/api/copy``, ``/api/delete``, ``/api/blobs/...``): sluice serves the
    GGUF files it finds, it does not fetch or change them."""
    key = "/api/blobs" if path.startswith("/api/blobs") else path
    what = _WHAT.get(key, "manage model files")
    message = (f"sluice does not {what}: it serves the GGUF files in its models folder. "
               "Download a GGUF file (e.g. from Hugging Face) and put it in the folder "
               "(model_loading.dirs, by default <data dir>/models); sluice finds it within "
               "10 seconds and lists it by its file name. To remove a model, delete its file.")
    return SluiceError(NOT_SUPPORTED_STATUS, message, type="invalid_request_error",
                       code="not_supported", source=Source.CLIENT)


def error_line(message: str) -> bytes:
    """One NDJSON line ``{"error": message}``: how an Ollama stream ends when it breaks."""
    return ndjson_line({"error": message})


def upstream_message(payload: Any) -> str | None:
    """The message of an OpenAI-shaped error value (``{"error": {"message": M}}``, or
    ``{"error": "M"}`` as Ollama and some servers write it); None when ``payload`` is not
    an error."""
    if not isinstance(payload, dict) or "error" not in payload:
        return None
    error = payload["error"]
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message[:_MESSAGE_CAP]
        kind = error.get("type")
        return f"the model server answered with an error ({kind})" if isinstance(
            kind, str) else "the model server answered with an error"
    if isinstance(error, str) and error:
        return error[:_MESSAGE_CAP]
    return "the model server answered with an error"


def upstream_error(status: int, body: bytes) -> SluiceError:
    """A model server's error answer (status >= 400) as the gateway's error with the same
    status, its message taken from the body (OpenAI's shape, or text)."""
    message: str | None = None
    try:
        message = upstream_message(load_json(body))
    except ValueError:  # not JSON (a plain-text 500, say): its text, shortened
        text = body.decode("utf-8", "replace").strip()
        message = text[:_MESSAGE_CAP] or None
    if message is None:
        message = f"the model server answered {status}"
    source = Source.CLIENT if 400 <= status < 500 else Source.UPSTREAM
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return SluiceError(status, message, type=kind, code="upstream_error", source=source)
