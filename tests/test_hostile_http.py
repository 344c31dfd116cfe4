"""Hostile HTTP at the client edge (SPEC §6.1, RFC 9112), raw bytes over TCP and the Unix
socket: request smuggling, Content-Length and Transfer-Encoding tricks, malformed chunked
bodies, header syntax, Host, versions, pipelined garbage, WebSocket upgrades. Every case
checks the status, the close, what reached the upstream, the log, a bystander client and a
health check afterwards (tests/hostile.py). The plainer framing and limit cases live in
tests/test_http_hygiene.py."""

from __future__ import annotations

import pytest

from tests.conftest import StartGateway
from tests.fakeupstream import FakeUpstream
from tests.figures import Figures
from tests.hostile import (
    CHAT,
    MAX_BODY,
    SMUGGLED,
    Bystander,
    assert_refusal,
    check_aftermath,
    chunked,
    send_hostile,
    serve_everything,
)
from tests.rawhttp import assert_openai_error, chat_head

CL = b"Content-Length: %d\r\n" % len(CHAT)
TE = b"Transfer-Encoding: chunked\r\n"


def te(value: bytes, body: bytes = CHAT) -> bytes:
    """A chat request whose Transfer-Encoding is ``value``, its body chunked."""
    return chat_head(b"Transfer-Encoding: " + value + b"\r\n\r\n" + chunked(body))


def with_header(line: bytes) -> bytes:
    """A valid chat request with one more header line, exactly as given."""
    return chat_head(line + b"\r\n" + CL + b"\r\n" + CHAT)


