"""The TLS of SPEC §16's links, both ends: the contexts, and a pinned client handshake.

Both ends speak TLS 1.3 only, with this gateway's Ed25519 certificate
(:mod:`proxy.lan.identity`). OpenSSL (Python's ``ssl``) does every step of TLS; what is
decided here is which certificates count:

- The node listener (:func:`server_context`) asks for a client certificate and trusts
  exactly the paired peers' self-signed ones, each loaded as its own trust anchor
  (``cadata``; ``VERIFY_X509_PARTIAL_CHAIN`` lets a certificate in the store end a chain by
  itself, and OpenSSL 3 takes these self-signed CA:false certificates as anchors either
  way; tests/test_tls_link.py checks both facts, and that a certificate a peer signed
  with its key, or a twin with the same key, is refused: CA:false). An unknown certificate
  is refused at the handshake; a client with none is let through (the node listener then
  serves it the pairing exchange only).
- A pinned link (:func:`client_context`, :func:`handshake`) checks no chain: after the
  handshake the server's certificate must hash to the pin (:mod:`protocol.lan.pinning`),
  else :class:`PinMismatch`, raised before our certificate, our Finished or any byte of a
  request is sent. Then it waits for the server's session ticket, which a TLS 1.3 server
  sends only once it has accepted our certificate: a refusal is :class:`HandshakeRefused`
  there, at the handshake, rather than at the first answer.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from protocol.lan.pinning import fingerprint_of, pin_matches
from protocol.upstream_url import UpstreamAddress
from proxy.tlsio import TlsChannel
from proxy.upstream.connection import UpstreamConnection, UpstreamFailure

if TYPE_CHECKING:
    from proxy.lan.identity import Identity

__all__ = [
    "HandshakeRefused", "PinMismatch", "TlsLinkError", "as_connection", "client_context",
    "handshake", "open_for_pairing", "open_pinned", "server_context",
]

TICKETS = 1  # session tickets the node listener sends: the sign it took the client's certificate


class TlsLinkError(UpstreamFailure):
    """A TLS link could not be made (a connect failure: nothing was sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, connect=True)


class PinMismatch(TlsLinkError):
    """The server's certificate is not the pinned one (SPEC §16: ``node_identity_changed``).
    Carries both pins (public values), never anything secret."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"the node's certificate is {got}, not the pinned {expected}")
        self.expected = expected
        self.got = got


class HandshakeRefused(TlsLinkError):
    """The TLS handshake failed: the server refused our certificate, or does not speak
    TLS 1.3. ``reason`` is OpenSSL's short reason (e.g. ``TLSV1_ALERT_UNKNOWN_CA``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the TLS handshake was refused: {reason}")
        self.reason = reason


def _tls13_only(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    return context


def server_context(identity: Identity, peer_certs: Sequence[bytes]) -> ssl.SSLContext:
    """The node listener's context: TLS 1.3 only, our certificate, a client certificate
    asked for and, when one is sent, valid only if it is one of ``peer_certs`` (DER)."""
    context = _tls13_only(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    context.load_cert_chain(identity.cert_path, identity.key_path)
    context.verify_mode = ssl.CERT_OPTIONAL
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    for der in peer_certs:
        context.load_verify_locations(cadata=der)
    context.num_tickets = TICKETS
    return context


def client_context(identity: Identity | None) -> ssl.SSLContext:
    """A link's context: TLS 1.3 only, our certificate (None: none, for pairing), no chain
    or host name checked by OpenSSL (the pin is checked after the handshake)."""
    context = _tls13_only(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if identity is not None:
        context.load_cert_chain(identity.cert_path, identity.key_path)
    return context


def _reason(exc: ssl.SSLError) -> str:
    return exc.reason or exc.__class__.__name__


async def handshake(sock: trio.socket.SocketType, context: ssl.SSLContext,
                    pin: str | None) -> TlsChannel:
    """The client handshake on a connected socket, within the caller's deadline. ``pin``
    None: not checked (pairing, which learns the server's pin from
    :meth:`TlsChannel.peer_certificate`). Raises PinMismatch, HandshakeRefused, or
    UpstreamFailure(connect=True) for a connection lost meanwhile; the socket is closed
    then."""
    channel = TlsChannel(sock, context, server_side=False)
    try:
        try:
            await channel.handshake(finish=False)
        except ssl.SSLError as exc:
            raise HandshakeRefused(_reason(exc)) from None
        der = channel.peer_certificate()
        if der is None:  # pragma: no cover - a TLS 1.3 server always sends one
            raise HandshakeRefused("the server sent no certificate")
        if pin is not None and not pin_matches(der, pin):
            raise PinMismatch(pin, fingerprint_of(der))
        await channel.flush()
        try:
            await channel.wait_accepted()
        except ssl.SSLError as exc:
            raise HandshakeRefused(_reason(exc)) from None
        except ConnectionResetError:
            raise HandshakeRefused("the server closed the connection") from None
    except BaseException as exc:
        sock.close()
        if isinstance(exc, OSError):
            raise UpstreamFailure(f"the TLS handshake failed: {exc}", connect=True) from None
        raise
    return channel


async def _open(host: str, port: int, context: ssl.SSLContext, pin: str | None,
                timeout: float) -> TlsChannel:
    with trio.fail_after(timeout):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamFailure(f"cannot connect to {host}:{port}: {exc}",
                                  connect=True) from None
        return await handshake(stream.socket, context, pin)


async def open_pinned(host: str, port: int, pin: str, context: ssl.SSLContext,
                      timeout: float) -> TlsChannel:
    """A connected TLS link to ``host:port`` whose certificate hashes to ``pin`` and which
    took ours. Raises PinMismatch, HandshakeRefused, UpstreamFailure(connect=True), or
    trio.TooSlowError past ``timeout`` seconds."""
    return await _open(host, port, context, pin, timeout)


async def open_for_pairing(host: str, port: int, context: ssl.SSLContext,
                           timeout: float) -> tuple[TlsChannel, str]:
    """A TLS link to a node not pinned yet (SPEC §16 pairing: the PAKE then proves who it
    is), and the pin of the certificate it showed. ``context``: usually
    ``client_context(None)`` (no certificate: the node listener lets such a client call
    the pairing exchange only)."""
    channel = await _open(host, port, context, None, timeout)
    der = channel.peer_certificate()
    assert der is not None
    return channel, fingerprint_of(der)


def as_connection(channel: TlsChannel, address: UpstreamAddress) -> UpstreamConnection:
    """An HTTP/1.1 connection over a channel opened here (e.g. :func:`open_for_pairing`'s),
    for requests outside the pool: ``send_request``, ``receive_head``, ``receive_body``;
    the caller closes it. ``address`` gives the ``Host`` and base path (its pin is not
    checked again)."""
    return UpstreamConnection(trio.SocketStream(channel.sock), address, channel)
