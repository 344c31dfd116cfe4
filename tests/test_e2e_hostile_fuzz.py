"""Fuzzing the request head and body (hypothesis) against one real gateway process: request
lines, header lists with random names and values (invalid bytes included), random framing
and bodies, sometimes a pipelined request after them. Whatever arrives, the gateway answers
with a parseable status line or closes the connection: it never hangs, never logs a
traceback or an ERROR, and keeps answering ``/health``.

Each example goes over a plain blocking socket with timeouts (TCP or the Unix socket). A
request the gateway is still waiting on (an unfinished body, say) gets a short grace, then
the client half-closes, and the gateway must close in turn.

The default run tries ``DEFAULT_EXAMPLES`` per transport. The long run (10,000 per
transport, ``@pytest.mark.slow``) is opt-in because other slow-marked tests run by default:
``scripts/soak`` runs it (or ``SLUICE_FUZZ_EXAMPLES=10000 scripts/test
tests/test_e2e_hostile_fuzz.py -k long``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.figures import Figures
from tests.gateways import GatewayProcess

DEFAULT_EXAMPLES = 300
LONG_EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "0"))
GRACE = 0.25  # seconds an unanswered example waits before the client half-closes
CLOSE_TIMEOUT = 5.0  # after the half-close, the gateway must have closed within this
STATUS_LINE = re.compile(rb"HTTP/1\.[01] [1-5][0-9]{2} ")

METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"HEAD", b"PATCH", b"CONNECT",
           b"TRACE", b"PRI", b"get", b"FOO"]
TARGETS = [b"/health", b"/v1/chat/completions", b"/v1/models", b"/v1/embeddings",
           b"/api/v1/status", b"/api/v1/settings", b"/admin/x", b"*", b"/",
           b"http://localhost/v1/chat/completions", b"/v1/chat/completions?x=%00"]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"HTTP/0.9", b"http/1.1",
            b"HTTP/1.1 ", b""]
NAMES = [b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Upgrade",
         b"Expect", b"Origin", b"Authorization", b"Content-Type", b"TE", b"Trailer",
         b"Keep-Alive", b"Proxy-Connection", b"X-Sluice-Forwarded", b"X-A"]
VALUES = [b"localhost", b"evil.example", b"chunked", b"Chunked", b"chunked, identity",
          b"gzip, chunked", b"0", b"5", b"5, 5", b"-1", b"+5", b"0x5", b"9" * 25, b"close",
          b"keep-alive", b"Upgrade", b"websocket", b"100-continue", b"application/json",
          b"Bearer x", b"http://evil.example", b""]
EOLS = [b"\r\n", b"\n", b"\r"]
BODIES = [b"", b'{"model":"fake-model","messages":[]}', b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n",
          b"zz\r\n", b"{\"model\":", b"\x00" * 8]


@functools.cache
def blob(max_size: int) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, leaning to the ones HTTP cares about. Each strategy here is built
    once and drawn from many times: built anew at each draw, they cost three times the CPU
    of the examples they draw."""
    special = st.sampled_from(list(b"\r\n\t :;,\x00\x7f\x80\xff\"=") + list(range(32, 127)))
    return st.one_of(st.binary(max_size=max_size),
                     st.lists(special, max_size=max_size).map(bytes))


@functools.cache
def pick(choices: tuple[bytes, ...]) -> st.SearchStrategy[bytes]:
    return st.sampled_from(choices)


def mostly(draw: st.DrawFn, choices: Sequence[bytes], noise: st.SearchStrategy[bytes],
           odds: int = 5) -> bytes:
    """One of ``choices``, else (once in ``odds``) ``noise``; a known choice is the minimal
    example, so shrinking ends on the smallest hostile part."""
    if draw(st.integers(1, odds)) < odds:
        return draw(pick(tuple(choices)))
    return draw(noise)