# (request bytes, status); every refusal closes the connection and forwards nothing.
REFUSED: dict[str, tuple[bytes, int]] = {
    # Smuggling: a second request hidden where one parser would see a body.
    "cl-te": (chat_head(b"Content-Length: %d\r\n" % len(b"0\r\n\r\n" + SMUGGLED) + TE
                        + b"\r\n0\r\n\r\n" + SMUGGLED), 400),
    "te-cl": (chat_head(TE + b"Content-Length: 4\r\n\r\n" + b"%x\r\n%b\r\n0\r\n\r\n"
                        % (len(SMUGGLED), SMUGGLED)), 400),
    "te-cl-obfuscated": (chat_head(b"Transfer-Encoding: xchunked\r\n" + CL + b"\r\n"
                                   + CHAT + SMUGGLED), 400),
    "te-space-colon-cl": (chat_head(b"Transfer-Encoding : chunked\r\n" + CL + b"\r\n"
                                    + chunked(CHAT) + SMUGGLED), 400),
    "cl-te-http10": (b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\n"
                     + CL + TE + b"\r\n" + chunked(CHAT) + SMUGGLED, 400),
    "te-http10": (b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\n"
                  + TE + b"\r\n" + chunked(CHAT) + SMUGGLED, 400),
    # Content-Length.
    "cl-plus": (chat_head(b"Content-Length: +%d\r\n\r\n" % len(CHAT) + CHAT), 400),
    "cl-hex": (chat_head(b"Content-Length: 0x%x\r\n\r\n" % len(CHAT) + CHAT), 400),
    "cl-negative": (chat_head(b"Content-Length: -1\r\n\r\n" + CHAT), 400),
    "cl-empty": (chat_head(b"Content-Length: \r\n\r\n" + CHAT), 400),
    "cl-inner-space": (chat_head(b"Content-Length: 1 0\r\n\r\n" + CHAT), 400),
    "cl-dup-conflict-smuggle": (chat_head(CL + b"Content-Length: %d\r\n\r\n"
                                          % (len(CHAT) + len(SMUGGLED)) + CHAT + SMUGGLED),
                                400),
    "cl-huge": (chat_head(b"Content-Length: " + b"9" * 19 + b"\r\n\r\n" + CHAT), 413),
    "cl-beyond-20-digits": (chat_head(b"Content-Length: " + b"9" * 40 + b"\r\n\r\n" + CHAT),
                            400),
    "cl-over-limit": (chat_head(b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)), 413),
    # Transfer-Encoding obfuscation.
    "te-chunked-identity": (te(b"chunked, identity"), 400),
    "te-identity-chunked": (te(b"identity, chunked"), 400),
    "te-gzip-chunked": (te(b"gzip, chunked"), 400),
    "te-xchunked": (te(b"xchunked"), 400),
    "te-chunked-comma": (te(b"chunked,"), 400),
    "te-quoted": (te(b'"chunked"'), 400),
    "te-identity": (te(b"identity"), 400),
    "te-empty": (te(b""), 400),
    "te-vertical-tab": (te(b"\x0bchunked"), 400),
    "te-two-headers": (chat_head(TE + TE + b"\r\n" + chunked(CHAT)), 400),
    # Malformed chunked bodies.
    "chunk-size-negative": (chat_head(TE + b"\r\n-5\r\nhello\r\n0\r\n\r\n"), 400),
    "chunk-size-0x": (chat_head(TE + b"\r\n0x5\r\nhello\r\n0\r\n\r\n"), 400),
    "chunk-size-overflow": (chat_head(TE + b"\r\n" + b"f" * 21 + b"\r\nhello\r\n0\r\n\r\n"),
                            400),
    "chunk-size-huge": (chat_head(TE + b"\r\n" + b"f" * 16 + b"\r\n" + b"x" * (MAX_BODY + 1)),
                        413),
    "chunk-missing-crlf": (chat_head(TE + b"\r\n5\r\nhelloXX0\r\n\r\n"), 400),
    "chunk-data-too-long": (chat_head(TE + b"\r\n3\r\nhello\r\n0\r\n\r\n"), 400),
    "chunk-ext-bare-lf": (chat_head(TE + b"\r\n5;a\nb\r\nhello\r\n0\r\n\r\n"), 400),
    "chunk-bad-trailer": (chat_head(TE + b"\r\n0\r\nnot a trailer\r\n\r\n"), 400),
    "chunk-lf-only-size": (chat_head(TE + b"\r\n5\nhello\r\n0\r\n\r\n" + SMUGGLED), 400),
    # Header syntax.
    "space-before-colon": (with_header(b"X-A : b"), 400),
    "nul-in-value": (with_header(b"X-A: b\x00c"), 400),
    "nul-in-name": (with_header(b"X-\x00A: b"), 400),
    "bare-cr-in-value": (with_header(b"X-A: b\rc"), 400),
    "empty-name": (with_header(b": b"), 400),
    "non-ascii-name": (with_header(b"X-\xc3\xa9: b"), 400),
    "fold-first-line": (b"POST /v1/chat/completions HTTP/1.1\r\n folded: x\r\nHost: localhost"
                        b"\r\n" + CL + b"\r\n" + CHAT, 400),
    "request-line-double-space": (b"GET  /health HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
    "request-line-trailing-space": (b"GET /health HTTP/1.1 \r\nHost: localhost\r\n\r\n", 400),
    "request-line-tab": (b"GET\t/health HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
    "request-line-lowercase-http": (b"GET /health http/1.1\r\nHost: localhost\r\n\r\n", 400),
    "request-line-http09": (b"GET /health\r\n\r\n", 400),
    "target-control-byte": (b"GET /he\x7flth HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
    "target-over-16k": (b"GET /" + b"a" * (17 * 1024) + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
                        431),
    # Host.
    "http11-without-host": (b"GET /health HTTP/1.1\r\n\r\n", 400),
    "two-hosts": (b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n", 400),
    # Versions.
    "http12": (b"GET /health HTTP/1.2\r\nHost: localhost\r\n\r\n", 505),
    "http20-request-line": (b"GET /health HTTP/2.0\r\nHost: localhost\r\n\r\n", 505),
    "http99": (b"GET /health HTTP/9.9\r\nHost: localhost\r\n\r\n", 505),
    "http110": (b"GET /health HTTP/1.10\r\nHost: localhost\r\n\r\n", 400),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_hostile_request_is_refused_and_closed(
    case: str, upstream: FakeUpstream, start_gateway: StartGateway, transport: str,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    data, status = REFUSED[case]
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)], max_body_size=MAX_BODY)
    bystander = await Bystander.start(gw.address(transport))
    outcome = await send_hostile(gw.address(transport), data)
    assert_refusal(outcome, status)
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures)
    assert upstream.requests_to("/v1/chat/completions") == []


# Unusual but valid (RFC 9110/9112 let a recipient accept them): answered, and what reaches
# the upstream is the decoded body with clean framing.
ACCEPTED: dict[str, bytes] = {
    "cl-duplicate-same": chat_head(CL + CL + b"\r\n" + CHAT),
    "cl-list-same": chat_head(b"Content-Length: %d, %d\r\n\r\n" % (len(CHAT), len(CHAT)) + CHAT),
    "cl-leading-zeros": chat_head(b"Content-Length: 000%d\r\n\r\n" % len(CHAT) + CHAT),
    "te-capitalised": te(b"Chunked"),
    "te-leading-space": te(b"   chunked"),
    "te-trailing-tab": te(b"chunked\t"),
    "chunk-ext-junk": chat_head(TE + b"\r\n%x;\x01junk=\"x\r\n%b\r\n0\r\n\r\n"
                                % (len(CHAT), CHAT)),
    "chunk-size-bws": chat_head(TE + b"\r\n%x \r\n%b\r\n0\r\n\r\n" % (len(CHAT), CHAT)),
    "chunk-trailer-te": chat_head(TE + b"\r\n" + chunked(CHAT)[:-2]
                                  + b"Transfer-Encoding: chunked\r\n\r\n"),
    "many-small-chunks": chat_head(TE + b"\r\n" + b"".join(b"1\r\n%c\r\n" % c for c in CHAT)
                                   + b"0\r\n\r\n"),
    "obs-fold": with_header(b"X-Folded: a\r\n b"),
    "lf-only-lines": (b"POST /v1/chat/completions HTTP/1.1\nHost: localhost\n"
                      b"Content-Length: %d\n\n" % len(CHAT) + CHAT),
    "obs-text-value": with_header(b"X-A: caf\xc3\xa9"),
    "upgrade-h2c": with_header(b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
                               b"Connection: Upgrade, HTTP2-Settings"),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
async def test_odd_but_valid_request_is_relayed_cleanly(
    case: str, upstream: FakeUpstream, start_gateway: StartGateway, transport: str,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)], max_body_size=MAX_BODY)
    bystander = await Bystander.start(gw.address(transport))
    outcome = await send_hostile(gw.address(transport), ACCEPTED[case],
                                 until_close=False)
    assert outcome.first.status == 200, outcome.first
    (req,) = upstream.requests_to("/v1/chat/completions")
    assert req.body == CHAT
    assert req.header("content-length") == str(len(CHAT))
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures, forwarded=1)


