"""JSON in and out for the Ollama translation: strict parsing of a client's or a model
server's JSON, and compact bytes out (one NDJSON line is one value and ``\\n``)."""

from __future__ import annotations

import json
from typing import Any

from protocol.json_text import compact_json

__all__ = ["NotJson", "json_bytes", "load_json", "ndjson_line"]


class NotJson(ValueError):
    """The bytes are not one JSON value (or not UTF-8, or nested too deep)."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python reads them, JSON has none


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def load_json(data: bytes | str) -> Any:
    """The JSON value in ``data``, as strict as Go's encoding/json (no NaN or Infinity);
    raises :class:`NotJson`."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
        value, end = _DECODER.raw_decode(text, _skip_space(text, 0))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise NotJson(str(err)) from None
    if _skip_space(text, end) != len(text):
        raise NotJson("extra data after the JSON value")
    return value


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON for ``value``; a lone surrogate (which JSON escapes can carry in)
    is written escaped, so the bytes are always valid UTF-8."""
    try:
        return compact_json(value).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def ndjson_line(value: Any) -> bytes:
    """One NDJSON line: ``value`` as compact JSON and a newline."""
    return json_bytes(value) + b"\n"
