"""One error family for the whole gateway.

Every foreign exception (h11, OS, cattrs, yaml) is translated once, at the edge, into a
:class:`SluiceError` that knows where it came from and which HTTP status it suggests. Its body in
each client family's shape (OpenAI's, Anthropic's, the Responses API's, Ollama's: ``Family``)
is built here and nowhere else.
"""

from __future__ import annotations

import enum
import json


class Source(enum.Enum):
    CLIENT = "client"  # the caller sent something we refuse
    UPSTREAM = "upstream"  # a model server or node failed us
    GATEWAY = "gateway"  # our own fault
    CONFIG = "config"  # a configuration value is invalid


class Family(enum.Enum):
    """The API a request speaks, decided once from its path (:func:`family_of`): the shape
    of the gateway's own errors for it (SPEC §12)."""

    OPENAI = "openai"  # /v1/chat/completions and every other OpenAI path, our own API
    ANTHROPIC = "anthropic"  # /v1/messages*
    RESPONSES = "responses"  # /v1/responses*
    OLLAMA = "ollama"  # /api/* but /api/v1/*: the Ollama API


def family_of(path: str) -> Family:
    """The family of a request path (a few prefix checks: it runs once per request)."""
    if path.startswith("/v1/"):
        if path.startswith("/v1/messages"):
            return Family.ANTHROPIC
        if path.startswith("/v1/responses"):
            return Family.RESPONSES
        return Family.OPENAI
    if path.startswith("/api/") and not path.startswith("/api/v1/"):
        return Family.OLLAMA
    return Family.OPENAI


# Anthropic's error types by status (SPEC §12); other 5xx are "api_error".
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_type(status: int) -> str:
    known = ANTHROPIC_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


class SluiceError(Exception):
    """An error with an HTTP status and a body in the shape of the request's family
    (OpenAI's unless told)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str | None = None,
        param: str | None = None,
        source: Source = Source.GATEWAY,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        anthropic: str | None = None,
    ) -> None:
        super().__init__(message)
        self.anthropic = anthropic  # Anthropic's error type when not the status's
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.source = source
        self.headers = headers

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"source={self.source.value}, message={self.message!r})"
        )

    def to_dict(self) -> dict[str, object]:
        return error_dict(self.message, self.type, self.code, self.param)

    def anthropic_dict(self) -> dict[str, object]:
        """Anthropic's ``error`` object: its type by status, the message naming our code."""
        message = self.message if self.code is None else f"{self.message} ({self.code})"
        return {"type": self.anthropic or anthropic_type(self.status), "message": message}

    def payload(self, family: Family = Family.OPENAI) -> object:
        """The error body's JSON value in ``family``'s shape."""
        if family is Family.ANTHROPIC:
            return {"type": "error", "error": self.anthropic_dict()}
        if family is Family.OLLAMA:
            return {"error": self.message}
        return {"error": self.to_dict()}

    def body(self, family: Family = Family.OPENAI) -> bytes:
        return json.dumps(self.payload(family), separators=(",", ":")).encode()


def error_dict(
    message: str, type: str, code: str | None = None, param: str | None = None
) -> dict[str, object]:
    return {"message": message, "type": type, "code": code, "param": param}


# Constructors for the errors the gateway raises, so a status, type and code are chosen once.


def bad_request(
    message: str, code: str = "invalid_request", param: str | None = None
) -> SluiceError:
    return SluiceError(400, message, type="invalid_request_error", code=code, param=param,
                       source=Source.CLIENT)


def not_found(message: str) -> SluiceError:
    return SluiceError(404, message, type="invalid_request_error", code="not_found",
                       source=Source.CLIENT)


def model_not_found(model: str) -> SluiceError:
    return SluiceError(404, f"model {model!r} does not exist", type="invalid_request_error",
                       code="model_not_found", param="model", source=Source.CLIENT)


def method_not_allowed(method: str, allow: tuple[str, ...]) -> SluiceError:
    return SluiceError(
        405,
        f"method {method} is not allowed here; allowed: {', '.join(allow)}",
        type="invalid_request_error",
        code="method_not_allowed",
        source=Source.CLIENT,
        headers=((b"allow", ", ".join(allow).encode()),),
    )


def method_not_implemented(method: str) -> SluiceError:
    shown = method if len(method) <= 32 else method[:32] + "..."
    return SluiceError(501, f"method {shown} is not implemented by this gateway",
                       type="invalid_request_error", code="method_not_implemented",
                       source=Source.CLIENT)


def upgrade_required(message: str, *, version: bytes | None = None) -> SluiceError:
    """426: this path speaks only WebSocket (RFC 9110 §15.5.22); ``version``: the
    WebSocket version understood, when the client asked for another (RFC 6455 §4.4)."""
    headers = [(b"upgrade", b"websocket"), (b"connection", b"upgrade")]
    if version is not None:
        headers.append((b"sec-websocket-version", version))
    return SluiceError(426, message, type="invalid_request_error", code="upgrade_required",
                       source=Source.CLIENT, headers=tuple(headers))


def request_timeout(message: str) -> SluiceError:
    return SluiceError(408, message, type="invalid_request_error", code="request_timeout",
                       source=Source.CLIENT)


def payload_too_large(limit: int, message: str | None = None,
                      param: str | None = "api.max_body_size") -> SluiceError:
    return SluiceError(413, message or f"request body is larger than api.max_body_size "
                                       f"({limit} bytes)",
                       type="invalid_request_error", code="request_too_large",
                       param=param, source=Source.CLIENT)


