"""The TLS of SPEC §16's links, both ends: their contexts (one maker, :func:`tls_context`),
and a pinned client handshake.

Both ends speak TLS 1.3 only, with this gateway's Ed25519 certificate
(:mod:`proxy.link.identity`). OpenSSL (Python's ``ssl``) does every step of TLS; what is
decided here is which certificates count:

- The node listener (``tls_context(End.SERVER, ...)``) asks for a client certificate and trusts
  exactly the paired peers' self-signed ones, each loaded as its own trust anchor
  (``cadata``; ``VERIFY_X509_PARTIAL_CHAIN`` lets a certificate in the store end a chain by
  itself, and OpenSSL 3 takes these self-signed CA:false certificates as anchors either
  way; tests/test_tls_link.py checks both facts, and that a certificate a peer signed
  with its key, or a twin with the same key, is refused: CA:false). An unknown certificate
  is refused at the handshake; a client with none is let through (the node listener then
  serves it the pairing exchange only).
- A pinned link (``tls_context(End.CLIENT, ...)``, :func:`handshake`) checks no chain: after the
  handshake the server's certificate must hash to the pin (:mod:`protocol.lan.pinning`),
  else :class:`PinMismatch`, raised before our certificate, our Finished or any byte of a
  request is sent. Then it waits for the server's session ticket, which a TLS 1.3 server
  sends only once it has accepted our certificate: a refusal is :class:`HandshakeRefused`
  there, at the handshake, rather than at the first answer. Pairing
  (:func:`open_for_pairing`) shows no certificate and learns the server's pin instead.
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from protocol.lan.pinning import fingerprint_of, pin_matches
from protocol.upstream_url import UpstreamAddress
from proxy.link.tlsio import TlsChannel
from proxy.upstream.connection import UpstreamConnection, UpstreamFailure

if TYPE_CHECKING:
    from proxy.link.identity import Identity

__all__ = [
    "End", "HandshakeRefused", "PinMismatch", "TlsLinkError", "handshake", "open_for_pairing",
    "tls_context",
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


class End(enum.Enum):
    """Which end of a link a context is for."""

    CLIENT = "client"  # a pinned link to a node, or pairing (no certificate of ours)
    SERVER = "server"  # the node listener


def tls_context(end: End, identity: Identity | None,
                peer_certs: Sequence[bytes] = ()) -> ssl.SSLContext:
    """A link's context: TLS 1.3 only, with our certificate (None: none, a client that
    pairs). The node listener's (``End.SERVER``) asks for a client certificate and, when
    one is sent, takes it only if it is one of ``peer_certs`` (DER). A client's checks no
    chain or host name (the pin is checked after the handshake: :func:`handshake`)."""
    server = end is End.SERVER
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    if identity is not None:
        context.load_cert_chain(identity.cert_path, identity.key_path)
    if server:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        for der in peer_certs:
            context.load_verify_locations(cadata=der)
        context.num_tickets = TICKETS
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
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


async def open_for_pairing(address: UpstreamAddress,
                           timeout: float) -> tuple[UpstreamConnection, str]:
    """An HTTP/1.1 connection over TLS to a node not pinned yet (SPEC §16 pairing: the PAKE
    then proves who it is), showing no certificate (the node listener lets such a client
    call the pairing exchange only), and the pin of the certificate the node showed. For
    requests outside the pool: ``send_request``, ``receive_head``, ``receive_body``; the
    caller closes it. Raises HandshakeRefused, UpstreamFailure(connect=True), or
    trio.TooSlowError past ``timeout`` seconds."""
    host, port = address.host, address.port
    assert host is not None
    assert port is not None
    with trio.fail_after(timeout):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamFailure(f"cannot connect to {host}:{port}: {exc}",
                                  connect=True) from None
        channel = await handshake(stream.socket, tls_context(End.CLIENT, None), None)
    der = channel.peer_certificate()
    assert der is not None
    return UpstreamConnection(channel, address), fingerprint_of(der)
