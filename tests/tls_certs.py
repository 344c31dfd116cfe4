"""Identities for TLS tests (SPEC §16): real ones, made by proxy.link.identity in a test's
folders, and certificates no gateway would make (a twin with a peer's key, one a peer's key
signed) to show what the node listener refuses; a plain HTTP request to a TLS port; the two
ends' contexts (proxy.link.tls.tls_context) by name, and a pinned link opened outside the
pool."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Sequence
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from proxy.link.identity import Identity, ensure_identity, load_identity
from proxy.link.identity_make import make_here
from proxy.link.tls import End, handshake, tls_context
from proxy.link.tlsio import TlsChannel
from proxy.upstream.connection import UpstreamFailure


def identities(folder: Path, *names: str) -> list[Identity]:
    """One identity per name, each in ``folder/<name>`` (made there once, in this process:
    the gateway's own child process is tests/test_identity.py's and test_lazy_imports's)."""
    return [ensure_identity(folder / name, make_here) for name in names]


def _write(folder: Path, cert: x509.Certificate, key_pem: bytes) -> Identity:
    where = folder / "identity"
    where.mkdir(parents=True, mode=0o700)
    (where / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "key.pem").write_bytes(key_pem)
    made = load_identity(folder)
    assert made is not None
    return made


def _peer_key(peer: Identity) -> ed25519.Ed25519PrivateKey:
    key = serialization.load_pem_private_key(peer.key_path.read_bytes(), None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    return key


def twin_of(peer: Identity, folder: Path) -> Identity:
    """Another self-signed certificate with ``peer``'s key, name and key ids (so another pin):
    what a peer could make of its own key."""
    key = _peer_key(peer)
    cert = x509.load_der_x509_certificate(peer.der)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30)))
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return _write(folder, builder.sign(key, None), peer.key_path.read_bytes())


def signed_by(peer: Identity, folder: Path) -> Identity:
    """A certificate for a new key, issued by ``peer``'s (CN=sluice, its key id): a chain
    that would end at the peer's certificate if CA:false did not forbid it."""
    key = _peer_key(peer)
    issuer = x509.load_der_x509_certificate(peer.der)
    child = ed25519.Ed25519PrivateKey.generate()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "child")]))
            .issuer_name(issuer.subject).public_key(child.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()),
                           critical=False)
            .sign(key, None))
    pem = child.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    return _write(folder, cert, pem)


async def plain_http_to(port: int) -> bytes:
    """What a TLS port on 127.0.0.1 sends back to a plain HTTP request, until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    got = b""
    while data := await stream.receive_some(4096):
        got += data
    await stream.aclose()
    return got


def client_context(identity: Identity | None) -> ssl.SSLContext:
    """A link's client context, showing ``identity``'s certificate (None: none)."""
    return tls_context(End.CLIENT, identity)


def server_context(identity: Identity, peer_certs: Sequence[bytes]) -> ssl.SSLContext:
    """The node listener's context, trusting ``peer_certs`` (DER)."""
    return tls_context(End.SERVER, identity, peer_certs)


async def open_pinned(host: str, port: int, pin: str, context: ssl.SSLContext,
                      timeout: float) -> TlsChannel:
    """A TLS link to ``host:port`` whose certificate hashes to ``pin`` and which took ours,
    outside the pool. Raises PinMismatch, HandshakeRefused, UpstreamFailure(connect=True),
    or trio.TooSlowError past ``timeout`` seconds."""
    with trio.fail_after(timeout):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamFailure(f"cannot connect to {host}:{port}: {exc}",
                                  connect=True) from None
        return await handshake(stream.socket, context, pin)
