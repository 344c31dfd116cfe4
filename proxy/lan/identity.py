"""This gateway's identity (SPEC §16): an Ed25519 key and a self-signed certificate in the
data dir, ``identity/key.pem`` (0600) and ``identity/cert.pem`` (0644) in a folder of its own
(0700). The identity shown everywhere is the certificate's pin
(:func:`protocol.lan.pinning.fingerprint_of`).

Reading needs only the standard library (:func:`load_identity`; ``ssl`` checks that the key
is the certificate's). Making them (:func:`ensure_identity`, when a file is missing or
unreadable) imports ``cryptography``, inside the function: importing this module does not.

The key is never read into a value of this module: no ``repr()``, log line or error can show
it. Errors name the file, never its content.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

import attrs

from protocol.lan.pinning import fingerprint_of
from proxy.files import atomic_write, remove_leftovers

__all__ = [
    "CERT_FILE",
    "IDENTITY_DIR",
    "KEY_FILE",
    "Identity",
    "ensure_identity",
    "load_identity",
]

IDENTITY_DIR = "identity"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
DIR_MODE = 0o700
KEY_MODE = 0o600
CERT_MODE = 0o644
COMMON_NAME = "sluice"
VALID_BEFORE_DAYS = 1  # not_valid_before = now - 1 day: a peer whose clock is behind
VALID_DAYS = 36525  # 100 years: a pin is for good; a new identity needs a new pairing


@attrs.frozen
class Identity:
    """Where the certificate and key are, the certificate's DER and its pin."""

    cert_path: Path
    key_path: Path
    der: bytes = attrs.field(repr=False)
    fingerprint: str


def _paths(data_dir: Path) -> tuple[Path, Path]:
    folder = data_dir / IDENTITY_DIR
    return folder / CERT_FILE, folder / KEY_FILE


def _read_der(cert_path: Path) -> bytes | None:
    """The certificate's DER from its PEM; None when missing or not a PEM certificate."""
    try:
        text = cert_path.read_text(encoding="ascii")
        return ssl.PEM_cert_to_DER_cert(text)
    except (OSError, ValueError):  # missing, unreadable, not ASCII, not PEM, not base64
        return None


def load_identity(data_dir: Path) -> Identity | None:
    """The identity in ``data_dir`` as it is on disk (standard library only); None when the
    certificate is missing or not a PEM certificate, or the key file is missing."""
    cert_path, key_path = _paths(data_dir)
    der = _read_der(cert_path)
    if der is None or not key_path.is_file():
        return None
    return Identity(cert_path, key_path, der, fingerprint_of(der))


def _usable(identity: Identity) -> bool:
    """Whether OpenSSL takes the pair as a TLS identity: the certificate parses, the key
    parses and is the certificate's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(identity.cert_path, identity.key_path)
    except (OSError, ssl.SSLError, ValueError):  # never shown: the message may quote the key
        return False
    return True


def _tighten(path: Path, mode: int) -> None:
    """Take away what ``mode`` does not allow (a folder or key someone opened up)."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)


def ensure_identity(data_dir: Path) -> Identity:
    """The identity in ``data_dir``, made first when either file is missing or the pair is
    unusable (both are made anew then). Raises OSError when the folder cannot be written."""
    folder = data_dir / IDENTITY_DIR
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _tighten(folder, DIR_MODE)
    cert_path, key_path = _paths(data_dir)
    for path in (key_path, cert_path):  # what a killed write left (a key's is 0600 too)
        remove_leftovers(path)
    found = load_identity(data_dir)
    if found is not None and _usable(found):
        _tighten(found.key_path, KEY_MODE)
        return found
    key_pem, cert_pem = _make()
    # The key first: a crash between the two leaves a certificate that is not the key's,
    # which _usable refuses next time, so both are made again.
    atomic_write(key_path, key_pem, KEY_MODE)  # a 0600 temp file (mkstemp), then renamed
    atomic_write(cert_path, cert_pem, CERT_MODE)
    made = load_identity(data_dir)
    if made is None:
        raise OSError(f"{cert_path}: the certificate just written cannot be read back")
    return made


def _make() -> tuple[bytes, bytes]:
    """A new Ed25519 key (PKCS #8 PEM) and its self-signed certificate (PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID

    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    key_id = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=VALID_BEFORE_DAYS))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        # CA:false (critical). OpenSSL 3.0 takes this self-signed certificate as its own
        # trust anchor when loaded as a verify location (cadata), and refuses a certificate
        # that the peer's key signed to chain to it ("invalid CA certificate"): with CA:true
        # a paired peer could mint certificates that pass the handshake under its pin.
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Every gateway's certificate is named CN=sluice: OpenSSL finds a certificate's
        # issuer in the verify store by name and, among several of that name, by key id.
        # Without these two, only the first paired peer loaded would pass the handshake.
        .add_extension(key_id, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(key_id),
                       critical=False)
        .sign(key, None)  # Ed25519 signs without a separate hash
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)
