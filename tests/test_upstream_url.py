"""parse_upstream_url: http://host[:port][/base] and unix:/path.sock, or a ValueError."""

from __future__ import annotations

import pytest

from protocol.upstream_url import UpstreamAddress, parse_upstream_url


@pytest.mark.parametrize(
    ("url", "host", "port", "authority", "key"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1", 8080, b"127.0.0.1:8080", "tcp:127.0.0.1:8080"),
        ("http://127.0.0.1", "127.0.0.1", 80, b"127.0.0.1:80", "tcp:127.0.0.1:80"),
        ("http://localhost/", "localhost", 80, b"localhost:80", "tcp:localhost:80"),
        ("http://models.lan:11434", "models.lan", 11434, b"models.lan:11434",
         "tcp:models.lan:11434"),
        ("http://Models.LAN:1", "models.lan", 1, b"models.lan:1", "tcp:models.lan:1"),
        ("http://h:65535", "h", 65535, b"h:65535", "tcp:h:65535"),
        ("http://[::1]:8080", "::1", 8080, b"[::1]:8080", "tcp:[::1]:8080"),
        ("http://[::1]", "::1", 80, b"[::1]:80", "tcp:[::1]:80"),
        ("http://[fe80::1:2]:9/", "fe80::1:2", 9, b"[fe80::1:2]:9", "tcp:[fe80::1:2]:9"),
    ],
)
def test_http(url: str, host: str, port: int, authority: bytes, key: str) -> None:
    address = parse_upstream_url(url)
    assert isinstance(address, UpstreamAddress)
    assert address.host == host
    assert address.port == port
    assert address.unix_path is None
    assert address.authority == authority
    assert address.key == key
    assert address.base_path == ""
    assert address.target(b"/v1/models") == b"/v1/models"


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:1", ""),
        ("http://h:1/", ""),
        ("http://h:1/v1", ""),
        ("http://h:1/v1/", ""),
        ("http://h:1/openai", "/openai"),
        ("http://h:1/openai/", "/openai"),
        ("http://h:1/openai/v1", "/openai"),
        ("http://h:1/openai/v1/", "/openai"),
        ("http://h:1/a/b/c", "/a/b/c"),
        ("http://h:1/v10", "/v10"),
        ("http://h:1/xv1", "/xv1"),
        ("http://h:1/v1/x", "/v1/x"),
        ("http://h:1/v1/v1", "/v1"),
    ],
)
def test_base_path(url: str, base: str) -> None:
    address = parse_upstream_url(url)
    assert address.base_path == base
    assert address.target(b"/v1/chat/completions") == (base + "/v1/chat/completions").encode()
    assert address.authority == b"h:1"


def test_target_keeps_query_of_the_request() -> None:
    address = parse_upstream_url("http://h/proxy/v1")
    assert address.target(b"/v1/models?x=1") == b"/proxy/v1/models?x=1"
    assert address.target(b"/health") == b"/proxy/health"


@pytest.mark.parametrize(
    "path",
    ["/tmp/llama.sock", "/run/sluice/a b.sock", "/x", "/a/b/c/server.sock"],
)
def test_unix(path: str) -> None:
    address = parse_upstream_url("unix:" + path)
    assert address.unix_path == path
    assert address.host is None
    assert address.port is None
    assert address.authority == b"localhost"
    assert address.key == "unix:" + path
    assert address.base_path == ""
    assert address.target(b"/v1/models") == b"/v1/models"


def test_keys_distinguish_addresses() -> None:
    keys = {parse_upstream_url(u).key for u in
            ["http://h:1", "http://h:2", "http://g:1", "unix:/h", "http://[::1]:1"]}
    assert len(keys) == 5
    assert parse_upstream_url("http://h:1/a").key == parse_upstream_url("http://h:1/b").key


def test_repr() -> None:
    assert repr(parse_upstream_url("http://h:1/base")) == "UpstreamAddress(tcp:h:1/base)"
    assert repr(parse_upstream_url("unix:/s.sock")) == "UpstreamAddress(unix:/s.sock)"


@pytest.mark.parametrize(
    "url",
    [
        "https://h:443",
        "HTTPS://h",
        "ftp://h",
        "ws://h:80",
        "h:8080",
        "localhost",
        "",
        "//h:80",
        "http://",
        "http:///v1",
        "http://:8080",
        "http://h:1?x=1",
        "http://h:1/v1?key=secret",
        "http://h:1#frag",
        "http://user@h:1",
        "http://user:pw@h:1",
        "http://:pw@h:1",
        "http://h:0",
        "http://[::1]:0",
        "http://h:65536",
        "http://h:-1",
        "http://h:http",
        "http://h:99999999999",
        "unix:relative.sock",
        "unix:relative/path.sock",
        "unix:",
        "unix:/",
        "unix://x",
        "unix://x/y.sock",
        "unix:/dir/",
    ],
)
def test_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_upstream_url(url)
