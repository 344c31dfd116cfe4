"""Raw HTTP/1.1 over a real socket, for tests where the exact bytes matter: the one place a
test opens a connection (:func:`connect`, also from another loopback address), :class:`Raw`
(exact bytes out, a buffered reader of responses in), the OpenAI error shape check, and the
send-then-read-to-close helpers. The h11 client of tests/client.py sits on top of it; the
hygiene, hostile-input and slow-peer suites use it directly."""

from __future__ import annotations

import json
from typing import Any

import trio

T = 5  # real-time budget for any single wait in a real-clock test


async def connect(address: str, *, source: str | None = None) -> trio.SocketStream:
    """``address`` is ``unix:/path`` or ``127.0.0.1:port`` (or ``http://127.0.0.1:port``);
    ``source``: the loopback address a TCP connection comes from (127.0.0.2 is a remote peer
    under the ``remote_seam`` fixture)."""
    if address.startswith("unix:"):
        return await trio.open_unix_socket(address[5:])
    host, port = address.removeprefix("http://").rsplit(":", 1)
    if source is None:
        return await trio.open_tcp_stream(host, int(port))
    sock = trio.socket.socket()
    try:
        await sock.bind((source, 0))
        await sock.connect((host, int(port)))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def until_close(address: str, data: bytes) -> bytes:
    """Send ``data`` as is; every byte that comes back until the server closes (within T)."""
    stream = await connect(address)
    got = b""
    try:
        with trio.fail_after(T):
            await stream.send_all(data)
            while chunk := await stream.receive_some(65536):
                got += chunk
    finally:
        await stream.aclose()
    return got


class Raw:
    """One raw connection: exact bytes out, a buffered reader of exact bytes in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, address: str) -> Raw:
        return cls(await connect(address))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""  # a reset counts as closed
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def response(self, *, head_only: bool = False) -> RawResponse:
        """One response (status line, headers, Content-Length body unless ``head_only``: the
        answer to a HEAD); AssertionError on EOF."""
        while b"\r\n\r\n" not in self.buf:
            if not await self._fill():
                raise AssertionError(f"connection closed before a response head: "
                                     f"{bytes(self.buf)!r}")
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end])
        del self.buf[:end]
        lines = head[:-4].split(b"\r\n")
        version, code, *_ = lines[0].split(b" ", 2)
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.append((name.strip().lower().decode(), value.strip().decode()))
        status = int(code)
        length = 0
        for name, value in headers:
            if name == "content-length":
                length = int(value)
        if status < 200 or head_only:
            length = 0
        while len(self.buf) < length:
            if not await self._fill():
                raise AssertionError(f"connection closed mid-body: {bytes(self.buf)!r}")
        body = bytes(self.buf[:length])
        del self.buf[:length]
        return RawResponse(version, status, headers, body)

    async def rest(self) -> bytes:
        """Every byte until the peer closes the connection."""
        while await self._fill():
            pass
        data = bytes(self.buf)
        self.buf.clear()
        return data

    async def aclose(self) -> None:
        await self.stream.aclose()


class RawResponse:
    def __init__(self, version: bytes, status: int, headers: list[tuple[str, str]],
                 body: bytes) -> None:
        self.version = version
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __repr__(self) -> str:
        return f"RawResponse({self.status}, {self.headers}, {self.body[:200]!r})"


def assert_openai_error(body: bytes, code: str | None = None) -> dict[str, Any]:
    """``body`` is exactly ``{"error": {message, type, code, param}}`` with a message and a
    type (and this ``code`` if given); the error object."""
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert set(err) == {"message", "type", "code", "param"}, err
    assert isinstance(err["message"], str)
    assert err["message"]
    assert isinstance(err["type"], str)
    if code is not None:
        assert err["code"] == code, err
    return dict(err)


async def exchange(address: str, data: bytes) -> tuple[RawResponse, bytes]:
    """Send ``data``, read one response and then everything until the server closes."""
    raw = await Raw.open(address)
    try:
        with trio.fail_after(T):
            await raw.send(data)
            resp = await raw.response()
            rest = await raw.rest()
    finally:
        await raw.aclose()
    return resp, rest


async def assert_refused_with_close(address: str, data: bytes, status: int,
                                    code: str | None = None) -> RawResponse:
    """The request gets ``status`` with an OpenAI-shaped body, then the connection closes."""
    raw = await Raw.open(address)
    try:
        with trio.fail_after(T):
            await raw.send(data)
            resp = await raw.response()
            assert resp.status == status, resp  # before waiting for a close that may not come
            rest = await raw.rest()
    finally:
        await raw.aclose()
    assert resp.header("content-type") == "application/json"
    assert_openai_error(resp.body, code)
    assert rest == b""  # closed right after the error, nothing more
    return resp


def chat_head(extra: bytes = b"", host: bytes = b"localhost") -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b"\r\n" + extra
