"""The identity made by its child process (proxy/link/identity_make.py, the default maker of
``ensure_identity``): made once and then reused, and a maker that fails or cannot run is an
OSError with nothing half-written. Everything else about the identity, made in process
(``make_here``): tests/test_identity.py."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest

from protocol.lan.pinning import fingerprint_of
from proxy.link.identity import ensure_identity, load_identity


def signature(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_made_once_then_reused(tmp_path: Path) -> None:
    assert load_identity(tmp_path) is None
    made = ensure_identity(tmp_path)
    assert made.cert_path == tmp_path / "identity" / "cert.pem"
    assert made.key_path == tmp_path / "identity" / "key.pem"
    assert made.fingerprint == fingerprint_of(made.der)
    assert made.der == ssl.PEM_cert_to_DER_cert(made.cert_path.read_text())
    before = signature(made.cert_path), signature(made.key_path)
    assert ensure_identity(tmp_path) == made
    assert load_identity(tmp_path) == made
    assert (signature(made.cert_path), signature(made.key_path)) == before
    assert sorted(p.name for p in made.cert_path.parent.iterdir()) == ["cert.pem", "key.pem"]


def test_a_maker_that_fails_is_an_oserror(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The child that makes the identity (proxy.link.identity_make) cannot run, or dies:
    an OSError (serve then runs without pinned links), and nothing half-written."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(OSError, match="the identity maker failed"):
        ensure_identity(tmp_path)
    assert load_identity(tmp_path) is None
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(OSError, match="cannot run the identity maker"):
        ensure_identity(tmp_path)
    assert not (tmp_path / "identity" / "key.pem").exists()

