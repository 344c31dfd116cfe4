"""A small raw HTTP/1.1 test client on trio sockets that keeps what a real client hides:
the exact body bytes, the read boundaries, and what happens when the connection ends. It
sits on tests/rawhttp.py (connections, exact bytes) and holds what most test files share:
the chat path ``CHAT``, :func:`chat_body`, :func:`error_of` and :func:`assert_refused`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import h11
import trio

from tests.rawhttp import assert_openai_error, connect, until_close

CHAT = "/v1/chat/completions"
# GET /health of a gateway without a node listener (SPEC §16: no identity in process).
HEALTH = {"status": "ok", "identity": None, "nodePort": None}


class Reply:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 reads: list[bytes], complete: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.reads = reads  # the body as the client's reads delivered it
        self.complete = complete  # False when the connection ended mid-body

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name.lower().encode():
                return value.decode()
        return None

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {len(self.body)} bytes, complete={self.complete})"


def assert_refused(reply: Reply, code: str) -> None:
    """A routing refusal: 503 with an OpenAI-shaped server_error of this ``code``."""
    assert reply.status == 503, reply
    error = error_of(reply)
    assert (error["code"], error["type"]) == (code, "server_error"), error


def error_of(reply: Reply) -> dict[str, Any]:
    """The error object of a whole (not streamed) OpenAI-shaped error reply, its shape checked
    (tests.rawhttp.assert_openai_error)."""
    assert not reply.body.startswith(b"data:"), reply.body[:200]
    return assert_openai_error(reply.body)


async def raw(address: str, head: bytes) -> Reply:
    """Send ``head`` (a whole request) as is; read the answer until the server closes."""
    data = await until_close(address, head)
    head_part, _, body = data.partition(b"\r\n\r\n")
    lines = head_part.split(b"\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in
               (line.partition(b":") for line in lines[1:])]
    return Reply(int(lines[0].split()[1]), headers, body, [body], True)


class Client:
    """One keep-alive connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, address: str, *, source: str | None = None) -> Client:
        """A connection to ``address`` (tests.rawhttp.connect), from ``source`` if given."""
        return cls(await connect(address, source=source))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send_request(self, method: str, path: str, body: bytes | None = None,
                           headers: list[tuple[str, str]] | None = None) -> None:
        hdrs = [("host", "localhost"), *(headers or [])]
        if body is not None:
            hdrs.append(("content-length", str(len(body))))
        data = self.h11.send(h11.Request(method=method, target=path, headers=hdrs)) or b""
        if body:
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)

    async def read_head(self) -> h11.Response:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.InformationalResponse):
                continue
            raise AssertionError(f"unexpected {event!r}")

    async def read_reply(self, head: h11.Response | None = None) -> Reply:
        if head is None:
            head = await self.read_head()
        reads: list[bytes] = []
        complete = True
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                complete = False
                break
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                reads.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"unexpected {event!r}")
        if complete and self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return Reply(head.status_code, list(head.headers), b"".join(reads), reads, complete)

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: list[tuple[str, str]] | None = None) -> Reply:
        await self.send_request(method, path, body, headers)
        return await self.read_reply()


async def request(address: str, method: str, path: str, body: bytes | None = None,
                  headers: list[tuple[str, str]] | None = None, *,
                  source: str | None = None) -> Reply:
    """One request on a connection of its own (from ``source``, if given)."""
    client = await Client.open(address, source=source)
    try:
        return await client.request(method, path, body, headers)
    finally:
        await client.aclose()


def chat_body(model: str = "fake-model", stream: bool = False, **extra: Any) -> bytes:
    doc = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    doc.update(extra)
    return json.dumps(doc).encode()


async def read_events(client: Client, count: int) -> bytes:
    """Body bytes of a streamed reply (after its head) until ``count`` SSE events are in."""
    return await read_until(client, lambda got: got.count(b"\n\n") >= count)


async def read_until(client: Client, enough: Callable[[bytes], bool]) -> bytes:
    """Body bytes of a streamed reply (after its head) until ``enough`` says so of them."""
    got = b""
    while not enough(got):
        event = client.h11.next_event()
        if event is h11.NEED_DATA:
            client.h11.receive_data(await client.stream.receive_some(65536))
        elif isinstance(event, h11.Data):
            got += event.data
        else:
            raise AssertionError(f"stream ended early: {event!r}")
    return got
