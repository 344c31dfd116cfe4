"""What every connection's bytes go through: a :class:`Wire`. Two kinds have one: the
socket itself (:class:`proxy.link.sockio.PlainWire`) and TLS 1.3 over it
(:class:`proxy.link.tlsio.TlsChannel`, SPEC §16's links). The client connection, its
writer and the upstream connection hold one and never ask which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["Wire"]


class Wire(Protocol):
    """A connected socket's bytes, read and written without yielding when the kernel can
    take or give them at once (see :mod:`proxy.link.sockio`). One reader and one writer
    may use it at the same time."""

    fd: int  # the socket's descriptor (for logs and repr; no I/O of its own elsewhere)

    async def recv(self, size: int, wait_first: bool = False) -> bytes:
        """Up to ``size`` bytes; b"" at the end. ``wait_first``: the caller knows the
        bytes cannot be there yet (the read that would fail is not tried). Raises OSError
        (ssl.SSLError too) or trio.ClosedResourceError."""

    async def send_all(self, data: bytes, on_block: Callable[[], None] | None = None,
                       stall: float | None = None) -> None:
        """Write all of ``data``. ``on_block``: called once, before the first wait, when
        the kernel cannot take it all at once; ``stall``: the longest wait for the peer to
        take more (past it, TimeoutError). Raises OSError."""

    def close(self) -> None:
        """Close at once (synchronous: safe in cancelled and finally blocks); again: no-op."""

    def looks_alive(self) -> bool:
        """For an idle connection: False when the peer closed it, reset it, or sent bytes
        nobody asked for."""

    def stream(self) -> trio.abc.Stream:
        """The wire as a trio stream, for code that takes one (a connection handed over to
        another protocol: :mod:`proxy.replay_stream`)."""