def rate_limit_error(message: str, retry_after: int | bytes,
                     source: Source = Source.CLIENT) -> SluiceError:
    """429 ``rate_limit_exceeded`` with ``Retry-After`` (whole seconds)."""
    value = retry_after if isinstance(retry_after, bytes) else str(retry_after).encode()
    return SluiceError(429, message, type="rate_limit_error", code="rate_limit_exceeded",
                       source=source, headers=((b"retry-after", value),))


def queue_full(model: str, retry_after: int) -> SluiceError:
    """SPEC §18: 429 ``queue_full`` with ``Retry-After``; Anthropic's ``overloaded_error``."""
    return SluiceError(429, f"too many requests are waiting for model {model!r}",
                       type="rate_limit_error", code="queue_full", source=Source.GATEWAY,
                       headers=((b"retry-after", str(retry_after).encode()),),
                       anthropic="overloaded_error")


def queue_timeout(model: str, seconds: float) -> SluiceError:
    """SPEC §18: 504 ``queue_timeout`` after ``timeouts.request.queue``; Anthropic's
    ``overloaded_error``."""
    return SluiceError(504, f"no slot for model {model!r} within {seconds:g}s "
                       "(timeouts.request.queue)", type="server_error", code="queue_timeout",
                       source=Source.GATEWAY, anthropic="overloaded_error")


def headers_too_large(message: str) -> SluiceError:
    return SluiceError(431, message, type="invalid_request_error",
                       code="request_header_fields_too_large", source=Source.CLIENT)


def version_not_supported(version: str) -> SluiceError:
    return SluiceError(505, f"HTTP version {version} is not supported; use HTTP/1.1",
                       type="invalid_request_error", code="http_version_not_supported",
                       source=Source.CLIENT)


def model_not_available(model: str) -> SluiceError:
    return SluiceError(503, f"model {model!r} is not available on any backend",
                       type="server_error", code="model_not_available", param="model",
                       source=Source.GATEWAY)


def alias_target_not_available(alias: str, target: str) -> SluiceError:
    """503 for an alias whose target does not exist now (SPEC §12; nothing is forwarded)."""
    return SluiceError(503, f"model {alias!r} is an alias of {target!r}, which is not "
                            "available on any backend or node",
                       type="server_error", code="model_not_available", param="model",
                       source=Source.GATEWAY)


def all_circuits_open(model: str) -> SluiceError:
    return SluiceError(503, f"every node that holds model {model!r} has its circuit open",
                       type="server_error", code="all_circuits_open", param="model",
                       source=Source.GATEWAY)


def overloaded(message: str) -> SluiceError:
    return SluiceError(503, message, type="server_error", code="server_overloaded",
                       source=Source.GATEWAY)


def gateway_stopping() -> SluiceError:
    """A request that needs something started while the gateway stops."""
    return SluiceError(503, "the gateway is stopping", type="server_error",
                       code="shutting_down", source=Source.GATEWAY)


def shutting_down() -> SluiceError:
    """A streamed answer cut at the drain deadline of a stopping gateway."""
    return SluiceError(503, "the gateway is stopping: the answer was cut at its drain deadline",
                       type="server_error", code="shutting_down", source=Source.GATEWAY)


def model_memory_exhausted(message: str) -> SluiceError:
    """A managed model that cannot fit the memory budget (SPEC §11)."""
    return SluiceError(503, message, type="server_error", code="model_memory_exhausted",
                       param="model", source=Source.GATEWAY)


def model_load_failed(model: str, reason: str) -> SluiceError:
    """A managed model whose server could not start; ``reason`` carries no secret."""
    return SluiceError(503, f"model {model!r} failed to load: {reason}", type="server_error",
                       code="model_load_failed", param="model", source=Source.UPSTREAM)


def model_load_timeout(model: str, seconds: float, detail: str = "") -> SluiceError:
    """``detail``: what the load waited for and its server's last log line, when known."""
    return SluiceError(504, f"model {model!r} did not load within timeouts.model_load "
                            f"({seconds:g}s)" + (f": {detail}" if detail else ""),
                       type="server_error", code="model_load_timeout", param="model",
                       source=Source.UPSTREAM)


def upstream_unreachable(message: str) -> SluiceError:
    return SluiceError(502, message, type="server_error", code="upstream_connection_error",
                       source=Source.UPSTREAM)


def upstream_bad_response(message: str) -> SluiceError:
    return SluiceError(502, message, type="server_error", code="upstream_protocol_error",
                       source=Source.UPSTREAM)


def upstream_timeout(message: str) -> SluiceError:
    return SluiceError(504, message, type="server_error", code="upstream_timeout",
                       source=Source.UPSTREAM)


def internal(message: str) -> SluiceError:
    return SluiceError(500, message, type="server_error", code="internal_error",
                       source=Source.GATEWAY)


def no_such_item(what: str, param: str, value: str) -> SluiceError:
    """404 for an admin API item that does not exist (an access key, a node)."""
    return SluiceError(404, f"no {what} with {param} {value!r}", type="invalid_request_error",
                       code="not_found", param=param, source=Source.CLIENT)


def node_exists(fingerprint: str) -> SluiceError:
    return SluiceError(409, f"node {fingerprint!r} is already registered",
                       type="invalid_request_error", code="node_exists", param="baseUrl",
                       source=Source.CLIENT)


def not_saved(what: str, reason: str | None) -> SluiceError:
    """500 for a settings write the disk refused (nothing was changed)."""
    return SluiceError(500, f"cannot save {what}: {reason or 'the write failed'}",
                       type="server_error", code="internal_error", source=Source.GATEWAY)


class ConfigError(SluiceError):
    """An invalid configuration value; ``param`` is the dotted YAML path."""

    def __init__(self, path: str, message: str) -> None:
        text = f"{path}: {message}" if path else message
        super().__init__(422, text, type="invalid_request_error", code="invalid_config",
                         param=path or None, source=Source.CONFIG)
        self.path = path
