"""The node port's TLS versions tried with ``openssl s_client`` (the rest of the node
listener: tests/test_node_listener.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import trio

from tests import test_node_listener as quick
from tests.test_node_listener import (
    Node,
)

loopback_only = quick.loopback_only  # its fixture
node = quick.node  # its fixture


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl binary")
async def test_openssl_s_client(node: Node) -> None:
    """What another TLS stack sees: TLS 1.2 refused; TLS 1.3 without a certificate served
    the unpaired answer only."""
    connect = ["openssl", "s_client", "-connect", f"127.0.0.1:{node.port}", "-quiet"]
    with trio.fail_after(30):
        old = await trio.run_process([*connect, "-tls1_2"], stdin=b"", capture_stdout=True,
                                     capture_stderr=True, check=False)
        asked = (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 b"Authorization: Bearer " + node.key.encode() + b"\r\n\r\n")
        new = await trio.run_process([*connect, "-tls1_3"], stdin=asked, capture_stdout=True,
                                     capture_stderr=subprocess.STDOUT, check=False)
    assert old.returncode != 0
    assert b"HTTP/1.1" not in old.stdout
    assert new.stdout.startswith(b"HTTP/1.1 401 "), new.stdout[:300]
    assert b"unpaired_certificate" in new.stdout

