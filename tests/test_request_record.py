"""protocol.request_record's pure helpers: the ISO stamps of the request log and the feed,
and a record's JSON text; protocol.json_text's encoder."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.json_text import compact_json
from protocol.request_record import OUTCOMES, RequestRecord, cached_tokens, iso_utc


def _by_datetime(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_iso_utc_is_what_datetime_makes(epoch: float) -> None:
    assert iso_utc(epoch) == _by_datetime(epoch)


def test_iso_utc_across_a_second_and_back() -> None:
    """The cached second never leaks into another second's stamp."""
    assert iso_utc(1_764_590_400.999_9996) == "2025-12-01T12:00:01.000Z"  # rounds up
    assert iso_utc(1_764_590_400.5) == "2025-12-01T12:00:00.500Z"
    assert iso_utc(1_764_590_401.25) == "2025-12-01T12:00:01.250Z"
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1_764_590_400.0) == "2025-12-01T12:00:00.000Z"


_text = st.text(max_size=12)  # any code point: quotes, controls, lone surrogates, emoji
_seconds = st.floats(min_value=0, max_value=1e7, allow_nan=False)
_usage = st.none() | st.dictionaries(_text, st.integers(0, 10**9) | st.none(), max_size=4)


@given(id=_text, started_at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
       method=_text, path=_text, model=st.none() | _text, stream=st.booleans(),
       transport=st.sampled_from(["tcp", "unix"]), served_by=st.none() | _text,
       status=st.integers(100, 599), outcome=st.sampled_from(OUTCOMES),
       failover=st.none() | _text, ttfb=st.none() | _seconds, ttft=st.none() | _seconds,
       duration=_seconds,
       bytes_out=st.integers(0, 10**12), events=st.none() | st.integers(0, 10**6),
       usage=_usage, error=st.none() | _text, served_model=st.none() | _text,
       cached=st.none() | st.integers(0, 10**9),
       affinity=st.none() | st.sampled_from(["hit", "miss", "session", "spill"]))
def test_json_text_is_to_json_written_out(**fields: Any) -> None:
    """The feed's text of a record parses to exactly its log entry, keys in order."""
    record = RequestRecord(**fields)
    parsed = json.loads(record.json_text())
    entry = record.to_json()
    assert list(parsed) == list(entry)
    assert parsed == entry


def test_json_text_finds_the_usage_once() -> None:
    record = RequestRecord(
        id="r", started_at=1_764_590_400.25, method="POST", path="/v1/chat/completions",
        model="m", stream=True, transport="tcp", served_by="local:a", status=200,
        outcome="success", failover=None, ttfb=0.000412345, duration=0.0031, bytes_out=5,
        events=3, usage=None, error=None,
        usage_in=b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}')
    text = record.json_text()
    assert record.usage_in is None
    assert json.loads(text)["usage"] == {"prompt_tokens": 2, "completion_tokens": 3}
    assert '"ttfbMs":0.412,' in text
    assert '"durationMs":3.100,' in text
    assert '"startedAt":"2025-12-01T12:00:00.250Z"' in text


@pytest.mark.slow
@given(st.dictionaries(_text, st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8), max_size=4))
def test_compact_json_is_what_the_encoder_writes(value: dict[str, Any]) -> None:
    expected = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode(value)
    assert compact_json(value) == expected


# -- SPEC §15: the prompt tokens a server reused, in every dialect's usage -------------------

# What the real llama.cpp (xllamacpp) sent here, cut to the parts that matter.
LLAMA_CHAT = (b'{"choices":[],"usage":{"completion_tokens":4,"prompt_tokens":222,'
              b'"total_tokens":226,"prompt_tokens_details":{"cached_tokens":216}},'
              b'"timings":{"cache_n":216,"prompt_n":6}}')
LLAMA_FINISH_CHUNK = (b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
                      b'"object":"chat.completion.chunk","timings":{"cache_n":222,"prompt_n":1,'
                      b'"prompt_ms":13.7}}')
LLAMA_MESSAGES = (b'{"type":"message","usage":{"cache_read_input_tokens":222,"input_tokens":1,'
                  b'"output_tokens":2}}')
LLAMA_RESPONSES = (b'{"object":"response","usage":{"input_tokens":223,"output_tokens":1,'
                   b'"total_tokens":224,"input_tokens_details":{"cached_tokens":222}}}')


def test_cached_tokens_in_every_dialect() -> None:
    from protocol.request_record import usage_in_body

    assert cached_tokens(usage_in_body(LLAMA_CHAT), LLAMA_CHAT) == 216
    assert cached_tokens(usage_in_body(LLAMA_MESSAGES), LLAMA_MESSAGES) == 222
    assert cached_tokens(usage_in_body(LLAMA_RESPONSES), LLAMA_RESPONSES) == 222
    # a stream without include_usage: only llama.cpp's timings say it
    assert cached_tokens(None, LLAMA_FINISH_CHUNK) == 222
    # an OpenAI answer without details, an Ollama one, nothing at all: unknown
    assert cached_tokens({"prompt_tokens": 5, "completion_tokens": 1}, None) is None
    assert cached_tokens(None, b'{"prompt_eval_count":5}') is None
    assert cached_tokens(None, None) is None
    # zero is a figure, not "unknown"; nonsense is unknown
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": 0}}, None) == 0
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": "7"}}, None) is None
    assert cached_tokens({"cache_read_input_tokens": -1}, b'"timings":{"cache_n":-2}') is None
    assert cached_tokens(None, b'"timings": "x"') is None


def test_record_reads_cached_tokens_once() -> None:
    record = RequestRecord(
        id="r", started_at=1.0, method="POST", path="/v1/chat/completions", model="m",
        stream=True, transport="tcp", served_by="node:a", status=200, outcome="success",
        failover=None, ttfb=0.1, duration=0.2, bytes_out=5, events=3, usage=None, error=None,
        usage_in=None, timings_in=LLAMA_FINISH_CHUNK, affinity="hit")
    entry = record.to_json()
    assert (entry["cachedTokens"], entry["affinity"], entry["usage"]) == (222, "hit", None)
    assert record.timings_in is None
    assert json.loads(record.json_text())["cachedTokens"] == 222
