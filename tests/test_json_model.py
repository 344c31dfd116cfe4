"""The ``model`` splice of aliased requests (protocol/json_model.py) against json.loads:
bodies written with random white space, escapes (keys like ``"mod\\u0065l"`` too), unicode
(lone surrogates included), nesting, ``"model"`` inside other strings and deeper keys, and
duplicate keys; then broken ones (cut, with a byte changed, with garbage after) and any
bytes. A span is found exactly when json.loads reads an object whose ``model`` is a string;
the rewritten body parses as the same object with the new model, and every byte outside the
span is the body's own."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.json_model import model_span, replace_model

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None)
# The Writer's choices come from a random.Random seeded by Hypothesis (use_true_random=True):
# as reproducible under derandomize, and 40 % less CPU than a Hypothesis draw per choice
# (tens of thousands of them a test); the members themselves still shrink.

TRICKY = ["model", "Model", "models", "mod", "", '"model"', '"model":"x"', '{"model": "y"}',
          "\\", '\\"', "mo\"del", "\u00e9\u00fc", "\U0001f600", "\ud800", "\udfff", "/",
          "\x00\x1f", "\u2028"]
KEYS = st.one_of(st.sampled_from(["model", "model", "messages", "stream", "Model", "modèl",
                                  '"model"', "model ", "mo\\del"]), st.text(max_size=8))
STRINGS = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12),
                    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010),
                            max_size=3))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False), STRINGS)


def _members(children: Any) -> Any:
    return st.lists(st.tuples(KEYS, children), max_size=5)


VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               _members(children).map(lambda m: ("object", m))),
    max_leaves=12)
TOP = _members(VALUES)  # a top-level object's members: (key, value), duplicates allowed


class Writer:
    """JSON text with random choices: white space between tokens, each character of a
    string literal or escaped (short escapes, \\uXXXX, surrogate pairs)."""

    SPACES = ["", "", " ", "\n", "\t", "\r\n", "  \n "]
    SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
             "\t": "\\t", "/": "\\/"}

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd

    def space(self) -> str:
        return self.rnd.choice(self.SPACES)

    def char(self, c: str) -> str:
        code = ord(c)
        must = c in '"\\' or code < 0x20
        choice = self.rnd.random()
        if not must and choice < 0.7:
            return c
        if c in self.SHORT and choice < 0.85:
            return self.SHORT[c]
        if code > 0xFFFF:
            high, low = divmod(code - 0x10000, 0x400)
            return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04X}"
        return f"\\u{code:04x}" if self.rnd.random() < 0.5 else f"\\u{code:04X}"

    def string(self, s: str) -> str:
        return '"' + "".join(self.char(c) for c in s) + '"'

    def value(self, v: Any) -> str:
        sp = self.space
        if isinstance(v, tuple):
            return self.members(v[1])
        if isinstance(v, list):
            return "[" + sp() + ("," + sp()).join(self.value(x) + sp() for x in v) + "]"
        if isinstance(v, str):
            return self.string(v)
        return json.dumps(v)

    def members(self, members: list[tuple[str, Any]]) -> str:
        sp = self.space
        parts = [sp() + self.string(k) + sp() + ":" + sp() + self.value(v) + sp()
                 for k, v in members]
        return "{" + sp() + ",".join(parts) + "}"

    def body(self, members: list[tuple[str, Any]]) -> bytes:
        text = self.space() + self.members(members) + self.space()
        raw = text.encode("utf-8", "surrogatepass")
        return b"\xef\xbb\xbf" + raw if self.rnd.random() < 0.05 else raw


def loads(body: bytes) -> Any:
    """json.loads, or the exception's type when it refuses the body."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        return type(exc)


def model_of(body: bytes) -> str | None:
    """The model json.loads reads (a string), or None."""
    doc = loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("model"), str):
        return str(doc["model"])
    return None


def utf8(body: bytes) -> bool:
    return json.detect_encoding(body) in ("utf-8", "utf-8-sig")


def check_agrees(body: bytes) -> None:
    model = model_of(body) if utf8(body) else None
    span = model_span(body)
    if model is None:
        assert span is None, (body, span)
        assert replace_model(body, "x") is None
        return
    assert span is not None, body
    start, end = span
    assert json.loads(body[start:end]) == model
    assert model_span(body, checked=True) == span  # the short cut finds the same


@pytest.mark.slow
@PROPERTY
@given(TOP, st.one_of(st.none(), SCALARS), st.randoms(use_true_random=True))
def test_span_agrees_with_json_loads(members: list[tuple[str, Any]], model: Any,
                                     rnd: random.Random) -> None:
    if model is not None:  # a top-level "model" member somewhere (maybe not the last one)
        members = [*members]
        members.insert(rnd.randint(0, len(members)), ("model", model))
    check_agrees(Writer(rnd).body(members))


