"""An access key's limits, the pure rules (SPEC §13, protocol/key_limits.py): parsing and
validation of models, rpm and expiresAt; patterns; the token bucket's arithmetic; expiry;
the limits as secrets.yaml keeps them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from protocol.access import key_expired, model_not_allowed, rate_limited
from protocol.errors import ConfigError, Family
from protocol.key_limits import (
    MAX_RPM,
    UNLIMITED,
    TokenBucket,
    expiry_from_cli,
    limits_of,
    parse_expiry,
    parse_models,
    parse_rpm,
    retry_after,
    stored_limits,
)
from protocol.secrets import Secrets

# ------------------------------------------------------------------------- parsing


def refused(call: object, *args: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.status == 422
    return caught.value


def test_models_parse() -> None:
    assert parse_models(None) is None
    assert parse_models(["a", "qwen*", "a", "meta-llama/Llama-3.1-8B"]) == (
        "a", "qwen*", "meta-llama/Llama-3.1-8B")  # duplicates dropped, order kept
    assert parse_models(["*"]) == ("*",)
    for value, param in (("a", "models"), ({"a": 1}, "models"), ([], "models"),
                         ([""], "models[0]"), (["ok", 5], "models[1]"),
                         (["a b"], "models[0]"), (["x\ny"], "models[0]"),
                         (["m" * 300], "models[0]"), (["a"] * 257, "models")):
        assert refused(parse_models, value).param == param, value


@pytest.mark.parametrize("good", [1, 2, 60, MAX_RPM])
def test_rpm_accepts(good: int) -> None:
    assert parse_rpm(good) == good


@pytest.mark.parametrize("bad", [0, -1, MAX_RPM + 1, 10**30, 1.5, 2.0, "10", True, [], {}])
def test_rpm_refuses(bad: object) -> None:
    error = refused(parse_rpm, bad)
    assert error.param == "rpm"
    assert parse_rpm(None) is None


@pytest.mark.parametrize(("given", "stored"), [
    ("2030-06-30T23:59:59Z", "2030-06-30T23:59:59Z"),
    ("2030-06-30T18:00:00+02:00", "2030-06-30T16:00:00Z"),
    ("2030-06-30T18:00:00-05:30", "2030-06-30T23:30:00Z"),
    ("2030-06-30T23:59:59.750Z", "2030-06-30T23:59:59Z"),  # to the second
    ("2030-06-30", "2030-06-30T23:59:59Z"),  # a date alone: the end of that day, UTC
    ("2030-12-31T23:30:00-01:00", "2031-01-01T00:30:00Z"),
    ("2000-01-01T00:00:00Z", "2000-01-01T00:00:00Z"),  # the past is fine (expire it now)
])
def test_expiry_parse(given: str, stored: str) -> None:
    assert parse_expiry(given) == stored


@pytest.mark.parametrize("bad", ["", "tomorrow", "2030-13-01", "2030-02-30",
                                 "2030-06-30T25:00:00Z", "2030-06-30T12:00:00",  # no zone
                                 "30/06/2030", "0001-01-01T00:00:00+05:00", 5, 1.5, [], True,
                                 "2030-06-30T12:00:00Z" + " " * 60])
def test_expiry_refuses(bad: object) -> None:
    assert refused(parse_expiry, bad).param == "expiresAt"


def test_naive_time_says_why() -> None:
    assert "time zone" in refused(parse_expiry, "2030-06-30T12:00:00").message


def test_cli_expiry() -> None:
    now = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    assert expiry_from_cli("30d", now) == "2030-01-31T12:00:00Z"
    assert expiry_from_cli("12h", now) == "2030-01-02T00:00:00Z"
    assert expiry_from_cli("90m", now) == "2030-01-01T13:30:00Z"
    assert expiry_from_cli("2w", now) == "2030-01-15T12:00:00Z"
    assert expiry_from_cli("2030-03-01", now) == "2030-03-01T23:59:59Z"
    assert expiry_from_cli("2030-03-01T10:00:00+01:00", now) == "2030-03-01T09:00:00Z"
    for bad in ("30", "30y", "-1d", "soon", "1.5d"):
        assert refused(expiry_from_cli, bad, now).param == "expires", bad


# ------------------------------------------------------------------------- patterns


@pytest.mark.parametrize(("models", "allowed", "refused_ids"), [
    (("smollm2-135m",), ["smollm2-135m"], ["smollm2", "smollm2-135m-x", "SMOLLM2-135M"]),
    (("qwen*",), ["qwen", "qwen2.5-coder:7b"], ["a-qwen", "Qwen2"]),
    (("*-7b", "llama3"), ["qwen-7b", "-7b", "llama3"], ["qwen-7b-q4", "llama3.1"]),
    (("a*b*c",), ["abc", "a-b-c", "aXXbYYc"], ["ab", "acb", "abcd"]),
    (("*",), ["anything", "x"], []),
    (("gpt-4o", "*"), ["gpt-4o", "other"], []),
    (("a.b",), ["a.b"], ["axb"]),  # regex characters are themselves
    (("a+(b)?",), ["a+(b)?"], ["aab", "a"]),
])
def test_patterns(models: tuple[str, ...], allowed: list[str], refused_ids: list[str]) -> None:
    limits = limits_of(models, None, None)
    for model in allowed:
        assert limits.allows(model), (models, model)
    for model in refused_ids:
        assert not limits.allows(model), (models, model)


@given(st.text(alphabet="abc-.:/", min_size=1, max_size=12),
       st.text(alphabet="abc-.:/", max_size=6))
def test_a_star_suffix_matches_every_extension(prefix: str, rest: str) -> None:
    assert limits_of((prefix + "*",), None, None).allows(prefix + rest)
    assert limits_of((prefix,), None, None).allows(prefix + rest) is (rest == "")


def test_unlimited() -> None:
    assert limits_of(None, None, None) is UNLIMITED
    assert not UNLIMITED.limited
    assert UNLIMITED.allows("whatever")
    assert not UNLIMITED.expired(1e12)
    assert limits_of(("a",), None, None).limited
    assert limits_of(None, 5, None).limited
    assert not limits_of(None, None, "2030-01-01T00:00:00Z").limited  # expiry: in authorize
    # The same stored values give the same (cached) object: patterns compiled once.
    assert limits_of(("q*",), 3, None) is limits_of(("q*",), 3, None)


def test_expiry_is_after_the_moment() -> None:
    limits = limits_of(None, None, "2030-06-30T12:00:00Z")
    at = datetime(2030, 6, 30, 12, 0, 0, tzinfo=UTC).timestamp()
    assert not limits.expired(at - 3600)
    assert not limits.expired(at)
    assert limits.expired(at + 0.001)


# ------------------------------------------------------------------------- the bucket


def test_bucket_capacity_and_refill() -> None:
    bucket = TokenBucket(2, now=100.0)
    assert bucket.take(2, 100.0) == 0.0
    assert bucket.take(2, 100.0) == 0.0
    assert bucket.take(2, 100.0) == pytest.approx(30.0)  # 2 a minute: one every 30 s
    assert bucket.take(2, 115.0) == pytest.approx(15.0)
    assert bucket.take(2, 130.0) == 0.0  # exactly one refilled
    assert bucket.take(2, 130.0) == pytest.approx(30.0)
    assert bucket.take(2, 1000.0) == 0.0  # a long pause refills to the capacity, no more
    assert bucket.take(2, 1000.0) == 0.0
    assert bucket.take(2, 1000.0) > 0


def test_bucket_rate_over_a_long_run() -> None:
    """60 a minute: over 10 minutes of one attempt every 0.25 s, 60 at first + 1 a second."""
    bucket = TokenBucket(60, now=0.0)
    taken = sum(bucket.take(60, i * 0.25) == 0.0 for i in range(2400))
    assert taken == 60 + 599


def test_bucket_follows_a_changed_limit() -> None:
    bucket = TokenBucket(10, now=0.0)
    for _ in range(10):
        assert bucket.take(10, 0.0) == 0.0
    assert bucket.take(10, 0.0) == pytest.approx(6.0)
    assert bucket.take(120, 0.5) == 0.0  # raised: refills at 2 a second from now on
    assert bucket.take(120, 0.5) == pytest.approx(0.5)
    big = TokenBucket(100, now=0.0)
    assert big.take(1, 0.0) == 0.0  # lowered to 1: what is left is capped at 1, then taken
    assert big.take(1, 0.0) == pytest.approx(60.0)


@pytest.mark.parametrize(("wait", "header"), [(0.0001, 1), (0.5, 1), (1.0, 1), (1.2, 2),
                                              (29.99, 30), (30.0, 30), (59.0, 59)])
def test_retry_after(wait: float, header: int) -> None:
    assert retry_after(wait) == header


# ------------------------------------------------------------------------- the answers


def test_errors_in_each_family() -> None:
    limited = rate_limited(2, 30)
    assert limited.status == 429
    assert dict(limited.headers)[b"retry-after"] == b"30"
    assert limited.to_dict()["code"] == "rate_limit_exceeded"
    assert limited.payload(Family.ANTHROPIC)["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    denied = model_not_allowed("gpt-4o")
    assert (denied.status, denied.code, denied.param) == (403, "model_not_allowed", "model")
    assert denied.payload(Family.ANTHROPIC)["error"]["type"] == "permission_error"  # type: ignore[index]
    assert denied.payload(Family.OLLAMA) == {"error": "this access key may not use model "
                                                      "'gpt-4o'"}
    expired = key_expired("2030-01-01T00:00:00Z")
    assert (expired.status, expired.code) == (401, "key_expired")
    assert expired.payload(Family.ANTHROPIC)["error"]["type"] == "authentication_error"  # type: ignore[index]


# ------------------------------------------------------------------------- secrets.yaml


def secrets_text(**entry: object) -> str:
    base = {"id": "ak-1", "name": "", "hash": "sha256:00", "created_at": "x",
            "last_used_at": None}
    return yaml.safe_dump({"admin_token": "t", "access_keys": [{**base, **entry}]})


def test_secrets_keep_limits() -> None:
    text = secrets_text(models=["qwen*"], rpm=30, expires_at="2030-01-01T00:00:00Z")
    entry = Secrets.from_text(text, "secrets.yaml").access_keys[0]
    limits = stored_limits(entry)
    assert (limits.models, limits.rpm, limits.expires_at) == (("qwen*",), 30,
                                                              "2030-01-01T00:00:00Z")
    assert stored_limits(Secrets.from_text(secrets_text(), "s").access_keys[0]) is UNLIMITED


@pytest.mark.parametrize(("entry", "path"), [
    ({"rpm": 0}, "access_keys[0].rpm"),
    ({"rpm": "9"}, "access_keys[0].rpm"),
    ({"models": "qwen"}, "access_keys[0].models"),
    ({"models": ["ok", ""]}, "access_keys[0].models[1]"),
    ({"expires_at": "next week"}, "access_keys[0].expires_at"),
    ({"expires_at": "2030-01-01T02:00:00+02:00"}, "access_keys[0].expires_at"),  # not stored form
])
def test_secrets_refuse_bad_limits(entry: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Secrets.from_text(secrets_text(**entry), "/d/secrets.yaml")
    assert caught.value.path == path
    assert "/d/secrets.yaml" in caught.value.message
    assert "sha256" not in caught.value.message
