"""The routing facts of an OpenAI request: which model, streamed or not, which timeout class.

Only ``model`` and ``stream`` are read from the body (and ``messages``, when there is one,
must be a list); the body itself is forwarded untouched.
"""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING, Any

from protocol.errors import bad_request
from protocol.json_text import scan_json

if TYPE_CHECKING:
    from protocol.config import TimeoutsConfig


_SPACE = " \t\n\r"  # what JSON allows around a value


def _json_document(body: bytes) -> Any:
    """``json.loads(body)``: a body that starts with ``{`` (UTF-8, then) goes straight to
    the scanner; anything else, and anything it refuses, to json.loads, whose exception
    says what is wrong."""
    if body[:1] == b"{" and body[1:2] != b"\x00":
        try:
            text = body.decode("utf-8", "surrogatepass")
            doc, end = scan_json(text, 0)
        except (ValueError, StopIteration, RecursionError):
            pass
        else:
            if end == len(text) or not text[end:].strip(_SPACE):
                return doc
    return json.loads(body)


class TimeoutClass(enum.Enum):
    STANDARD = "standard"
    IMAGE_GENERATION = "image_generation"


class RequestInfo:
    """``doc`` is the parsed body (read, never changed: cache-aware routing reads its prompt,
    SPEC §15) and ``path`` the path it was sent to; both absent for a request made up by
    the gateway."""

    __slots__ = ("doc", "model", "path", "stream", "timeout_class")

    def __init__(self, model: str, stream: bool, timeout_class: TimeoutClass,
                 doc: dict[str, Any] | None = None, path: str = "") -> None:
        self.model = model
        self.stream = stream
        self.timeout_class = timeout_class
        self.doc = doc
        self.path = path

    def __repr__(self) -> str:
        return (f"RequestInfo(model={self.model!r}, stream={self.stream}, "
                f"timeout_class={self.timeout_class.value})")


def request_path(target: bytes) -> str:
    """The path of a request target, without its query string."""
    return target.split(b"?", 1)[0].decode("latin-1")


def timeout_class_for(path: str) -> TimeoutClass:
    if path.startswith("/v1/images/"):
        return TimeoutClass.IMAGE_GENERATION
    return TimeoutClass.STANDARD


def parse_request_body(path: str, body: bytes) -> RequestInfo:
    """Read ``model`` and ``stream`` from a JSON request body, or raise a 400 SluiceError."""
    if not body:
        raise bad_request("the request body is empty; a JSON object with \"model\" is required",
                          code="missing_model", param="model")
    try:
        doc = _json_document(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}",
                          code="invalid_json") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    model = doc.get("model")
    if model is None:
        raise bad_request("the request body has no \"model\"", code="missing_model",
                          param="model")
    if not isinstance(model, str) or not model:
        raise bad_request("\"model\" must be a non-empty string", code="invalid_model",
                          param="model")
    messages = doc.get("messages")  # chat completions' and Anthropic's: a list, always
    if messages is not None and not isinstance(messages, list):
        raise bad_request("\"messages\" must be a list", code="invalid_messages",
                          param="messages")
    stream = doc.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("\"stream\" must be true or false", code="invalid_stream",
                          param="stream")
    return RequestInfo(model, stream, timeout_class_for(path), doc, path)


def total_timeout(timeouts: TimeoutsConfig, info: RequestInfo) -> tuple[float, str]:
    """The request's own total limit in seconds and its dotted config path."""
    if info.stream:
        return timeouts.request.streaming.total, "timeouts.request.streaming.total"
    if info.timeout_class is TimeoutClass.IMAGE_GENERATION:
        return (timeouts.request.image_generation.total,
                "timeouts.request.image_generation.total")
    return timeouts.request.standard.total, "timeouts.request.standard.total"