async def test_host_rules_over_tcp(upstream: FakeUpstream, start_gateway: StartGateway,
                                   caplog: pytest.LogCaptureFixture, figures: Figures) -> None:
    """HTTP/1.0 without Host passes the rebinding guard; a foreign or empty Host does not."""
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    bystander = await Bystander.start(gw.tcp)
    ok = await send_hostile(gw.tcp, b"POST /v1/chat/completions HTTP/1.0\r\n" + CL + b"\r\n"
                            + CHAT)
    assert ok.first.status == 200, ok.first
    assert ok.closed
    for head in (b"GET /health HTTP/1.0\r\nHost: evil.example\r\n\r\n",
                 b"GET /health HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
                 chat_head(CL + b"Connection: close\r\n\r\n" + CHAT, host=b"evil.example")):
        refused = await send_hostile(gw.tcp, head)
        assert refused.first.status == 403, (head, refused.first)
        assert_openai_error(refused.first.body, "forbidden_host")
    await check_aftermath(gw, upstream, "tcp", bystander, caplog, figures, forwarded=1,
                          tried=4)


async def test_pipelined_garbage_after_a_request(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """The requests before the garbage are answered in order, then 400 and close; nothing
    after the garbage is read."""
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    bystander = await Bystander.start(gw.address(transport))
    good = chat_head(CL + b"\r\n" + CHAT)
    outcome = await send_hostile(gw.address(transport),
                                 good + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
                                 + b"\x16\x03\x01garbage\r\n\r\n" + SMUGGLED, answers=3)
    assert [r.status for r in outcome.responses] == [200, 200, 400], outcome.responses
    assert_openai_error(outcome.responses[2].body, "bad_http_request")
    assert outcome.responses[2].header("connection") == "close"
    assert outcome.closed
    assert outcome.rest == b""
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures, forwarded=1)


