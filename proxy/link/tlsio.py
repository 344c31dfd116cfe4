"""TLS on a socket's file descriptor, for the links of SPEC §16 on the hot path.

OpenSSL does all of TLS (an :class:`ssl.SSLObject` over two memory BIOs); this module only
moves its records with the socket's :class:`~proxy.link.sockio.PlainWire` (the call tried
first, a wait only when it would block), so a TLS connection costs what the plain one does
plus OpenSSL's own work, and goes through the same connection code: :class:`TlsChannel` is a
:class:`~proxy.link.wire.Wire` as the plain one is.

One task may read while another writes (a client connection's reader and its answer). A read
can make OpenSSL write (a key update's reply); those bytes go out at once only when no send
is under way, else the send in progress takes them after its own, so records never
interleave. Sends are not concurrent with each other (each side has one writer).

The end of the stream, with or without the peer's close_notify, reads as b"": HTTP's
framing tells a cut answer, as it does over plain TCP. An alert or a broken record raises
:class:`ssl.SSLError`, an OSError like the socket's own failures.
"""

from __future__ import annotations

import os
import select
import ssl
from collections.abc import Callable

import trio

from proxy.link.sockio import PlainWire

__all__ = ["RAW_SIZE", "TlsChannel", "TlsStream"]

RAW_SIZE = 64 * 1024  # record bytes asked of the kernel per read
_WANT_READ = ssl.SSLWantReadError
_CLOSED = (ssl.SSLZeroReturnError, ssl.SSLEOFError)
_RECORD_HEADER = 5  # a TLS record's header: type, version, length (RFC 8446 §5.1)