@st.composite
def hostile_requests(draw: st.DrawFn) -> bytes:
    method = mostly(draw, METHODS, blob(8))
    target = mostly(draw, TARGETS, blob(30))
    version = mostly(draw, [b"HTTP/1.1"] * 4 + VERSIONS, blob(10))
    sep = b" " if draw(st.integers(0, 9)) < 9 else draw(pick((b"  ", b"\t", b"")))
    eol = draw(pick(tuple(EOLS))) if draw(st.integers(0, 9)) == 9 else b"\r\n"
    headers: list[bytes] = []
    if draw(st.integers(0, 9)) < 9:  # the minimal example is a sane one
        headers.append(b"Host: localhost")
    for _ in range(draw(st.integers(0, 6))):
        name = mostly(draw, NAMES, blob(12), odds=10)
        value = mostly(draw, VALUES, blob(40), odds=10)
        colon = mostly(draw, [b": ", b":", b":\t"], st.just(b" : "), odds=20)
        headers.append(name + colon + value)
        if draw(st.integers(0, 9)) == 9:
            headers.append(b" folded" + draw(blob(10)))  # obs-fold
    body = mostly(draw, BODIES, blob(300))
    head = method + sep + target + sep + version + eol + b"".join(h + eol for h in headers)
    data = head + eol + body
    if draw(st.integers(0, 4)) == 4:  # a pipelined request after it
        data += b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    return data


@pytest.fixture(scope="module")
def fuzz_gateway() -> Iterator[GatewayProcess]:
    """One real gateway for the module (no backends: routing ends in 404/503 at once)."""
    folder = Path(tempfile.mkdtemp(prefix="slf-", dir="/tmp"))
    gw = GatewayProcess(folder, "fuzz", lb=False, max_body_size=4096)
    gw.launch()
    try:
        gw.ready_sync()
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(folder, ignore_errors=True)


def open_socket(gw: GatewayProcess, via: str) -> socket.socket:
    if via == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CLOSE_TIMEOUT)
        sock.connect(str(gw.socket_path))
    else:
        assert gw.port is not None
        sock = socket.create_connection(("127.0.0.1", gw.port), timeout=CLOSE_TIMEOUT)
    return sock


def send_example(gw: GatewayProcess, via: str, data: bytes) -> bytes:
    """Send ``data``; returns what the gateway answered before it closed (or, when it keeps
    the connection open after answering, the first bytes of its answer). AssertionError if
    it neither answers nor closes."""
    sock = open_socket(gw, via)
    try:
        try:
            sock.sendall(data)
        except OSError:  # the gateway refused early and reset: it closed
            return b""
        sock.settimeout(GRACE)
        got = b""
        try:
            got = sock.recv(65536)
            if not got:
                return b""  # closed without an answer
        except TimeoutError:  # still waiting for more of the request: end our side
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # reset: closed
        sock.settimeout(CLOSE_TIMEOUT)
        while b"\r\n" not in got:
            try:
                more = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no answer and no close for {data!r}") from None
            except OSError:
                break
            if not more:
                break
            got += more
        return got
    finally:
        sock.close()


def health(gw: GatewayProcess, via: str) -> bool:
    got = send_example(gw, via, b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
                                b"Connection: close\r\n\r\n")
    return got.startswith(b"HTTP/1.1 200 ")


def log_problems(gw: GatewayProcess) -> list[str]:
    return [line for line in gw.log().splitlines()
            if "Traceback" in line or " ERROR " in line or " CRITICAL " in line]


def fuzz(gw: GatewayProcess, via: str, examples: int, figures: Figures) -> None:
    tried = 0

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=hostile_requests())
    def one(data: bytes) -> None:
        nonlocal tried
        tried += 1
        got = send_example(gw, via, data)
        if got:
            assert STATUS_LINE.match(got), (data, got[:200])
        if tried % 50 == 0:
            assert health(gw, via), f"/health failed after {data!r}"

    try:
        one()
    finally:
        problems = log_problems(gw)
        healthy = health(gw, via)
        crashed = 1 if problems or not healthy else 0
        if examples > DEFAULT_EXAMPLES:  # the slow run's figures stand beside the default's
            figures.count("long_fuzz_requests_tried", tried)
            figures.count("long_fuzz_crashes", crashed)
        else:
            figures.count("bad_inputs_tried", tried)
            figures.count("crashes", crashed)
    assert not problems, "\n".join(problems[:20])
    assert healthy


@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_fuzzed_requests_are_answered_or_closed(via: str, fuzz_gateway: GatewayProcess,
                                                figures: Figures) -> None:
    fuzz(fuzz_gateway, via, DEFAULT_EXAMPLES, figures)


@pytest.mark.slow
@pytest.mark.skipif(not LONG_EXAMPLES, reason="opt-in: SLUICE_FUZZ_EXAMPLES=10000")
@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_fuzzed_requests_long(via: str, fuzz_gateway: GatewayProcess,
                              figures: Figures) -> None:
    fuzz(fuzz_gateway, via, LONG_EXAMPLES, figures)
