"""Which headers cross the gateway, in each direction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.headers import (
    HOP_BY_HOP,
    SERVED_BY,
    Header,
    connection_tokens,
    downstream_response_headers,
    header_value,
    is_event_stream,
    upstream_request_headers,
)

_SETTINGS = settings(max_examples=100, derandomize=True, deadline=None)


def up(headers: list[Header], *, api_key: str | None = None, body_length: int = 0,
       authority: bytes = b"127.0.0.1:8080") -> list[Header]:
    return upstream_request_headers(headers, authority=authority, body_length=body_length,
                                    api_key=api_key)


def down(headers: list[Header], *, served_by: bytes = b"local") -> list[Header]:
    return downstream_response_headers(headers, served_by=served_by)


def names(headers: list[Header]) -> list[bytes]:
    return [name for name, _ in headers]


def values(headers: list[Header], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def test_hop_by_hop_set() -> None:
    assert {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding",
            b"upgrade", b"proxy-authenticate", b"proxy-authorization"} <= HOP_BY_HOP
    assert all(name == name.lower() for name in HOP_BY_HOP)


# --- hop-by-hop stripping, both directions ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOP_BY_HOP))
def test_hop_by_hop_never_goes_upstream(name: bytes) -> None:
    out = up([(b"accept", b"*/*"), (name, b"x"), (b"user-agent", b"t")])
    assert name not in names(out)
    assert (b"accept", b"*/*") in out
    assert (b"user-agent", b"t") in out


@pytest.mark.parametrize("name", sorted(HOP_BY_HOP))
def test_hop_by_hop_never_goes_downstream(name: bytes) -> None:
    out = down([(b"content-type", b"application/json"), (name, b"x")])
    assert name not in names(out)
    assert (b"content-type", b"application/json") in out


@pytest.mark.parametrize("name", [b"proxy-foo", b"proxy-", b"proxy-authorization-extra",
                                  b"proxy-status"])
def test_any_proxy_header_is_stripped(name: bytes) -> None:
    assert name not in names(up([(name, b"1")]))
    assert name not in names(down([(name, b"1")]))


def test_similar_names_are_not_stripped() -> None:
    kept = [(b"x-proxy-id", b"1"), (b"proxyish", b"2"), (b"tee", b"3"), (b"upgrades", b"4"),
            (b"x-connection", b"5")]
    assert [h for h in up(kept) if h in kept] == kept
    assert [h for h in down(kept) if h in kept] == kept


@pytest.mark.parametrize(
    "connection",
    [
        b"x-foo, x-bar",
        b"X-Foo,X-Bar",
        b"  x-foo  ,\tX-BAR\t",
        b"x-foo,,, ,x-bar,",
        b"close, X-Foo , keep-alive,x-bar",
    ],
)
def test_names_listed_in_connection_are_stripped(connection: bytes) -> None:
    headers = [(b"connection", connection), (b"x-foo", b"1"), (b"x-bar", b"2"),
               (b"x-baz", b"3")]
    for out in (up(headers), down(headers)):
        assert b"x-foo" not in names(out)
        assert b"x-bar" not in names(out)
        assert b"connection" not in names(out)
        assert (b"x-baz", b"3") in out


def test_several_connection_headers_all_count() -> None:
    headers = [(b"connection", b"x-foo"), (b"x-foo", b"1"), (b"connection", b"X-Bar"),
               (b"x-bar", b"2"), (b"x-keep", b"3")]
    assert connection_tokens(headers) == frozenset({b"x-foo", b"x-bar"})
    for out in (up(headers), down(headers)):
        assert b"x-foo" not in names(out)
        assert b"x-bar" not in names(out)
        assert (b"x-keep", b"3") in out


def test_connection_tokens() -> None:
    assert connection_tokens([]) == frozenset()
    assert connection_tokens([(b"connection", b"")]) == frozenset()
    assert connection_tokens([(b"connection", b" , ,")]) == frozenset()
    assert connection_tokens([(b"connection", b"Keep-Alive, UPGRADE")]) == frozenset(
        {b"keep-alive", b"upgrade"})
    assert connection_tokens([(b"x-connection", b"x-foo")]) == frozenset()


# --- upstream: replaced headers ----------------------------------------------------------------


def test_upstream_replaces_host_length_auth_expect() -> None:
    client = [
        (b"host", b"gateway.local:11434"),
        (b"authorization", b"Bearer client-secret"),
        (b"content-length", b"999"),
        (b"expect", b"100-continue"),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
    ]
    out = up(client, api_key="sk-up", body_length=42, authority=b"10.0.0.5:8000")
    assert values(out, b"host") == [b"10.0.0.5:8000"]
    assert values(out, b"content-length") == [b"42"]
    assert values(out, b"authorization") == [b"Bearer sk-up"]
    assert values(out, b"expect") == []
    assert b"client-secret" not in b"".join(value for _, value in out)
    assert out[0] == (b"host", b"10.0.0.5:8000")  # Host first (RFC 9112 §3.2)
    assert (b"content-type", b"application/json") in out
    assert (b"accept", b"text/event-stream") in out


@pytest.mark.parametrize("api_key", [None, ""])
def test_upstream_without_api_key_sends_no_authorization(api_key: str | None) -> None:
    out = up([(b"authorization", b"Bearer client-secret")], api_key=api_key)
    assert values(out, b"authorization") == []


def test_upstream_without_client_headers() -> None:
    out = up([], body_length=0, authority=b"localhost")
    assert out == [(b"host", b"localhost"), (b"content-length", b"0")]


def test_upstream_keeps_order_and_duplicates_of_end_to_end_headers() -> None:
    client = [(b"x-a", b"1"), (b"accept", b"a"), (b"x-a", b"2"), (b"cookie", b"c")]
    out = up(client)
    assert [h for h in out if h[0] in {b"x-a", b"accept", b"cookie"}] == client


def test_upstream_unicode_api_key_is_utf8() -> None:
    assert values(up([], api_key="kéy"), b"authorization") == [b"Bearer k\xc3\xa9y"]


def test_upstream_input_is_not_modified() -> None:
    client = [(b"host", b"h"), (b"connection", b"close"), (b"x", b"1")]
    copy = list(client)
    up(client, api_key="k")
    assert client == copy


# --- downstream -------------------------------------------------------------------------------


def test_served_by_set_once_replacing_the_upstreams() -> None:
    out = down([(SERVED_BY, b"evil"), (b"content-type", b"application/json"),
                (SERVED_BY, b"other")], served_by=b"node-a/backend-1")
    assert values(out, SERVED_BY) == [b"node-a/backend-1"]
    assert SERVED_BY == b"x-sluice-served-by"


def test_served_by_always_present() -> None:
    assert down([], served_by=b"b") == [(SERVED_BY, b"b")]


def test_upstream_content_length_is_dropped() -> None:
    out = down([(b"content-length", b"1234"), (b"content-type", b"application/json")])
    assert values(out, b"content-length") == []
    assert (b"content-type", b"application/json") in out


def test_downstream_streamed_response_from_llama_cpp() -> None:
    upstream = [
        (b"keep-alive", b"timeout=5, max=100"),
        (b"content-type", b"text/event-stream"),
        (b"transfer-encoding", b"chunked"),
        (b"x-accel-buffering", b"no"),
        (b"server", b"llama.cpp"),
        (b"access-control-allow-origin", b""),
    ]
    out = down(upstream, served_by=b"llama")
    assert out == [
        (b"content-type", b"text/event-stream"),
        (b"x-accel-buffering", b"no"),
        (b"server", b"llama.cpp"),
        (b"access-control-allow-origin", b""),
        (SERVED_BY, b"llama"),
    ]


def test_downstream_does_not_touch_host_authorization_or_expect() -> None:
    # Only the request direction replaces those; a response header of that name passes.
    out = down([(b"www-authenticate", b"Bearer"), (b"x-host", b"h")])
    assert (b"www-authenticate", b"Bearer") in out
    assert (b"x-host", b"h") in out


# --- header_value / is_event_stream ---------------------------------------------------------


def test_header_value() -> None:
    headers = [(b"content-type", b"a"), (b"x", b"1"), (b"content-type", b"b")]
    assert header_value(headers, b"content-type") == b"a"
    assert header_value(headers, b"x") == b"1"
    assert header_value(headers, b"missing") is None
    assert header_value([], b"x") is None
    assert header_value([(b"x", b"")], b"x") == b""
    assert header_value(iter(headers), b"x") == b"1"


@pytest.mark.parametrize(
    "value",
    [b"text/event-stream", b"Text/Event-Stream", b"TEXT/EVENT-STREAM",
     b"text/event-stream; charset=utf-8", b"text/event-stream;charset=UTF-8",
     b" text/event-stream", b"text/event-stream ; charset=utf-8"],
)
def test_is_event_stream(value: bytes) -> None:
    assert is_event_stream([(b"content-type", value)])


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"content-type", b"application/json")],
        [(b"content-type", b"text/plain")],
        [(b"content-type", b"")],
        [(b"content-type", b"text/event")],
        [(b"x-content-type", b"text/event-stream")],
        [(b"accept", b"text/event-stream")],
        [(b"content-type", b"application/json"), (b"content-type", b"text/event-stream")],
    ],
)
def test_is_not_event_stream(headers: list[Header]) -> None:
    assert not is_event_stream(headers)


@pytest.mark.parametrize("value", [b"text/event-streamer", b"text/event-stream2",
                                   b"text/event-stream-json"])
def test_is_not_event_stream_longer_media_type(value: bytes) -> None:
    # A different media type that merely starts with "text/event-stream".
    assert not is_event_stream([(b"content-type", value)])


# --- properties -------------------------------------------------------------------------------

header_names = st.one_of(
    st.sampled_from(sorted(HOP_BY_HOP | {b"host", b"authorization", b"content-length",
                                         b"expect", b"proxy-x", SERVED_BY,
                                         b"content-type", b"x-a", b"accept"})),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
    .map(str.encode),
)
header_lists = st.lists(st.tuples(header_names, st.binary(max_size=8)), max_size=10)


@_SETTINGS
@given(headers=header_lists, key=st.one_of(st.none(), st.text(max_size=8)),
       length=st.integers(min_value=0, max_value=10**12))
def test_upstream_properties(headers: list[Header], key: str | None, length: int) -> None:
    out = up(headers, api_key=key, body_length=length, authority=b"a:1")
    listed = connection_tokens(headers)
    out_names = names(out)
    assert values(out, b"host") == [b"a:1"]
    assert values(out, b"content-length") == [str(length).encode()]
    assert values(out, b"authorization") == ([b"Bearer " + key.encode()] if key else [])
    assert b"expect" not in out_names
    for name in out_names:
        assert name not in HOP_BY_HOP
        assert not name.startswith(b"proxy-")
        assert name not in listed or name in {b"host", b"content-length", b"authorization"}
    # Every other end-to-end header passes, in order.
    kept = [h for h in headers if h[0] not in HOP_BY_HOP | listed
            | {b"host", b"authorization", b"content-length", b"expect"}
            and not h[0].startswith(b"proxy-")]
    assert out[1:1 + len(kept)] == kept


@_SETTINGS
@given(headers=header_lists, served=st.binary(min_size=1, max_size=10))
def test_downstream_properties(headers: list[Header], served: bytes) -> None:
    out = down(headers, served_by=served)
    listed = connection_tokens(headers)
    assert out[-1] == (SERVED_BY, served)
    assert values(out, SERVED_BY) == [served]
    for name in names(out):
        assert name not in HOP_BY_HOP
        assert not name.startswith(b"proxy-")
        assert name not in listed or name == SERVED_BY
    assert b"content-length" not in names(out)
