"""Upstream addresses: ``http://host[:port][/base]`` or ``unix:/path/to/server.sock``, and
pinned TLS links to a node (SPEC §16: :meth:`UpstreamAddress.pinned`)."""

from __future__ import annotations

from urllib.parse import urlsplit


class UpstreamAddress:
    """Where a model server listens, and what goes in ``Host`` and before each path."""

    __slots__ = ("authority", "base_path", "host", "key", "pin", "port", "unix_path")

    def __init__(self, *, host: str | None, port: int | None, unix_path: str | None,
                 base_path: str, pin: str | None = None) -> None:
        self.host = host
        self.port = port
        self.unix_path = unix_path
        self.base_path = base_path
        self.pin = pin  # a pinned TLS link: the server's certificate must hash to it
        if unix_path is not None:
            assert pin is None
            self.authority = b"localhost"
            self.key = f"unix:{unix_path}"
        else:
            assert host is not None
            assert port is not None
            shown = f"[{host}]" if ":" in host else host
            self.authority = f"{shown}:{port}".encode()
            # The pool's key: a pinned link and a plain one never share a connection, nor
            # two links pinned to different certificates.
            self.key = f"tcp:{shown}:{port}" if pin is None else f"tls:{shown}:{port}@{pin}"

    def __repr__(self) -> str:
        return f"UpstreamAddress({self.key}{self.base_path})"

    def pinned(self, pin: str, port: int | None = None) -> UpstreamAddress:
        """This TCP address as a pinned TLS link (on ``port``, the node's TLS port, when
        given): same host and base path."""
        if self.host is None:
            raise ValueError("a Unix socket address cannot be a pinned link")
        return UpstreamAddress(host=self.host, port=self.port if port is None else port,
                               unix_path=None, base_path=self.base_path, pin=pin)

    def target(self, path: bytes) -> bytes:
        return self.base_path.encode() + path if self.base_path else path


def parse_upstream_url(url: str) -> UpstreamAddress:
    """Parse a backend or node URL; raises ValueError with a readable reason."""
    if url.startswith("unix:"):
        path = url[len("unix:"):]
        if not path.startswith("/") or path.startswith("//") or path.endswith("/"):
            raise ValueError(f"expected unix:/absolute/path.sock, got {url!r}")
        return UpstreamAddress(host=None, port=None, unix_path=path, base_path="")
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"URL must start with http:// or unix:/ : {url!r}")
    if not parts.hostname:
        raise ValueError(f"URL has no host: {url!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"URL must not carry a query, fragment or credentials: {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"URL has an invalid port: {url!r}") from None
    if port == 0:
        raise ValueError(f"URL has port 0: {url!r}")
    base = parts.path.rstrip("/")
    # A base ending in /v1 is common in OpenAI settings; requests already carry /v1.
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return UpstreamAddress(host=parts.hostname, port=port or 80, unix_path=None, base_path=base)
