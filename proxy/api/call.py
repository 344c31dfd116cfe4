"""What a gateway endpoint handler gets: the context and the request (method, path, body)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

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


Handler = Callable[[Call], tuple[int, Any]]


@contextmanager
def saving(what: str) -> Iterator[None]:
    """Around a settings change: a write the disk refuses (OSError; the settings changed
    nothing) answers a clean 500 saying what could not be saved."""
    try:
        yield
    except OSError as exc:
        raise not_saved(what, exc.strerror) from None
