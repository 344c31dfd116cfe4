"""Where an attempt goes, as the relay sees it: a local backend
(:class:`~proxy.registry.backends.LocalBackend`) or a network node (:class:`NodeUpstream`)."""

from __future__ import annotations

from typing import Protocol

from protocol.upstream_url import UpstreamAddress
from proxy.registry.nodes import NodeEndpoint


class Upstream(Protocol):
    """Where an attempt goes: a local backend or a node."""

    @property
    def address(self) -> UpstreamAddress | None: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def served_by(self) -> bytes: ...
    @property
    def forwarded_by(self) -> bytes | None: ...


class NodeUpstream:
    """A network node as an upstream: its key, and our fingerprint as the loop guard."""

    __slots__ = ("address", "api_key", "fingerprint", "forwarded_by", "served_by")

    def __init__(self, endpoint: NodeEndpoint, api_key: str | None, forwarded_by: bytes) -> None:
        self.fingerprint = endpoint.fingerprint
        self.address = endpoint.address
        self.api_key = api_key
        self.forwarded_by: bytes | None = forwarded_by
        self.served_by = b"node:" + endpoint.fingerprint.encode()

    def __repr__(self) -> str:  # never the key
        return f"NodeUpstream({self.fingerprint!r})"
