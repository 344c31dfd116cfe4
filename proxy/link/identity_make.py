"""Making this gateway's identity (SPEC §16): a new Ed25519 key and its self-signed
certificate, both PEM. The only module that imports ``cryptography`` for it, inside
:func:`make_here`; :func:`make_in_child` runs that in a short child process
(``python -m proxy.link.identity_make``, the two PEMs back on its stdout, a pipe between
the two processes), so the gateway that asked never has ``cryptography`` loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

Maker = Callable[[], tuple[bytes, bytes]]
"""Makes a key and its certificate: (key PEM, certificate PEM)."""

COMMON_NAME = "sluice"
VALID_BEFORE_DAYS = 1  # not_valid_before = now - 1 day: a peer whose clock is behind
VALID_DAYS = 36525  # 100 years: a pin is for good; a new identity needs a new pairing
CHILD_TIMEOUT = 60.0  # seconds for the child to start, import and sign (about 0.3 s here)


def make_in_child() -> tuple[bytes, bytes]:
    """:func:`make_here` in a child process. Raises OSError when it fails (the reason is
    the child's last line on stderr; the key never passes through stderr)."""
    try:
        done = subprocess.run([sys.executable, "-m", "proxy.link.identity_make"],
                              stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=CHILD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(f"cannot run the identity maker: {exc}") from None
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OSError(f"the identity maker failed: {lines[-1] if lines else done.returncode}")
    try:
        made = json.loads(done.stdout)
        return made["key"].encode("ascii"), made["cert"].encode("ascii")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise OSError("the identity maker answered something else than a key and a "
                      "certificate") from None


def make_here() -> tuple[bytes, bytes]:
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


def main() -> None:
    """The child: one key and certificate, as JSON on stdout."""
    key_pem, cert_pem = make_here()
    sys.stdout.write(json.dumps({"key": key_pem.decode("ascii"),
                                 "cert": cert_pem.decode("ascii")}))


if __name__ == "__main__":
    main()
