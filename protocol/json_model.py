"""The one rewrite the gateway makes to a request body: its ``model`` string (SPEC §12,
aliases). Pure: bytes in, bytes out; every byte but the value's own is kept.

:func:`model_span` walks the top level of the body's JSON object with the decoder's own C
scanner (:data:`protocol.json_text.scan_json`, the one :func:`json.loads` runs), member by
member: each key is decoded as json.loads decodes it, so an escaped key such as
``"mod\\u0065l"`` *is* ``model`` (as it is to json.loads and to the upstream's parser), while
a ``"model"`` nested deeper or inside another string is only part of a value the scanner
skips. With the key twice, json.loads keeps the last one, and so does this: its value is the
one the gateway routed by. The span is that of the value as written (quotes included,
escapes as they were), in bytes. A caller that has read the body already (the exchange) says
so (``checked``): then a body that writes ``"model"`` once, plainly, and escapes none of its
letters anywhere needs no walk: that one is the key (a search and one value scanned).

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

# The text between tokens, as json.decoder allows it (white space is " \t\n\r"), matched
# in one step each: the object's start up to its first key, a key's colon, and what follows
# a value: a comma and the next key's quote, or the closing brace and the end of the text.
_OPEN: Final = re.compile(r"[ \t\n\r]*\{[ \t\n\r]*")
_COLON: Final = re.compile(r"[ \t\n\r]*:[ \t\n\r]*")
_AFTER: Final = re.compile(r"[ \t\n\r]*(?:(,)[ \t\n\r]*(?=\")|\}[ \t\n\r]*\Z)")
_BOM: Final = b"\xef\xbb\xbf"  # json.loads reads UTF-8 bytes that start with one


def _value_span(text: str) -> tuple[int, int] | None:
    """Where, in ``text``, the string value of the last top-level ``model`` member is; None
    when ``text`` is not one JSON object or its ``model`` is missing or not a string."""
    opened = _OPEN.match(text)
    if opened is None:
        return None
    i = opened.end()
    if not text.startswith('"', i):
        return None  # no member (then no model), or not an object
    found: tuple[int, int] | None = None
    colon, after = _COLON.match, _AFTER.match
    while True:
        key, i = scan_json(text, i)
        between = colon(text, i)
        if between is None:
            return None
        start = between.end()
        value, i = scan_json(text, start)
        if key == "model":  # the last one wins, as in json.loads
            found = (start, i) if isinstance(value, str) else None
        following = after(text, i)
        if following is None:
            return None
        if following.group(1) is None:  # the closing brace, and nothing after it
            return found
        i = following.end()


_KEY: Final = '"model"'
_ESCAPED: Final = re.compile(r"\\u006[45cdfCDF]")  # d, e, l, m or o written as \u00XX


def _only_key(text: str) -> tuple[int, int] | None:
    """For a text json.loads reads as an object whose ``model`` is a string: that string's
    span when ``"model"`` is written once, plainly, and no letter of it is escaped anywhere
    (then that one is the key: a string that holds it, or a nested key, would be a second
    one), else None. A search and one value scanned, not the whole walk."""
    first = text.find(_KEY)
    if first < 0 or text.find(_KEY, first + 1) >= 0 or _ESCAPED.search(text) is not None:
        return None
    between = _COLON.match(text, first + len(_KEY))
    if between is None:
        return None
    start = between.end()
    value, end = scan_json(text, start)
    return (start, end) if isinstance(value, str) else None


def model_span(body: bytes, *, checked: bool = False) -> tuple[int, int] | None:
    """``(start, end)``: the bytes of the body's top-level ``model`` string value, quotes
    included, as json.loads reads the body; None when there is none (see the module
    docstring for what agrees with json.loads). ``checked``: the caller knows that
    json.loads reads the body as an object whose ``model`` is a string (the exchange's
    :func:`~protocol.request_info.parse_request_body` said so), which allows a short cut
    when ``"model"`` is written once (:func:`_only_key`); else every member is walked."""
    skip = 3 if body.startswith(_BOM) else 0
    try:
        text = body[skip:].decode("utf-8", "surrogatepass")  # json.loads' own decoding
        span = _only_key(text) if checked else None
        if span is None:
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


def replace_model(body: bytes, model: str, *, checked: bool = False) -> bytes | None:
    """``body`` with its top-level ``model`` string replaced by ``model`` (JSON-encoded,
    ASCII), every other byte as it was; None when the body has no such string.
    ``checked`` as for :func:`model_span`."""
    span = model_span(body, checked=checked)
    if span is None:
        return None
    start, end = span
    return b"".join((body[:start], encode_basestring_ascii(model).encode("ascii"), body[end:]))