class TlsChannel:
    """One TLS connection over a connected socket (see the module). Made before the
    handshake; :meth:`handshake` runs it."""

    __slots__ = ("_backlog", "_early", "_in", "_obj", "_out", "_raw", "_raw_drained",
                 "_sending", "closed", "fd", "server_side", "sock")

    def __init__(self, sock: trio.socket.SocketType, context: ssl.SSLContext, *,
                 server_side: bool) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self._raw = PlainWire(sock)  # the records' transport
        self.server_side = server_side
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=server_side)
        self._backlog = b""  # record bytes a read produced that could not go out at once
        self._early = b""  # application bytes read while waiting for the server's ticket
        self._sending = False
        self._raw_drained = False  # the last raw read took all there was
        self.closed = False  # by close(): ``fd`` may be another socket's from then on

    def __repr__(self) -> str:
        side = "server" if self.server_side else "client"
        return f"TlsChannel({side}, fd={self.fd}, {self._obj.version() or 'handshaking'})"

    # ------------------------------------------------------------------ handshake

    async def handshake(self, *, finish: bool = True) -> None:
        """Run the handshake. Raises ssl.SSLError (refused, not TLS, wrong version: the
        alert that says so is sent first, when the socket takes it at once) or OSError.
        ``finish=False`` (a client): the last flight (our certificate and Finished) is left
        for :meth:`flush`, so the caller can look at the server's certificate before
        anything of ours is sent."""
        obj = self._obj
        while True:
            try:
                obj.do_handshake()
                break
            except _WANT_READ:
                await self.flush()
                await self._fill(True)
            except ssl.SSLError:
                self._send_nowait()  # the alert, so the peer learns why
                raise
        if finish:
            await self.flush()

    def peer_certificate(self) -> bytes | None:
        """The peer's certificate (DER) after the handshake; None when it sent none."""
        return self._obj.getpeercert(binary_form=True)

    def version(self) -> str | None:
        return self._obj.version()

    async def wait_accepted(self) -> None:
        """A client after its handshake: wait until the server shows it took our
        certificate. A TLS 1.3 server checks a client's certificate after the client's
        handshake is over, and then either sends its session ticket (ours sends one:
        :func:`proxy.link.tls.server_context`) or an alert. So the first whole record
        OpenSSL takes from the server without an error is the acceptance. Only the record
        headers' length fields are read here, to know when a whole record is in (asking
        OpenSSL for the session instead costs a copy of it, ~0.1 ms); OpenSSL decrypts and
        checks every byte. Raises ssl.SSLError (the alert) or ConnectionResetError
        (closed without one)."""
        obj = self._obj
        seen = b""  # the server's bytes since our Finished
        whole = 0  # how many of them form whole records
        while True:
            data = await self._raw.recv(RAW_SIZE, True)
            if not data:
                raise ConnectionResetError("the server closed the connection")
            self._in.write(data)
            seen += data
            while len(seen) - whole >= _RECORD_HEADER:
                length = int.from_bytes(seen[whole + 3:whole + _RECORD_HEADER], "big")
                if len(seen) - whole < _RECORD_HEADER + length:
                    break
                whole += _RECORD_HEADER + length
            try:
                early = obj.read(RAW_SIZE)
            except _WANT_READ:
                if whole:
                    return
                continue
            except _CLOSED:
                raise ConnectionResetError("the server closed the connection") from None
            if not early:
                raise ConnectionResetError("the server closed the connection")
            self._early += early  # answered before its ticket: it took us all the same
            return

    # ------------------------------------------------------------------ reading

    async def _fill(self, wait_first: bool) -> None:
        data = await self._raw.recv(RAW_SIZE, wait_first)
        self._raw_drained = len(data) < RAW_SIZE
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()

    async def recv(self, size: int, wait_first: bool = False) -> bytes:
        """Up to ``size`` application bytes; b"" at the end of the stream. ``wait_first``
        as :meth:`proxy.link.sockio.PlainWire.recv`: it applies to the socket only when no record is
        buffered and the last read of the socket took all there was."""
        if self._early:
            early, self._early = self._early[:size], self._early[size:]
            return early
        obj, incoming = self._obj, self._in
        while True:
            if incoming.pending or incoming.eof or obj.pending():
                data: bytes | None
                try:
                    data = obj.read(size)
                except _WANT_READ:
                    data = None
                except _CLOSED:
                    return b""
                if data is not None:
                    # Whole records already here are handed out together.
                    while data and len(data) < size and (incoming.pending or obj.pending()):
                        try:
                            more = obj.read(size - len(data))
                        except (_WANT_READ, *_CLOSED):
                            break
                        if not more:
                            break
                        data += more
                    if self._out.pending:
                        self._send_nowait()
                    return data
                if self._out.pending:
                    self._send_nowait()
                if incoming.eof:
                    return b""
            await self._fill(wait_first and self._raw_drained)

    # ------------------------------------------------------------------ writing

    async def send_all(self, data: bytes, on_block: Callable[[], None] | None = None,
                       stall: float | None = None) -> None:
        """Write all of ``data`` (``on_block`` and ``stall`` as
        :meth:`proxy.link.sockio.PlainWire.send_all`).
        After a failed or cancelled send the connection is finished."""
        self._obj.write(data)
        await self.flush(on_block, stall)

    async def flush(self, on_block: Callable[[], None] | None = None,
                    stall: float | None = None) -> None:
        """Send every record OpenSSL has made and not sent yet."""
        self._sending = True
        try:
            out = self._out.read()
            if self._backlog:
                out, self._backlog = self._backlog + out, b""
            while out:
                await self._raw.send_all(out, on_block, stall)
                out = self._out.read()  # what a read made meanwhile
        finally:
            self._sending = False

    def _send_nowait(self) -> None:
        """Records a read made (or an alert): out now if no send is under way and the
        socket takes them; what it does not take goes first with the next send."""
        if self._sending or self.closed:
            return
        out = self._backlog + self._out.read()
        self._backlog = b""
        if not out:
            return
        try:
            sent = os.write(self.fd, out)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # the connection is gone: the next read or send says so
        self._backlog = out[sent:]

    # ------------------------------------------------------------------ idle and close

    def looks_alive(self) -> bool:
        """For an idle pooled connection: False when the peer closed it, sent an alert or
        application bytes nobody asked for. Records that carry no data (a session ticket,
        a key update) are taken in and do not count."""
        if self.closed:
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLPRI)
        try:
            while poller.poll(0):
                data = os.read(self.fd, RAW_SIZE)
                if not data:
                    return False
                self._in.write(data)
        except BlockingIOError:
            pass
        except OSError:
            return False
        if self._in.pending or self._obj.pending():
            try:
                self._obj.read(1)
                return False  # unsolicited application data
            except _WANT_READ:
                pass
            except ssl.SSLError:
                return False
        return True

    def close(self) -> None:
        """Close at once (synchronous, safe in cancelled and finally blocks): a
        close_notify first when the socket takes it at once, then the socket. Closing again
        does nothing."""
        if self.closed:
            return
        if not self._sending and self._obj.version() is not None:
            try:
                self._obj.unwrap()
            except (ssl.SSLError, ValueError):
                pass  # wants the peer's close_notify (not awaited) or cannot say it
            self._send_nowait()
        self.closed = True
        self.sock.close()

    def stream(self) -> trio.abc.Stream:
        return TlsStream(self)


class TlsStream(trio.abc.Stream):
    """A :class:`TlsChannel` as a trio stream, for code that takes one (a connection
    handed over to another protocol: :mod:`proxy.replay_stream`)."""

    def __init__(self, channel: TlsChannel) -> None:
        self.channel = channel

    def __repr__(self) -> str:
        return f"TlsStream({self.channel!r})"

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            return await self.channel.recv(max_bytes or RAW_SIZE)
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            await self.channel.send_all(bytes(data))
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.channel.fd)

    async def aclose(self) -> None:
        self.channel.close()
        await trio.lowlevel.checkpoint()
