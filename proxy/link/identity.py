"""This gateway's identity (SPEC §16): an Ed25519 key and a self-signed certificate in the
data dir, ``identity/key.pem`` (0600) and ``identity/cert.pem`` (0644) in a folder of its own
(0700). The identity shown everywhere is the certificate's pin
(:func:`protocol.lan.pinning.fingerprint_of`).

Reading needs only the standard library (:func:`load_identity`; ``ssl`` checks that the key
is the certificate's). Making them (:func:`ensure_identity`, when a file is missing or
unreadable) takes ``cryptography`` (:mod:`proxy.link.identity_make`), in a child process by
default, so that no gateway keeps it loaded; importing this module does not import it.

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
from proxy.link.identity_make import Maker, make_in_child

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


def ensure_identity(data_dir: Path, make: Maker = make_in_child) -> Identity:
    """The identity in ``data_dir``, made first when either file is missing or the pair is
    unusable (both are made anew then) by ``make``: by default in a short child process, so
    the gateway never holds ``cryptography`` (SPEC §16; issue 39: +11 MB RSS for the life of
    a first start otherwise). Raises OSError when the folder cannot be written or the key
    cannot be made."""
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
    key_pem, cert_pem = make()
    # The key first: a crash between the two leaves a certificate that is not the key's,
    # which _usable refuses next time, so both are made again.
    atomic_write(key_path, key_pem, KEY_MODE)  # a 0600 temp file (mkstemp), then renamed
    atomic_write(cert_path, cert_pem, CERT_MODE)
    made = load_identity(data_dir)
    if made is None:
        raise OSError(f"{cert_path}: the certificate just written cannot be read back")
    return made
