"""A stream's next piece of text, read by comparing its event with one already parsed.

Nearly every event of a model server's stream is one piece of text, and the events of one
stream differ in nothing but that text: llama.cpp's are

``{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":...}``

with the same bytes around ``"Hi"`` event after event (``created`` moves once a second).
Parsing each with :mod:`json` (a dict per level, a str for every key and value) costs more
than the rest of the event's translation, so :class:`StreamTranslator
<protocol.ollama.stream.StreamTranslator>` keeps a :class:`TextDelta` made from an event it
parsed (:meth:`TextDelta.learn`): the bytes before and after the JSON string of its delta's
``content`` (or ``reasoning_content``). An event that is those bytes around another JSON
string (:meth:`TextDelta.token`) is the same JSON with one string changed, so it means what
the parsed one meant, with that string's text. A plain string (no escapes, no control
characters, UTF-8: :func:`is_plain`) is its text, and JSON writes that text as the same
bytes, so its Ollama line is made from them as they came; a read of many such events is
checked and cut in a few passes in C (:meth:`TextDelta.many`).

:meth:`~TextDelta.learn` takes only an event whose meaning is its text alone (no error,
usage, timings, finish, tool calls; its first choice at index 0, a delta with that string,
the other one null, empty or absent) and whose bytes hold that string's key once, as
``{"content":"`` or ``,"content":"``, with no backslash outside the string. Keys are then
written as they are, so the one ``"content"`` in the bytes is the delta's key (inside a
string a ``"`` is always escaped: no text can hold it). Anything else is parsed as before.
"""

from __future__ import annotations

import json.decoder
from collections.abc import Callable
from typing import Any

__all__ = ["TextDelta", "is_plain", "string_text"]

_KEYS = ((b'"content"', "content", "reasoning_content"),
         (b'"reasoning_content"', "reasoning_content", "content"))