@pytest.mark.slow
@PROPERTY
@given(TOP, STRINGS, st.text(max_size=10), st.randoms(use_true_random=True))
def test_replace_changes_only_the_model(members: list[tuple[str, Any]], asked: str,
                                        target: str, rnd: random.Random) -> None:
    members = [*members, ("model", asked)] if rnd.random() < 0.5 else [("model", asked),
                                                                       *members]
    body = Writer(rnd).body(members)
    doc = json.loads(body)
    assume_string = isinstance(doc.get("model"), str)
    out = replace_model(body, target)
    if not assume_string:  # a later duplicate "model" that is not a string wins
        assert out is None
        return
    assert out is not None
    span = model_span(body)
    assert span is not None
    start, end = span
    assert out == body[:start] + json.dumps(target).encode() + body[end:]
    assert replace_model(body, target, checked=True) == out
    assert json.loads(out) == {**doc, "model": target}
    assert list(json.loads(out)) == list(doc)  # the members' order too


@pytest.mark.slow
@PROPERTY
@given(TOP, st.randoms(use_true_random=True), st.integers(0, 10**6),
       st.sampled_from(["cut", "byte", "garbage", "wrap"]), st.binary(max_size=3))
def test_broken_bodies_agree(members: list[tuple[str, Any]], rnd: random.Random, where: int,
                             how: str, extra: bytes) -> None:
    body = Writer(rnd).body([*members, ("model", "m")])
    at = where % (len(body) + 1)
    if how == "cut":
        body = body[:at]
    elif how == "byte":
        body = body[:at] + extra + body[at + 1:]
    elif how == "garbage":
        body = body + extra
    else:
        body = b"[" + body + b"]"
    check_agrees(body)


@PROPERTY
@given(st.binary(max_size=40))
def test_any_bytes(body: bytes) -> None:
    check_agrees(body)
    check_agrees(b'{"model":"a",' + body)


@pytest.mark.parametrize(("body", "span_text"), [
    (b'{"model":"gpt-4o","messages":[]}', b'"gpt-4o"'),
    (b'{ "mod\\u0065l" : "a\\"b" }', b'"a\\"b"'),  # an escaped key is the key json.loads sees
    (b'{"m":{"model":"inner"},"x":"\\"model\\":\\"no\\"","model":"top"}', b'"top"'),
    (b'{"model":"first","model":"last"}', b'"last"'),  # the last one, as in json.loads
    ('{"é":"ü","model":"ñ\U0001f600"}'.encode(), '"ñ\U0001f600"'.encode()),
    (b'\xef\xbb\xbf{"model":"bom"}', b'"bom"'),
    (b'\n\t{"model"\r\n:\n"ws"}\n ', b'"ws"'),
])
def test_examples(body: bytes, span_text: bytes) -> None:
    span = model_span(body)
    assert span is not None
    assert body[span[0]:span[1]] == span_text


@pytest.mark.parametrize("body", [
    b"", b"[]", b'"model"', b"{}", b'{"model":null}', b'{"model":1}', b'{"model":"a",}',
    b'{"model":"a"} {}', b'{"model":"a","model":2}', b'{"models":"a"}', b'{"Model":"a"}',
    '{"model":"a"}'.encode("utf-16"), b'{"model":"\xff"}', b'{"model":"a\nb"}',
])
def test_no_model_string(body: bytes) -> None:
    assert model_span(body) is None
    assert replace_model(body, "x") is None


@pytest.mark.parametrize("body", [
    b'{"model":"a","x":{"model":"b"}}',  # a nested key: walked
    b'{"x":"say \\"model","model":"a"}',  # "model" at the end of a string: walked
    b'{"mod\\u0065l":"a","x":"model"}',  # an escaped key: walked
    b'{"model":"a","mod\\u0065l":"b"}',  # the same key twice: walked, the last one
    b'{"x":"\\u006d","model":"a"}',  # an escaped letter anywhere: walked
    b'{"messages":[{"role":"user"}],"model":"a"}',  # once, plainly: the short cut
])
def test_the_short_cut_agrees(body: bytes) -> None:
    assert model_span(body, checked=True) == model_span(body)
    assert json.loads(body[slice(*model_span(body))]) == json.loads(body)["model"]


def test_replace_keeps_every_other_byte() -> None:
    body = b'{"model" : "claude-3-5-sonnet", "stream":true,\n "messages":[{"model":"x"}]}'
    out = replace_model(body, "qwen2.5-coder:7b")
    assert out == body.replace(b'"claude-3-5-sonnet"', b'"qwen2.5-coder:7b"')
    assert replace_model(body, 'a"\u00e9') == body.replace(b'"claude-3-5-sonnet"',
                                                           b'"a\\"\\u00e9"')
