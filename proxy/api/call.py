"""What a gateway endpoint handler gets: the context and the request (method, path, body,
query, headers); what it may give back besides JSON: raw bytes (:class:`Body`) or a
protocol switch (:class:`Takeover`); and an entry of the route table (:class:`Endpoint`:
who may call a path, and its handler for each method)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import attrs

from protocol.access import Rule
from protocol.errors import bad_request, not_saved
from proxy.link.listener import TCP, Listener

if TYPE_CHECKING:
    import trio

    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext


@attrs.frozen(repr=False)
class Call:
    ctx: GatewayContext
    method: bytes
    path: str
    body: bytes = b""
    query: str = ""  # the target's query string, without the "?"
    headers: Sequence[tuple[bytes, bytes]] = ()  # names lowercased; values may hold keys
    listener: Listener = TCP  # the listener it came on (proxy.link.listener)
    grant: Grant | None = None  # the access key the request presented (proxy.access.key_grants)
    peer: str = ""  # the TCP API listener's peer IP; "" on the Unix socket and local-tcp

    def params(self) -> dict[str, str]:
        """The query string's parameters (the last value of a repeated one)."""
        return dict(parse_qsl(self.query, keep_blank_values=True))

    def __repr__(self) -> str:  # never the body: it may hold a key
        return f"Call({self.method.decode('latin-1')} {self.path}, {len(self.body)} bytes)"

    def json_object(self, *, empty_ok: bool = False) -> dict[str, Any]:
        """The body as a JSON object (400 otherwise); ``{}`` for no body when allowed."""
        if not self.body.strip() and empty_ok:
            return {}
        try:
            doc = json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            raise bad_request("the request body is not valid JSON",
                              code="invalid_json") from None
        if not isinstance(doc, dict):
            raise bad_request("the request body must be a JSON object", code="invalid_json")
        return doc


@attrs.frozen(repr=False)
class Body:
    """A reply that is not JSON: its bytes, their content type and any more headers."""

    content_type: bytes
    data: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __repr__(self) -> str:
        return f"Body({self.content_type!r}, {len(self.data)} bytes)"


@attrs.frozen(repr=False)
class Takeover:
    """A reply that takes the connection over (a protocol switch: the events WebSocket).
    The exchange ends and the connection stops reading; ``run(stream, headers)`` then gets
    the client's byte stream, starting with the request head again, and the headers the
    switch's answer must carry (``x-sluice-request-id``); the connection ends when it
    returns. The handler returns it as ``(101, Takeover(...))``, having checked that the
    request asks for exactly this switch."""

    run: Callable[[trio.abc.Stream, list[tuple[bytes, bytes]]], Awaitable[None]]
    name: str = "takeover"

    def __repr__(self) -> str:
        return f"Takeover({self.name})"


Handler = Callable[[Call], tuple[int, Any]]
"""``handler(call) -> (status, payload)``: the payload is sent as JSON, or as it is when it
is a :class:`Body`; a :class:`Takeover` hands the connection over."""

AsyncHandler = Callable[[Call], Awaitable[tuple[int, Any]]]
"""A handler that must wait for something (adding a node asks the node who it is)."""
AnyHandler = Handler | AsyncHandler


@attrs.frozen(eq=False)
class Endpoint:
    """One path of the route table: who may call it (``access``, by method: SPEC §5) and
    its handler for each method it serves."""

    access: Rule
    handlers: Mapping[bytes, AnyHandler]


@contextmanager
def saving(what: str) -> Iterator[None]:
    """Around a settings change: a write the disk refuses (OSError; the settings changed
    nothing) answers a clean 500 saying what could not be saved."""
    try:
        yield
    except OSError as exc:
        raise not_saved(what, exc.strerror) from None