_CONTROLS = bytes(range(0x20))
_SPECIALS = b'"\\' + _CONTROLS  # what a plain JSON string has none of, but its quotes
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class TextDelta:
    """The bytes around the text of one parsed event (see the module)."""

    __slots__ = ("_joint", "_lead", "prefix", "size", "start", "suffix", "thinking")

    def __init__(self, prefix: bytes, suffix: bytes, thinking: bool) -> None:
        self.prefix = prefix  # up to the string's opening quote, included
        self.suffix = suffix  # from its closing quote on
        self.thinking = thinking  # the string is reasoning_content
        self.start = len(prefix)
        self.size = len(prefix) + len(suffix)
        # For many such events in a row, as SSE (see many): each is "data: " + prefix +
        # string + suffix + "\n\n", so between two strings is the joint.
        plain_around = len((prefix + suffix).translate(None, _CONTROLS)) == self.size
        self._lead = b"data: " + prefix if plain_around else None
        self._joint = suffix + b"\n\ndata: " + prefix

    def __repr__(self) -> str:
        return f"TextDelta({self.start} + {self.size - self.start} bytes, {self.thinking})"

    def token(self, data: bytes) -> bytes | None:
        """The JSON string in ``data``, quotes included, when ``data`` is the learned event
        with another string in it (see :func:`is_plain` and :func:`string_text`); None when it
        is not that event."""
        if (len(data) < self.size or not data.startswith(self.prefix)
                or not data.endswith(self.suffix)):
            return None
        return data[self.start - 1:len(data) - self.size + self.start + 1]

    def plain_token(self, data: bytes) -> bytes | None:
        """:meth:`token` when that string is plain (:func:`is_plain`), else None: the
        common case in one call, as it is every event's."""
        if (len(data) < self.size or not data.startswith(self.prefix)
                or not data.endswith(self.suffix)):
            return None
        token = data[self.start - 1:len(data) - self.size + self.start + 1]
        return token if is_plain(token) else None

    def many(self, piece: bytes) -> tuple[list[bytes], bytes] | None:
        """The strings (plain, their quotes left out) of the events ``piece`` begins with,
        when they are whole SSE events (a ``data: `` line and a blank one, LF), each the
        learned event with a plain string, and the rest of ``piece``; None when it does not
        begin with one. The events of one read are so checked in a few passes in C, not one
        by one: the blocks between blank lines up to the last that looks like such an event
        are cut to their strings, and the events made again from those strings must be the
        bytes of the piece. (``piece`` must begin a line of a new event.)"""
        lead = self._lead
        if lead is None or not piece.startswith(lead):
            return None
        suffix = self.suffix
        blocks = piece.split(b"\n\n")
        count = len(blocks) - 1  # the last block has no blank line after it (yet)
        while count and not (blocks[count - 1].endswith(suffix)
                             and blocks[count - 1].startswith(lead)):
            count -= 1  # the stream's last events (finish, usage, [DONE]) and the like
        if not count:
            return None
        start, cut = len(lead), -len(suffix)  # a suffix is never empty: its quote at least
        strings = [block[start:cut] for block in blocks[:count]]
        events = lead + self._joint.join(strings) + suffix
        if not piece.startswith(events) or piece[len(events):len(events) + 2] != b"\n\n":
            return None  # an event in between is another one
        texts = b'"'.join(strings)  # each a plain JSON string's body: no specials but these
        if len(texts.translate(None, _SPECIALS)) != len(texts) - (count - 1):
            return None
        if not texts.isascii():
            try:
                texts.decode()  # the quotes keep each string's UTF-8 its own
            except UnicodeDecodeError:
                return None
        return strings, piece[len(events) + 2:]

    @classmethod
    def learn(cls, data: bytes, doc: dict[str, Any]) -> TextDelta | None:
        """The template of ``data``, an event parsed to ``doc``, when it is one (see the
        module); None when it is not."""
        if "error" in doc or "usage" in doc or "timings" in doc:
            return None
        choices = doc.get("choices")
        if not isinstance(choices, list):
            return None
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                break
        else:
            return None
        reason = choice.get("finish_reason")
        delta = choice.get("delta")
        if (isinstance(reason, str) and reason) or not isinstance(delta, dict) \
                or delta.get("tool_calls") is not None:
            return None
        for key, name, other in _KEYS:
            value, beside = delta.get(name), delta.get(other)
            if isinstance(value, str) and not (isinstance(beside, str) and beside):
                return _spanned(data, key, value, thinking=name != "content")
        return None


def _spanned(data: bytes, key: bytes, value: str, *, thinking: bool) -> TextDelta | None:
    if data.count(key) != 1:
        return None
    at = data.find(key)
    start = at + len(key) + 2  # after :"
    if data[at - 1:at] not in (b"{", b",") or data[start - 2:start] != b':"':
        return None
    end = start  # the closing quote: the first one not escaped
    while True:
        end = data.find(b'"', end)
        if end < 0:
            return None
        slashes = end - len(data[:end].rstrip(b"\\"))
        if slashes % 2 == 0:
            break
        end += 1
    if data.count(b"\\") != data.count(b"\\", start, end) \
            or string_text(data[start - 1:end + 1]) != value:
        return None
    return TextDelta(data[:start], data[end:], thinking)


def is_plain(token: bytes) -> bool:
    """A JSON string (quotes included) with no escapes and no control characters, in UTF-8:
    its text is its bytes, and JSON writes that text as these same bytes (the encoder
    escapes nothing else)."""
    if len(token.translate(None, _SPECIALS)) != len(token) - 2:
        return False
    if token.isascii():
        return True
    try:
        token.decode()
    except UnicodeDecodeError:
        return False
    return True


def string_text(token: bytes) -> str | None:
    """The text of a JSON string (quotes included), or None when it is not one."""
    try:
        quoted = token.decode()
        text, end = _scanstring(quoted, 1)  # strict: no control characters
    except ValueError:  # a bad escape, not UTF-8
        return None
    return text if end == len(quoted) else None
