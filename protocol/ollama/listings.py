"""The Ollama API's listings, built from what the endpoint knows: ``/api/tags`` (every model
of the unified list, SPEC §7.5), ``/api/ps`` (the managed models that are loaded, with when
they unload), ``/api/show`` (one model) and ``/api/version``.

Honest and minimal: a value sluice does not know is ``""`` or ``0`` (``families``: ``[]``),
never a guess. A time it does not know is the Unix epoch, not ``""``: Ollama's clients
parse ``modified_at`` and ``expires_at`` as times (Go's ``time.Time``, ollama-python's
``datetime``) and would refuse an empty string. ``digest`` is ``""``: sluice has no
Ollama manifest to hash. ``/api/show`` has no Modelfile or template to show (the model
server applies the GGUF's own chat template); its ``capabilities`` are what the endpoint
says (``["completion"]`` unless it knows more).

The version :data:`OLLAMA_VERSION` is one that Ollama's clients accept: apps check a
minimum (structured outputs came in 0.5, tool streaming in 0.8, VS Code's Copilot asks for
at least 0.6.4), none a maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from protocol.ollama.errors import invalid
from protocol.ollama.wire import NotJson, json_bytes, load_json

__all__ = [
    "FOREVER_SECONDS",
    "OLLAMA_VERSION",
    "LoadedModel",
    "ModelFacts",
    "facts_from_entry",
    "format_time",
    "ps_body",
    "show_body",
    "show_model",
    "tags_body",
    "version_body",
]

OLLAMA_VERSION = "0.12.0"
FOREVER_SECONDS = (2**63 - 1) / 1e9  # Ollama's "forever": the longest Go duration, ~292 years
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z, the last time a datetime can write


def format_time(seconds: float) -> str:
    """A Unix time as Ollama writes times (RFC 3339 in UTC, to the microsecond, trailing
    zeros dropped): ``2024-07-22T20:33:28.123648Z``, ``2024-07-22T20:33:28Z``."""
    if not math.isfinite(seconds):
        seconds = _LAST_SECOND if seconds > 0 else 0
    whole, micros = math.floor(seconds), 0
    if whole < 0:
        whole = 0
    elif whole > _LAST_SECOND:
        whole = _LAST_SECOND
    else:
        micros = min(999999, round((seconds - whole) * 1e6))  # stays within its second
    text = _seconds_text(whole)
    if micros:
        text += "." + f"{micros:06d}".rstrip("0")
    return text + "Z"


_last_second: tuple[int, str] = (-1, "")  # the last whole second written, and its text


def _seconds_text(whole: int) -> str:
    """``whole`` (a Unix time in seconds) to the second, remembered for the next call: a
    stream's lines, a line per token, mostly fall in one second."""
    global _last_second
    if _last_second[0] != whole:
        _last_second = (whole, datetime.fromtimestamp(whole, tz=UTC).strftime(
            "%Y-%m-%dT%H:%M:%S"))
    return _last_second[1]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the endpoint knows of one model (from the unified list and, for a managed
    model, its file and GGUF header)."""

    name: str
    size: int = 0  # bytes of its file(s)
    modified_at: float | None = None  # Unix time (the file's mtime, the list's created)
    format: str = ""  # "gguf" for a managed model
    family: str = ""  # the GGUF's general.architecture
    parameter_size: str = ""  # e.g. "135M"
    quantization_level: str = ""  # e.g. "Q4_1"
    context_length: int = 0  # tokens of context one request can use (SPEC §17.2)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A loaded managed model for ``/api/ps``."""

    facts: ModelFacts
    memory: int  # bytes it takes now (measured, else the estimate)
    expires_at: float  # Unix time it unloads when still idle; math.inf: never


def facts_from_entry(entry: dict[str, Any], *, size: int = 0, format: str = "",
                     context_length: int = 0) -> ModelFacts:
    """Facts from one entry of the unified model list (``id``, ``created``)."""
    created = entry.get("created")
    when = float(created) if type(created) is int and created > 0 else None
    return ModelFacts(name=str(entry["id"]), size=size, modified_at=when, format=format,
                      context_length=context_length)


def _details(facts: ModelFacts) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": facts.format,
        "family": facts.family,
        "families": [facts.family] if facts.family else [],
        "parameter_size": facts.parameter_size,
        "quantization_level": facts.quantization_level,
    }


def _listed(facts: ModelFacts) -> dict[str, Any]:
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": format_time(facts.modified_at or 0),
        "size": max(0, facts.size),
        "digest": "",
        "details": _details(facts),
    }


def tags_body(models: Iterable[ModelFacts]) -> bytes:
    """``GET /api/tags``: ``{"models": [...]}`` in the order given."""
    return json_bytes({"models": [_listed(m) for m in models]})


def ps_body(loaded: Iterable[LoadedModel], now: float) -> bytes:
    """``GET /api/ps``: the loaded models; ``now`` (Unix time) dates a "never" unload
    as Ollama does, the longest Go duration from now."""
    models = []
    for model in loaded:
        expires = model.expires_at if math.isfinite(model.expires_at) else now + FOREVER_SECONDS
        models.append({
            "name": model.facts.name,
            "model": model.facts.name,
            "size": max(0, model.memory),
            "digest": "",
            "details": _details(model.facts),
            "expires_at": format_time(expires),
            "size_vram": 0,
            "context_length": model.facts.context_length,
        })
    return json_bytes({"models": models})


def show_model(body: bytes) -> str:
    """The model a ``POST /api/show`` body names (``model``, or the older ``name``)."""
    try:
        doc = load_json(body) if body.strip() else None
    except NotJson:
        raise invalid("the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    for key in ("model", "name"):
        value = doc.get(key)
        if isinstance(value, str) and value:
            return value
    raise invalid("model is required")


def show_body(facts: ModelFacts, capabilities: Sequence[str] = ("completion",)) -> bytes:
    """``POST /api/show`` for one model (see the module)."""
    info: dict[str, Any] = {}
    if facts.family:
        info["general.architecture"] = facts.family
        if facts.context_length:
            info[f"{facts.family}.context_length"] = facts.context_length
    return json_bytes({
        "modelfile": (f"# {facts.name} is served by sluice from a model file; "
                      f"there is no Modelfile.\nFROM {facts.name}\n"),
        "parameters": f"num_ctx {facts.context_length}" if facts.context_length else "",
        "template": "",
        "details": _details(facts),
        "model_info": info,
        "capabilities": list(capabilities),
        "modified_at": format_time(facts.modified_at or 0),
    })


def version_body() -> bytes:
    """``GET /api/version``."""
    return json_bytes({"version": OLLAMA_VERSION})
