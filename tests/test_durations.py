import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.durations import format_duration, format_size, parse_duration, parse_size
from protocol.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("0.1m", 6.0),
        ("1.5h", 5400.0),
        (" 30 s ", 30.0),
        ("30S", 30.0),
        ("12", 12.0),
        ("2.5", 2.5),
        ("1e3ms", 1.0),
        ("-5s", -5.0),
        ("0", 0.0),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text, "x.y") == seconds


@pytest.mark.parametrize(
    "value",
    [True, False, None, "", "s", "5 d", "5mins", "30sec", "1h30m", "inf", "nan", "--5s",
     float("inf"), float("nan"), [], {}, "1e999999999s", 10**400],
)
def test_parse_duration_refuses(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "timeouts.connection")
    assert info.value.path == "timeouts.connection"
    assert str(info.value).startswith("timeouts.connection: ")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.5, "500ms"),
        (0.001, "1ms"),
        (30.0, "30s"),
        (90.0, "90s"),
        (300.0, "5m"),
        (3600.0, "1h"),
        (7200.0, "2h"),
        (5400.0, "90m"),
        (1.5, "1.5s"),
        (0.0, "0s"),
        (-5.0, "-5s"),
        (61, "61s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_refuses_non_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        format_duration(math.inf)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_duration_round_trip_any_float(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "p") == seconds


@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_duration_round_trip_whole_milliseconds(millis: int) -> None:
    text = f"{millis}ms"
    seconds = parse_duration(text, "p")
    assert parse_duration(format_duration(seconds), "p") == seconds
    assert format_duration(seconds) == format_duration(parse_duration(format_duration(seconds),
                                                                      "p"))


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("10B", 10),
        ("512KiB", 512 * 1024),
        ("512 kib", 512 * 1024),
        ("32MiB", 32 * 1024 * 1024),
        ("1GiB", 1 << 30),
        ("1.5KiB", 1536),
        (2048.0, 2048),
    ],
)
def test_parse_size(value: object, size: int) -> None:
    assert parse_size(value, "api.max_body_size") == size


@pytest.mark.parametrize(
    "value", [True, None, "", "5MB", "5KB", "0.3KiB", "1.5", "x", 1.5, [], "1e99999GiB"]
)
def test_parse_size_refuses(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, "api.max_body_size")
    assert info.value.path == "api.max_body_size"


@pytest.mark.parametrize(
    ("size", "text"),
    [(32 << 20, "32MiB"), (1 << 30, "1GiB"), (1536, "1536B"), (2048, "2KiB"), (0, "0B"),
     (1000, "1000B")],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_size_round_trip(size: int) -> None:
    assert parse_size(format_size(size), "p") == size
