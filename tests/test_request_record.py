"""protocol.request_record's pure helpers: the ISO stamps of the request log and the feed."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from protocol.request_record import iso_utc


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