async def test_http2_preface_and_tls_hello(upstream: FakeUpstream, start_gateway: StartGateway,
                                           transport: str, caplog: pytest.LogCaptureFixture,
                                           figures: Figures) -> None:
    """The HTTP/2 preface (with a SETTINGS frame after it) and a TLS ClientHello: 505 or
    400, or a plain close; never anything forwarded."""
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    bystander = await Bystander.start(gw.address(transport))
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    hello = b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)) + b"\r\n\r\n"
    for data, status in ((preface, 505), (hello, 400)):
        outcome = await send_hostile(gw.address(transport), data)
        assert outcome.closed
        if outcome.responses:
            assert_refusal(outcome, status)
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures, tried=2)


@pytest.mark.parametrize("target", ["chat", "health"])
async def test_websocket_upgrade_is_never_switched(
    target: str, upstream: FakeUpstream, start_gateway: StartGateway, transport: str,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """``Upgrade: websocket`` is answered as plain HTTP (never 101), forwarded without the
    Upgrade header, and the connection closes after the answer: what follows may be frames."""
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    bystander = await Bystander.start(gw.address(transport))
    upgrade = (b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
    if target == "chat":
        data = chat_head(upgrade + CL + b"\r\n" + CHAT)
    else:
        data = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + upgrade + b"\r\n"
    frame = b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"  # a masked "Hello" text frame
    outcome = await send_hostile(gw.address(transport), data + frame + SMUGGLED, answers=2)
    assert [r.status for r in outcome.responses] == [200], outcome.responses
    resp = outcome.first
    assert resp.header("upgrade") is None
    assert resp.header("connection") == "close"
    assert outcome.closed
    assert outcome.rest == b""
    forwarded = upstream.requests_to("/v1/chat/completions")
    assert len(forwarded) == (1 if target == "chat" else 0)
    for req in forwarded:
        assert req.header("upgrade") is None
        assert req.body == CHAT
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures,
                          forwarded=len(forwarded))


async def test_head_answers_carry_no_body(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """A HEAD answer has no body, whatever it says its length is: the request pipelined
    after it is read from the right place (no response desync)."""
    serve_everything(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    bystander = await Bystander.start(gw.address(transport))
    data = b""
    for path in (b"/health", b"/v1/models", b"/nope", b"/v1/chat/completions"):
        data += b"HEAD " + path + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
    data += b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    outcome = await send_hostile(gw.address(transport), data, answers=5, head_only=4)
    statuses = [r.status for r in outcome.responses]
    assert len(statuses) == 5, outcome.responses
    assert statuses[-1] == 200, outcome.responses
    assert outcome.responses[-1].body == b'{"status":"ok","identity":null,"nodePort":null}'
    assert all(r.body == b"" for r in outcome.responses[:4])
    assert outcome.closed
    assert outcome.rest == b""
    await check_aftermath(gw, upstream, transport, bystander, caplog, figures, tried=4)
