"""What a gateway endpoint handler gets: the context and the request (method, path, body)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import attrs

from protocol.errors import bad_request, not_saved

if TYPE_CHECKING:
    from proxy.context import GatewayContext


@attrs.frozen(repr=False)
class Call:
    ctx: GatewayContext
    method: bytes
    path: str
    body: bytes = b""
    query: str = ""  # the target's query string, without the "?"

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
    """A reply that is not JSON: its bytes and their content type."""

    content_type: bytes
    data: bytes

    def __repr__(self) -> str:
        return f"Body({self.content_type!r}, {len(self.data)} bytes)"


Handler = Callable[[Call], tuple[int, Any]]
"""``handler(call) -> (status, payload)``: the payload is sent as JSON, or as it is when it
is a :class:`Body`."""


@contextmanager
def saving(what: str) -> Iterator[None]:
    """Around a settings change: a write the disk refuses (OSError; the settings changed
    nothing) answers a clean 500 saying what could not be saved."""
    try:
        yield
    except OSError as exc:
        raise not_saved(what, exc.strerror) from None
