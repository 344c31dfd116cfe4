"""An Ollama request body as the OpenAI request to send (SPEC §12).

``POST /api/chat`` and ``/api/generate`` become ``/v1/chat/completions`` (generate: the
``system`` and ``prompt`` as two messages), ``/api/generate`` with ``raw: true``
``/v1/completions`` (the prompt as it is), ``/api/embed`` and ``/api/embeddings``
``/v1/embeddings``. :func:`translate_request` gives a :class:`Translated` (the path, the
body, what the endpoint and the answer's translation need) or, for a request that only
loads the model (no messages, no prompt, no input; Ollama's way to load, and with
``keep_alive: 0`` to unload), a :class:`LoadOnly`. Bad input raises the 400
:class:`~protocol.errors.SluiceError` with Ollama's kind of message.

Streaming is Ollama's default for chat and generate (``stream`` absent or null is true); a
stream asks for usage (``stream_options.include_usage``) so its last line has the counts.

Ignored, as a model server behind an OpenAI endpoint has no use for them: ``think`` (a
thinking model's reasoning is passed on when the server sends it), ``template`` (the
server applies the model's own chat template), ``context`` (Ollama's deprecated token
memory), ``suffix`` (fill-in-the-middle), ``truncate`` and ``shift`` (the server's context
rules apply), ``logprobs``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from protocol.ollama.errors import invalid
from protocol.ollama.images import image_parts
from protocol.ollama.keep_alive import parse_keep_alive
from protocol.ollama.messages import content_value, openai_messages, openai_tools
from protocol.ollama.options import openai_options, response_format
from protocol.ollama.wire import NotJson, json_bytes, load_json

__all__ = [
    "CHAT_COMPLETIONS",
    "COMPLETIONS",
    "EMBEDDINGS",
    "PATHS",
    "Answer",
    "Kind",
    "LoadOnly",
    "Translated",
    "translate_request",
]

CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


class Kind(enum.Enum):
    """Which Ollama endpoint a request came to: the shape its answer must have."""

    CHAT = "chat"  # /api/chat: message lines
    GENERATE = "generate"  # /api/generate: response lines
    EMBED = "embed"  # /api/embed: {model, embeddings: [[...]]}
    EMBEDDINGS = "embeddings"  # /api/embeddings (legacy): {embedding: [...]}


PATHS = {"/api/chat": Kind.CHAT, "/api/generate": Kind.GENERATE, "/api/embed": Kind.EMBED,
         "/api/embeddings": Kind.EMBEDDINGS}


@dataclass(frozen=True, slots=True)
class Answer:
    """What translating the answer back needs."""

    kind: Kind
    model: str  # the model name as the client sent it: Ollama echoes it in every line
    text_completion: bool = False  # the upstream answers /v1/completions (generate, raw)

    def line(self, created_at: str, text: str, *, thinking: str = "",
             done: bool = False) -> dict[str, Any]:
        """One line of this answer (a stream's, or a whole answer's base): chat's
        ``message``, generate's ``response``, with a reasoning model's ``thinking``."""
        line: dict[str, Any] = {"model": self.model, "created_at": created_at}
        if self.kind is Kind.CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            line["message"] = message
        else:
            line["response"] = text
            if thinking:
                line["thinking"] = thinking
        line["done"] = done
        return line


@dataclass(frozen=True, slots=True)
class Translated:
    """The OpenAI request to send for an Ollama request."""

    path: str  # /v1/chat/completions, /v1/completions or /v1/embeddings
    body: bytes  # compact JSON, its "model" the name the client sent
    model: str  # the name to route by (as sent)
    stream: bool  # the answer is a stream (NDJSON to the client, SSE from upstream)
    keep_alive: float | None  # seconds the model stays loaded after; math.inf: forever
    answer: Answer


@dataclass(frozen=True, slots=True)
class LoadOnly:
    """A request that asks only to load the model (or, with ``keep_alive`` 0, to unload
    it): the endpoint does that and answers :func:`protocol.ollama.load_answer`."""

    answer: Answer
    keep_alive: float | None

    @property
    def model(self) -> str:
        return self.answer.model

    @property
    def unload(self) -> bool:
        return self.keep_alive == 0


def translate_request(kind: Kind, body: bytes) -> Translated | LoadOnly:
    """The translation of one Ollama request body (see the module)."""
    doc = _object(body)
    model = doc.get("model")
    if model is None or model == "":
        raise invalid("model is required")
    if not isinstance(model, str):
        raise invalid("model must be a string")
    keep_alive = parse_keep_alive(doc.get("keep_alive"))
    if kind is Kind.CHAT:
        return _chat(doc, model, keep_alive)
    if kind is Kind.GENERATE:
        return _generate(doc, model, keep_alive)
    return _embed(doc, model, keep_alive, kind)


def _object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise invalid("missing request body")
    try:
        doc = load_json(body)
    except NotJson:
        raise invalid("the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    return doc


def _stream(doc: dict[str, Any]) -> bool:
    stream = doc.get("stream")
    if stream is None:
        return True  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise invalid("stream must be true or false")
    return stream


def _text(doc: dict[str, Any], name: str) -> str:
    value = doc.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string")
    return value


def _sampling(doc: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
    """The fields every generating request has: model, stream, usage, options."""
    fields: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        fields["stream_options"] = {"include_usage": True}
    fields.update(openai_options(doc.get("options")))
    return fields


def _chat(doc: dict[str, Any], model: str, keep_alive: float | None) -> Translated | LoadOnly:
    stream = _stream(doc)
    messages = doc.get("messages")
    if messages is None:
        messages = []
    if not isinstance(messages, list):
        raise invalid("messages must be a list")
    fields = _sampling(doc, model, stream)
    fmt = response_format(doc.get("format"))
    tools = openai_tools(doc.get("tools"))
    translated = openai_messages(messages)
    answer = Answer(Kind.CHAT, model)
    if not translated:
        return LoadOnly(answer, keep_alive)
    fields["messages"] = translated
    if fmt is not None:
        fields["response_format"] = fmt
    if tools is not None:
        fields["tools"] = tools
    return Translated(CHAT_COMPLETIONS, json_bytes(fields), model, stream, keep_alive, answer)


def _generate(doc: dict[str, Any], model: str,
              keep_alive: float | None) -> Translated | LoadOnly:
    stream = _stream(doc)
    prompt = _text(doc, "prompt")
    system = _text(doc, "system")
    raw = doc.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise invalid("raw must be true or false")
    images = image_parts(doc.get("images"), "images")
    fields = _sampling(doc, model, stream)
    fmt = response_format(doc.get("format"))
    if raw:
        if system:
            raise invalid("raw mode does not support system")
        if images:
            raise invalid("raw mode does not support images: send them without raw")
    answer = Answer(Kind.GENERATE, model, text_completion=bool(raw))
    if not prompt:
        return LoadOnly(answer, keep_alive)
    if raw:
        fields["prompt"] = prompt
        if fmt is not None:  # llama.cpp's own field: /v1/completions has no response_format
            schema = fmt.get("json_schema", {}).get("schema", {"type": "object"})
            fields["json_schema"] = schema
        return Translated(COMPLETIONS, json_bytes(fields), model, stream, keep_alive, answer)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": content_value(prompt, images)})
    fields["messages"] = messages
    if fmt is not None:
        fields["response_format"] = fmt
    return Translated(CHAT_COMPLETIONS, json_bytes(fields), model, stream, keep_alive, answer)


def _embed(doc: dict[str, Any], model: str, keep_alive: float | None,
           kind: Kind) -> Translated | LoadOnly:
    options = doc.get("options")
    if options is not None and not isinstance(options, dict):
        raise invalid("options must be an object")
    fields: dict[str, Any] = {"model": model}
    if kind is Kind.EMBEDDINGS:
        prompt = _text(doc, "prompt")
        texts = [prompt] if prompt else []
    else:
        texts = _inputs(doc.get("input"))
        dimensions = doc.get("dimensions")
        if dimensions is not None:
            if isinstance(dimensions, bool) or not isinstance(dimensions, int) \
                    or dimensions <= 0:
                raise invalid("dimensions must be a positive whole number")
            fields["dimensions"] = dimensions
    answer = Answer(kind, model)
    if not texts:
        return LoadOnly(answer, keep_alive)
    fields["input"] = texts
    fields["encoding_format"] = "float"
    return Translated(EMBEDDINGS, json_bytes(fields), model, False, keep_alive, answer)


def _inputs(value: object) -> list[str]:
    """``/api/embed``'s ``input``: a string or a list of them; empty means "load"."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise invalid(f"input[{i}] must be a string")
        return list(value)
    raise invalid("input must be a string or a list of strings")
