"""JSON in and out for the Ollama translation: strict parsing of a client's or a model
server's JSON, and compact bytes out (one NDJSON line is one value and ``\\n``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from protocol.json_text import compact_json

__all__ = ["NotJson", "json_bytes", "load_json", "ndjson_line"]


class NotJson(ValueError):
    """The bytes are not one JSON value (or not UTF-8, or nested too deep)."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python reads them, JSON has none


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_BOM = b"\xef\xbb\xbf"
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's white space, as the decoder skips it
_scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def load_json(data: bytes | str) -> Any:
    """The JSON value in ``data``, as strict as Go's encoding/json (no NaN or Infinity);
    raises :class:`NotJson`. Bytes are UTF-8, a byte order mark at the start dropped. (This
    reads each event of a stream: the ``utf-8-sig`` codec, a Python-level decoder, cost as
    much as the parse, so the mark is looked for first, and an object that is all the
    bytes, as a model server's event is, goes to the decoder's C scanner directly.)"""
    if type(data) is bytes and data[:1] == b"{":
        try:
            text = data.decode()
            value, end = _scan(text, 0)
        except (ValueError, RecursionError):
            pass  # the way below says why
        else:
            if end == len(text):
                return value
    try:
        if isinstance(data, bytes):
            text = data[3:].decode() if data[:3] == _BOM else data.decode()
        else:
            text = data
        value, end = _DECODER.raw_decode(text, _skip_space(text, 0))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise NotJson(str(err)) from None
    if end != len(text) and _skip_space(text, end) != len(text):
        raise NotJson("extra data after the JSON value")
    return value


def _skip_space(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return match.end() if match is not None else at  # (it always matches, maybe nothing)


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
