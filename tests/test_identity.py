"""The gateway's identity (SPEC §16, proxy/link/identity.py): an Ed25519 key and a self-signed
certificate made once in the data dir and reused, made again when a file is missing or
unusable, with their modes; what the certificate holds (made in process, ``make_here``;
by its child process and reading it without ``cryptography``: tests/test_e2e_identity.py
and tests/test_e2e_lazy_imports.py). Then the handshake facts the node listener is built
on, with two real identities over trio.SSLStream on a socket pair (no network): TLS 1.3
with the peer's certificate as the only verify location and CERT_OPTIONAL; each side's peer
certificate hashes to the other's pin; an unknown certificate, TLS 1.2 and plain HTTP are
refused; no certificate at all is let through."""

from __future__ import annotations

import datetime
import os
import ssl
import stat
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from protocol.lan.pinning import fingerprint_of, pin_matches
from proxy.link.identity import Identity, ensure_identity, load_identity
from proxy.link.identity_make import make_here


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_modes(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    assert mode(made.cert_path.parent) == 0o700
    assert mode(made.key_path) == 0o600
    assert mode(made.cert_path) == 0o644


def test_modes_opened_up_are_closed_again(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    os.chmod(made.key_path, 0o644)
    os.chmod(made.cert_path.parent, 0o755)
    assert ensure_identity(tmp_path, make_here) == made
    assert mode(made.key_path) == 0o600
    assert mode(made.cert_path.parent) == 0o700


def test_every_gateway_has_its_own(tmp_path: Path) -> None:
    one = ensure_identity(tmp_path / "a", make_here)
    two = ensure_identity(tmp_path / "b", make_here)
    assert one.fingerprint != two.fingerprint
    serials = {x509.load_der_x509_certificate(i.der).serial_number for i in (one, two)}
    assert len(serials) == 2


@pytest.mark.parametrize("damage", [
    "remove the key", "remove the certificate", "garble the certificate", "garble the key",
    "empty key", "another identity's key", "the certificate is a folder",
])
def test_made_again_when_a_file_is_missing_or_unusable(tmp_path: Path, damage: str) -> None:
    made = ensure_identity(tmp_path / "data", make_here)
    other = ensure_identity(tmp_path / "other", make_here)
    if damage == "remove the key":
        made.key_path.unlink()
    elif damage == "remove the certificate":
        made.cert_path.unlink()
    elif damage == "garble the certificate":
        made.cert_path.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    elif damage == "garble the key":
        made.key_path.write_bytes(b"\xff\xfe not a key")
    elif damage == "empty key":
        made.key_path.write_bytes(b"")
    elif damage == "another identity's key":
        made.key_path.write_bytes(other.key_path.read_bytes())
    else:
        made.cert_path.unlink()
        made.cert_path.mkdir()
        with pytest.raises(IsADirectoryError):  # a folder is not replaced: told
            ensure_identity(tmp_path / "data", make_here)
        return
    again = ensure_identity(tmp_path / "data", make_here)
    assert again.fingerprint not in (made.fingerprint, other.fingerprint)
    assert mode(again.key_path) == 0o600
    assert mode(again.cert_path) == 0o644
    server_context(again, other)  # the new pair is usable by OpenSSL


def test_load_identity_without_the_key_or_with_a_bad_certificate(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    made.key_path.unlink()
    assert load_identity(tmp_path) is None
    ensure_identity(tmp_path, make_here).cert_path.write_text("no certificate here")
    assert load_identity(tmp_path) is None


def test_leftovers_of_a_killed_write_are_removed(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    leftover = made.key_path.parent / ".key.pem.abc123.tmp"
    leftover.write_bytes(b"half a key")
    assert ensure_identity(tmp_path, make_here) == made
    assert not leftover.exists()


def test_the_certificate(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    cert = x509.load_der_x509_certificate(made.der)
    assert isinstance(cert.public_key(), ed25519.Ed25519PublicKey)
    assert cert.subject == cert.issuer
    assert cert.subject.rfc4514_string() == "CN=sluice"
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca is False
    key_id = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert key_id == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    authority = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert authority.key_identifier == key_id.digest
    assert authority.authority_cert_issuer is None
    assert len(cert.extensions) == 3
    now = datetime.datetime.now(datetime.UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    assert abs((now - start) - datetime.timedelta(days=1)) < datetime.timedelta(minutes=5)
    assert end - now > datetime.timedelta(days=36524)
    cert.verify_directly_issued_by(cert)  # self-signed
    assert made.key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")


def test_no_repr_shows_the_key(tmp_path: Path) -> None:
    made = ensure_identity(tmp_path, make_here)
    key = made.key_path.read_text()
    body = "".join(key.splitlines()[1:-1])
    text = repr(made) + str(made)
    assert body[:16] not in text
    assert "PRIVATE" not in text
    assert made.fingerprint in text
    assert repr(made.der) not in text  # nor the (long) DER


# ----------------------------------------------------------------------- the handshake


def server_context(server: Identity, *peers: Identity) -> ssl.SSLContext:
    """What the node listener does: TLS 1.3 only, its certificate, a client certificate
    asked for (CERT_OPTIONAL) and checked against the paired peers' certificates only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(server.cert_path, server.key_path)
    context.verify_mode = ssl.CERT_OPTIONAL
    for peer in peers:
        context.load_verify_locations(cadata=peer.der)
    return context


def client_context(client: Identity | None,
                   maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """What a pinned link does: its own certificate, no CA check (the pin is checked after
    the handshake)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if client is not None:
        context.load_cert_chain(client.cert_path, client.key_path)
    if maximum is not None:
        context.maximum_version = maximum
    return context


class Side:
    """One end's outcome: the peer's certificate and what it read, or the error."""

    def __init__(self) -> None:
        self.handshake = False
        self.peer: bytes | None = None
        self.version: str | None = None
        self.read = b""
        self.error: BaseException | None = None


async def connect(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                  first: bytes | None = None) -> tuple[Side, Side]:
    """A handshake over a socket pair; the server says ``hi`` and closes. ``first``: raw
    bytes the client sends instead of a TLS handshake."""
    left, right = trio.socket.socketpair()
    server_end, client_end = trio.SocketStream(left), trio.SocketStream(right)
    server_tls = trio.SSLStream(server_end, server_ctx, server_side=True)
    client_tls = trio.SSLStream(client_end, client_ctx)
    server, client = Side(), Side()

    async def serve() -> None:
        try:
            await server_tls.do_handshake()
            server.handshake = True
            server.peer = server_tls.getpeercert(binary_form=True)
            server.version = server_tls.version()
            await server_tls.send_all(b"hi")
        except trio.BrokenResourceError as exc:
            server.error = exc.__cause__
        finally:
            await server_end.aclose()

    async def call() -> None:
        try:
            if first is not None:
                await client_end.send_all(first)
                client.read = await client_end.receive_some(100)
                return
            await client_tls.do_handshake()
            client.handshake = True
            client.peer = client_tls.getpeercert(binary_form=True)
            client.version = client_tls.version()
            client.read = await client_tls.receive_some(10)
        except trio.BrokenResourceError as exc:
            client.error = exc.__cause__
        finally:
            await client_end.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(call)
    return server, client


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[Identity, Identity, Identity]:
    """The listener's, a paired peer's and a stranger's identities."""
    b, a, x = (ensure_identity(tmp_path / name, make_here) for name in "bax")
    return b, a, x


async def test_a_pinned_peer_completes_a_tls13_handshake(
        nodes: tuple[Identity, Identity, Identity]) -> None:
    b, a, _ = nodes
    server, client = await connect(server_context(b, a), client_context(a))
    assert server.error is None
    assert client.error is None
    assert server.version == client.version == "TLSv1.3"
    assert server.peer is not None
    assert client.peer is not None
    assert fingerprint_of(server.peer) == a.fingerprint  # the server sees the client's
    assert fingerprint_of(client.peer) == b.fingerprint  # and the client the server's
    assert pin_matches(client.peer, b.fingerprint)
    assert client.read == b"hi"


async def test_several_peers_in_the_verify_store(
        nodes: tuple[Identity, Identity, Identity], tmp_path: Path) -> None:
    # All are named CN=sluice: the key identifiers are what tells them apart.
    b, a, x = nodes
    peers = [a, x, *(ensure_identity(tmp_path / f"peer{n}", make_here) for n in range(3))]
    stranger = ensure_identity(tmp_path / "stranger", make_here)
    context = server_context(b, *peers)
    for peer in peers:
        server, client = await connect(context, client_context(peer))
        assert server.peer is not None
        assert fingerprint_of(server.peer) == peer.fingerprint
        assert client.read == b"hi"
    server, client = await connect(context, client_context(stranger))
    assert isinstance(server.error, ssl.SSLCertVerificationError)


async def test_an_unknown_certificate_is_refused_at_the_handshake(
        nodes: tuple[Identity, Identity, Identity]) -> None:
    b, a, x = nodes
    server, client = await connect(server_context(b, a), client_context(x))
    assert not server.handshake
    assert server.peer is None
    assert isinstance(server.error, ssl.SSLCertVerificationError)
    # TLS 1.3: the client's handshake is over before the server has checked its
    # certificate; the refusal reaches it at its first read (as the connection closing).
    assert client.handshake
    assert isinstance(client.error, ssl.SSLError)
    assert client.read == b""


async def test_no_client_certificate_is_let_through(
        nodes: tuple[Identity, Identity, Identity]) -> None:
    b, a, _ = nodes
    server, client = await connect(server_context(b, a), client_context(None))
    assert server.handshake
    assert server.error is None
    assert server.peer is None  # the listener then allows only the pairing exchange
    assert client.peer is not None
    assert fingerprint_of(client.peer) == b.fingerprint
    assert client.read == b"hi"


async def test_tls12_is_refused(nodes: tuple[Identity, Identity, Identity]) -> None:
    b, a, _ = nodes
    server, client = await connect(server_context(b, a),
                                   client_context(a, ssl.TLSVersion.TLSv1_2))
    assert not server.handshake
    assert not client.handshake
    assert isinstance(server.error, ssl.SSLError)
    assert "UNSUPPORTED_PROTOCOL" in str(server.error)
    assert isinstance(client.error, ssl.SSLError)


async def test_plain_http_is_refused(nodes: tuple[Identity, Identity, Identity]) -> None:
    b, a, _ = nodes
    server, client = await connect(server_context(b, a), client_context(a),
                                   first=b"GET /health HTTP/1.1\r\nHost: b\r\n\r\n")
    assert not server.handshake
    assert isinstance(server.error, ssl.SSLError)
    assert b"HTTP" not in client.read  # nothing is served


async def test_a_certificate_a_paired_peer_signed_is_refused(
        nodes: tuple[Identity, Identity, Identity], tmp_path: Path) -> None:
    """CA:false: a paired peer cannot mint certificates that chain to its pin."""
    b, a, _ = nodes
    peer_key = serialization.load_pem_private_key(a.key_path.read_bytes(), None)
    assert isinstance(peer_key, ed25519.Ed25519PrivateKey)
    peer_cert = x509.load_der_x509_certificate(a.der)
    child_key = ed25519.Ed25519PrivateKey.generate()
    now = datetime.datetime.now(datetime.UTC)
    child = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "child")]))
        .issuer_name(peer_cert.subject)
        .public_key(child_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            peer_key.public_key()), critical=False)
        .sign(peer_key, None)
    )
    folder = tmp_path / "child" / "identity"
    folder.mkdir(parents=True)
    (folder / "cert.pem").write_bytes(child.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(child_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    minted = load_identity(tmp_path / "child")
    assert minted is not None
    server, _ = await connect(server_context(b, a), client_context(minted))
    assert isinstance(server.error, ssl.SSLCertVerificationError)
    assert "invalid CA certificate" in str(server.error)


