"""The one rewrite the gateway makes to a request body: its ``model`` string (SPEC §12,
aliases). Pure: bytes in, bytes out; every byte but the value's own is kept.

:func:`model_span` walks the top level of the body's JSON object with the decoder's own C
scanner (:data:`protocol.json_text.scan_json`, the one :func:`json.loads` runs), member by
member: each key is decoded as json.loads decodes it, so an escaped key such as
``"mod\\u0065l"`` *is* ``model`` (as it is to json.loads and to the upstream's parser), while
a ``"model"`` nested deeper or inside another string is only part of a value the scanner
skips. With the key twice, json.loads keeps the last one, and so does this: its value is the
one the gateway routed by. The span is that of the value as written (quotes included,
escapes as they were), in bytes.

Agreement with json.loads is the contract: a span is found exactly when ``json.loads(body)``
is an object whose ``model`` is a string (for UTF-8 bodies, with or without a BOM; JSON
between systems is UTF-8, RFC 8259 §8.1, and another encoding gives None), and
``json.loads(body[start:end])`` is that string. tests/test_json_model.py checks it with
hypothesis on generated bodies (white space, escapes, unicode, nesting, ``"model"`` in other
strings and keys, duplicates) and on broken ones.
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring_ascii
from typing import Final

from protocol.json_text import scan_json

__all__ = ["model_span", "replace_model"]

_SPACE: Final = re.compile(r"[ \t\n\r]*")  # what JSON allows between tokens (json.decoder's)
_BOM: Final = b"\xef\xbb\xbf"  # json.loads reads UTF-8 bytes that start with one


def _space(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON white space."""
    found = _SPACE.match(text, i)
    return i if found is None else found.end()  # (it always matches, maybe empty)


def _value_span(text: str) -> tuple[int, int] | None:
    """Where, in ``text``, the string value of the last top-level ``model`` member is; None
    when ``text`` is not one JSON object or its ``model`` is missing or not a string."""
    space = _space
    i = space(text, 0)
    if text[i:i + 1] != "{":
        return None
    i = space(text, i + 1)
    found: tuple[int, int] | None = None
    if text[i:i + 1] != "}":
        while True:
            if text[i:i + 1] != '"':
                return None
            key, i = scan_json(text, i)
            i = space(text, i)
            if text[i:i + 1] != ":":
                return None
            start = space(text, i + 1)
            value, i = scan_json(text, start)
            if key == "model":  # the last one wins, as in json.loads
                found = (start, i) if isinstance(value, str) else None
            i = space(text, i)
            mark = text[i:i + 1]
            if mark == "}":
                break
            if mark != ",":
                return None
            i = space(text, i + 1)
    if space(text, i + 1) != len(text):
        return None  # something after the object
    return found


def model_span(body: bytes) -> tuple[int, int] | None:
    """``(start, end)``: the bytes of the body's top-level ``model`` string value, quotes
    included, as json.loads reads the body; None when there is none (see the module
    docstring for what agrees with json.loads)."""
    skip = 3 if body.startswith(_BOM) else 0
    try:
        text = body[skip:].decode("utf-8", "surrogatepass")  # json.loads' own decoding
        span = _value_span(text)
    except (ValueError, StopIteration, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if span is None:
        return None
    start, end = span
    if len(text) != len(body) - skip:  # not all ASCII: characters to bytes
        value = len(text[start:end].encode("utf-8", "surrogatepass"))
        start = len(text[:start].encode("utf-8", "surrogatepass"))
        end = start + value
    return start + skip, end + skip


def replace_model(body: bytes, model: str) -> bytes | None:
    """``body`` with its top-level ``model`` string replaced by ``model`` (JSON-encoded,
    ASCII), every other byte as it was; None when the body has no such string."""
    span = model_span(body)
    if span is None:
        return None
    start, end = span
    return b"".join((body[:start], encode_basestring_ascii(model).encode("ascii"), body[end:]))
