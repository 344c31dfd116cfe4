"""Ollama's ``options`` and ``format`` as fields of an OpenAI request body.

Sampling options go to the OpenAI field of the same meaning (``num_predict`` is
``max_tokens``; a negative one, Ollama's "no limit", is left out) or, where OpenAI has none,
to the field llama.cpp's server accepts in its OpenAI endpoints under Ollama's own name
(``top_k``, ``min_p``, ``typical_p``, ``repeat_penalty``, ``repeat_last_n``, the mirostat
three; ``num_keep`` is llama.cpp's ``n_keep``). Load-time options (``num_ctx``,
``num_gpu``, ``num_thread``, ``num_batch``, ``use_mmap``, ...) are ignored: a managed model's
server is started with its configured context and threads. Unknown options are ignored too,
as Ollama ignores them.

``format``: ``"json"`` is ``response_format: {type: json_object}``, a JSON schema object
is ``{type: json_schema, json_schema: {name, schema}}``; absent, null or ``""`` is none.
"""

from __future__ import annotations

import math
from typing import Any

from protocol.ollama.errors import invalid

__all__ = ["SCHEMA_NAME", "openai_options", "response_format"]

SCHEMA_NAME = "ollama_format"  # the json_schema name OpenAI requires; Ollama has none

_FLOATS = {  # Ollama option -> OpenAI (or llama.cpp) field, a number
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
_INTS = {  # Ollama option -> field, a whole number
    "top_k": "top_k",
    "seed": "seed",
    "repeat_last_n": "repeat_last_n",
    "mirostat": "mirostat",
    "num_keep": "n_keep",
}


def openai_options(options: object) -> dict[str, Any]:
    """The OpenAI body fields for a request's ``options`` (absent or null: none)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise invalid("options must be an object")
    fields: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in _FLOATS:
            fields[_FLOATS[name]] = _number(name, value)
        elif name in _INTS:
            fields[_INTS[name]] = _whole(name, value)
        elif name == "num_predict":
            limit = _whole(name, value)
            if limit >= 0:
                fields["max_tokens"] = limit
        elif name == "stop":
            fields["stop"] = _stop(value)
    return fields


def response_format(value: object) -> dict[str, Any] | None:
    """The ``response_format`` for a request's ``format``; None for none."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": value}}
    raise invalid('format must be "json" or a JSON schema (an object)')


def _number(name: str, value: object) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"option {name!r} must be a number")
    if not math.isfinite(value):
        raise invalid(f"option {name!r} must be a finite number")
    return value


def _whole(name: str, value: object) -> int:
    if isinstance(value, float) and value.is_integer():  # JSON writers may send 40.0
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"option {name!r} must be a whole number")
    return value


def _stop(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise invalid("option 'stop' must be a list of strings")
