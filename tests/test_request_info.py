"""parse_request_body: the routing facts of a request body, or a 400 SluiceError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import SluiceError, Source
from protocol.request_info import (
    RequestInfo,
    TimeoutClass,
    _json_document,
    parse_request_body,
    timeout_class_for,
)
from tests.client import CHAT

_SETTINGS = settings(max_examples=200, derandomize=True, deadline=None)


def parse(body: bytes, path: str = CHAT) -> RequestInfo:
    return parse_request_body(path, body)


def outcome(body: bytes, path: str = CHAT) -> RequestInfo | SluiceError:
    """The RequestInfo, or the SluiceError raised; any other exception propagates."""
    try:
        return parse_request_body(path, body)
    except SluiceError as error:
        return error


def refused(body: bytes, path: str = CHAT) -> SluiceError:
    with pytest.raises(SluiceError) as info:
        parse_request_body(path, body)
    error = info.value
    assert error.status == 400
    assert error.source is Source.CLIENT
    assert error.type == "invalid_request_error"
    assert set(json.loads(error.body())["error"]) == {"message", "type", "code", "param"}
    return error


# --- valid bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "model", "stream"),
    [
        (b'{"model":"smollm2","messages":[]}', "smollm2", False),
        (b'{"model": "smollm2", "stream": true}', "smollm2", True),
        (b'{"model": "smollm2", "stream": false}', "smollm2", False),
        (b'{"model": "smollm2", "stream": null}', "smollm2", False),
        (b'  \n{"stream": true, "model": "a/b:c"}\r\n ', "a/b:c", True),
        (b'{"model": "x", "model": "y"}', "y", False),  # JSON: the last duplicate wins
        (b'{"model": "m", "stream_options": {"include_usage": true}}', "m", False),
        (b'{"model": "m", "temperature": NaN}', "m", False),
        (b'{"model": " "}', " ", False),
        ('{"model": "modèle-日本語-😀"}'.encode(), "modèle-日本語-😀", False),
        (b'{"model": "\\u00e9\\ud83d\\ude00"}', "é😀", False),
        ('\ufeff{"model": "bom"}'.encode(), "bom", False),
        ('{"model": "utf16"}'.encode("utf-16"), "utf16", False),
    ],
)
def test_valid_bodies(body: bytes, model: str, stream: bool) -> None:
    info = parse(body)
    assert isinstance(info, RequestInfo)
    assert info.model == model
    assert info.stream is stream
    assert info.timeout_class is TimeoutClass.STANDARD


def test_huge_body() -> None:
    messages = [{"role": "user", "content": "x" * 1000 + "é"} for _ in range(2000)]
    body = json.dumps({"messages": messages, "model": "big", "stream": True}).encode()
    assert len(body) > 2_000_000
    info = parse(body)
    assert (info.model, info.stream) == ("big", True)


def test_huge_model_name() -> None:
    model = "m" * 1_000_000
    assert parse(json.dumps({"model": model}).encode()).model == model


def test_repr() -> None:
    info = parse(b'{"model": "m", "stream": true}', "/v1/images/generations")
    assert repr(info) == "RequestInfo(model='m', stream=True, timeout_class=image_generation)"


# --- timeout classes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "cls"),
    [
        ("/v1/images/generations", TimeoutClass.IMAGE_GENERATION),
        ("/v1/chat/completions", TimeoutClass.STANDARD),
        ("/v1/completions", TimeoutClass.STANDARD),
        ("/v1/embeddings", TimeoutClass.STANDARD),
        ("/v1/responses", TimeoutClass.STANDARD),
        ("/v1/images", TimeoutClass.STANDARD),
    ],
)
def test_timeout_class(path: str, cls: TimeoutClass) -> None:
    assert timeout_class_for(path) is cls
    assert parse(b'{"model": "m"}', path).timeout_class is cls


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b'{"stream": true}', b'{"model": null}', b'{"messages": [], "Model": "m"}'],
)
def test_missing_model(body: bytes) -> None:
    error = refused(body)
    assert error.code == "missing_model"
    assert error.param == "model"


@pytest.mark.parametrize(
    "body",
    [b"{", b"not json", b"{'model': 'm'}", b'{"model": "m",}', b"\xff\xfe\x00",
     b'{"model": "\xff"}', b"\x00" * 8, b"\x80abc", b'{"model": "m"} trailing',
     b'{"model": "m"}{"model": "n"}', b"   ", b"\n",
     b'{"model": "m", "n": ' + b"1" * 5000 + b"}"],  # over Python's int-digits limit
)
def test_invalid_json(body: bytes) -> None:
    assert refused(body).code == "invalid_json"


@pytest.mark.parametrize("body", [b"[]", b'["model"]', b"null", b"1", b'"model"', b"true",
                                  b'[{"model": "m"}]'])
def test_not_an_object(body: bytes) -> None:
    assert refused(body).code == "invalid_json"


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_json_is_a_400(depth: int) -> None:
    # Any client-supplied body must end in RequestInfo or a 400; never RecursionError (500).
    assert refused(b"[" * depth + b"]" * depth).code == "invalid_json"
    nested = b'{"model": "m", "x": ' + b"[" * depth + b"]" * depth + b"}"
    result = outcome(nested)
    if isinstance(result, SluiceError):
        assert result.status == 400
    else:
        assert result.model == "m"


@pytest.mark.parametrize("model", [b'""', b"1", b"0", b"true", b"false", b"[]", b'["m"]',
                                   b"{}", b'{"id": "m"}', b"1.5"])
def test_invalid_model(model: bytes) -> None:
    error = refused(b'{"model": ' + model + b"}")
    assert error.code == "invalid_model"
    assert error.param == "model"


@pytest.mark.parametrize("stream", [b"1", b"0", b'"true"', b'"false"', b"[]", b"{}", b'""',
                                    b"1.0"])
def test_invalid_stream(stream: bytes) -> None:
    error = refused(b'{"model": "m", "stream": ' + stream + b"}")
    assert error.code == "invalid_stream"
    assert error.param == "stream"


def test_model_checked_before_stream() -> None:
    assert refused(b'{"model": 1, "stream": 1}').code == "invalid_model"
    assert refused(b'{"stream": 1}').code == "missing_model"


# --- properties --------------------------------------------------------------------------------


def check_any(body: bytes) -> None:
    result = outcome(body)
    if isinstance(result, SluiceError):
        assert result.status == 400
        assert result.code in {"missing_model", "invalid_json", "invalid_model",
                               "invalid_stream"}
    else:
        assert isinstance(result, RequestInfo)
        assert isinstance(result.model, str)
        assert result.model
        assert isinstance(result.stream, bool)


@_SETTINGS
@given(body=st.binary(max_size=200))
def test_garbage_bytes_give_request_info_or_400(body: bytes) -> None:
    check_any(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=6,
)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["model", "stream", "messages", "x"]), json_values,
                           max_size=4))
def test_json_objects_give_request_info_or_400(doc: dict[str, object]) -> None:
    body = json.dumps(doc).encode()
    check_any(body)
    model, stream = doc.get("model"), doc.get("stream")
    if isinstance(model, str) and model and (stream is None or isinstance(stream, bool)):
        info = parse(body)
        assert info.model == model
        assert info.stream is bool(stream)


@_SETTINGS
@given(model=st.text(min_size=1), stream=st.booleans(), ascii_only=st.booleans())
def test_any_model_string_round_trips(model: str, stream: bool, ascii_only: bool) -> None:
    body = json.dumps({"model": model, "stream": stream}, ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass")
    info = parse(body)
    assert (info.model, info.stream) == (model, stream)


_JSONISH = st.sampled_from([b"{", b"}", b"[", b"]", b'"', b":", b",", b" ", b"\n", b"1", b"-",
                            b"e", b".", b"true", b"null", b'"model"', b"\\", b"\xc3\xa9",
                            b"\xed\xa0\x80", b"\xff", b"\x00", b"\xef\xbb\xbf", b"NaN"])


@pytest.mark.slow
@given(st.lists(_JSONISH, max_size=12).map(b"".join))
@settings(max_examples=500, derandomize=True)
def test_the_body_is_read_as_json_loads_reads_it(body: bytes) -> None:
    """The scanner's shortcut gives json.loads' value, or json.loads' own exception."""
    try:
        expected: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            _json_document(body)
    else:
        assert json.dumps(_json_document(body)) == json.dumps(expected)  # NaN too
