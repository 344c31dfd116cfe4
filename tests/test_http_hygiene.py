"""HTTP hygiene at the client edge (SPEC §6, §6.1): head and body limits, framing errors,
unsupported versions, client deadlines, max_connections, and the graceful drain.

Exact framing matters here, so most tests speak raw bytes over ``tests.client.connect``.
Deadline tests run under a jumping MockClock (all I/O is loopback inside the process)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from proxy.connection import BODY_GAP_TIMEOUT, HEAD_TIMEOUT, IDLE_TIMEOUT
from proxy.server import Gateway
from tests.client import HEALTH, Client, chat_body, connect, request
from tests.conftest import StartGateway, gateway_config, open_settings
from tests.fakeupstream import (
    FakeUpstream,
    json_completion,
    sse_events,
    sse_stream,
    stall_between_chunks,
)
from tests.rawhttp import (
    Raw,
    T,
    assert_openai_error,
    assert_refused_with_close,
    chat_head,
    exchange,
)
from tests.waits import settled


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    """The autojump clock. Tests that use it talk over Unix sockets only: loopback TCP can
    deliver a few ms late under load, and the clock could then jump past a deadline that the
    pending bytes would have met; a Unix socket's bytes are in the peer's buffer when send
    returns. pytest-trio uses any Clock fixture."""
    return trio.testing.MockClock(autojump_threshold=0)


def exists_now(path: Path) -> bool:
    """A file check without a thread. Under the autojump clock ``trio.Path`` is wrong: while
    its worker thread runs every task looks blocked, so the clock jumps past deadlines (on a
    busy machine, by minutes); a stat is instant."""
    return path.exists()


# --------------------------------------------------------------------------- head limits


async def test_incomplete_head_over_16k_is_431(upstream: FakeUpstream,
                                               start_gateway: StartGateway,
                                               transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    # No blank line: the head is still incomplete when it passes 16 KiB.
    data = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * (17 * 1024) + b"\r\n"
    await assert_refused_with_close(gw.address(transport), data, 431,
                                    "request_header_fields_too_large")


async def test_complete_head_over_16k_is_431(upstream: FakeUpstream,
                                             start_gateway: StartGateway,
                                             transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    # A complete head that arrives in one piece is just as much over the limit.
    data = (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * (17 * 1024)
            + b"\r\n\r\n")
    await assert_refused_with_close(gw.address(transport), data, 431,
                                    "request_header_fields_too_large")


async def test_more_than_100_header_lines_is_431(upstream: FakeUpstream,
                                                 start_gateway: StartGateway,
                                                 transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    addr = gw.address(transport)
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(100))  # + Host = 101 lines
    await assert_refused_with_close(
        addr, b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + lines + b"\r\n", 431,
        "request_header_fields_too_large")
    # Exactly 100 lines is within the limit.
    resp, _ = await exchange(addr, b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
                             + lines[: lines.index(b"X-H98")] + b"Connection: close\r\n\r\n")
    assert resp.status == 200, resp


# --------------------------------------------------------------------------- framing


_CHAT = chat_body()
FRAMING_CASES = {
    # A valid chat body either way it is framed: only the double framing is wrong.
    "te-and-cl": chat_head(b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"
                           % len(_CHAT) + b"%x\r\n%b\r\n0\r\n\r\n" % (len(_CHAT), _CHAT)),
    "cl-abc": chat_head(b"Content-Length: abc\r\n\r\nhello"),
    "cl-conflict": chat_head(b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    "cl-conflict-list": chat_head(b"Content-Length: 5, 6\r\n\r\nhello!"),
    "chunk-size-not-hex": chat_head(b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n"),
}


@pytest.mark.parametrize("case", list(FRAMING_CASES))
async def test_bad_framing_is_400_and_nothing_is_forwarded(
    case: str, upstream: FakeUpstream, start_gateway: StartGateway, transport: str
) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)])
    await assert_refused_with_close(gw.address(transport), FRAMING_CASES[case], 400)
    assert upstream.requests_to("/v1/chat/completions") == []


# --------------------------------------------------------------------------- versions


async def test_http2_preface_is_505_or_closed(upstream: FakeUpstream,
                                              start_gateway: StartGateway,
                                              transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    raw = await Raw.open(gw.address(transport))
    try:
        with trio.fail_after(T):
            await raw.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            data = await raw.rest()
    finally:
        await raw.aclose()
    if data:  # either a 505 then close, or just a close
        assert data.startswith(b"HTTP/1.1 505 "), data
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower()
        assert_openai_error(body, "http_version_not_supported")


async def test_http3_request_line_is_505(upstream: FakeUpstream,
                                         start_gateway: StartGateway, transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    await assert_refused_with_close(gw.address(transport),
                                    b"GET /health HTTP/3.0\r\nHost: localhost\r\n\r\n", 505,
                                    "http_version_not_supported")


# --------------------------------------------------------------------------- body limits


async def test_content_length_over_limit_is_413_before_the_body(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str
) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)], max_body_size=1024)
    # Only the head is sent: the answer must not wait for the body.
    resp = await assert_refused_with_close(
        gw.address(transport), chat_head(b"Content-Length: 2000\r\n\r\n"), 413,
        "request_too_large")
    assert resp.header("connection") == "close"
    # With Expect: 100-continue the refusal comes instead of the 100.
    resp = await assert_refused_with_close(
        gw.address(transport),
        chat_head(b"Content-Length: 2000\r\nExpect: 100-continue\r\n\r\n"), 413,
        "request_too_large")
    assert upstream.requests_to("/v1/chat/completions") == []


async def test_chunked_body_growing_over_limit_is_413(
    upstream: FakeUpstream, start_gateway: StartGateway, transport: str
) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)], max_body_size=1024)
    chunk = b"258\r\n" + b"x" * 600 + b"\r\n"  # 0x258 = 600
    # Two chunks (1200 bytes) and no terminating chunk: the limit is hit mid-body.
    await assert_refused_with_close(
        gw.address(transport), chat_head(b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 2),
        413, "request_too_large")
    assert upstream.requests_to("/v1/chat/completions") == []


async def test_expect_100_continue(upstream: FakeUpstream, start_gateway: StartGateway,
                                   transport: str) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion("yes"))
    gw = await start_gateway([("fake", upstream.url)])
    body = chat_body()
    raw = await Raw.open(gw.address(transport))
    try:
        with trio.fail_after(T):
            await raw.send(chat_head(b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                                     % len(body)))
            cont = await raw.response()
            assert cont.version == b"HTTP/1.1"
            assert cont.status == 100
            await raw.send(body)
            resp = await raw.response()
    finally:
        await raw.aclose()
    assert resp.status == 200, resp
    assert json.loads(resp.body)["choices"][0]["message"]["content"] == "yes"
    assert upstream.requests_to("/v1/chat/completions")[0].body == body


# --------------------------------------------------------------------------- Host handling


async def test_http10_without_host_over_tcp(upstream: FakeUpstream,
                                            start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    resp, rest = await exchange(gw.tcp, b"GET /health HTTP/1.0\r\n\r\n")
    assert resp.status == 200, resp
    assert json.loads(resp.body) == HEALTH
    assert rest == b""  # HTTP/1.0 without keep-alive: closed after the answer


async def test_odd_host_is_accepted_on_unix_socket(upstream: FakeUpstream,
                                                   start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(T):
            await raw.send(b"GET /health HTTP/1.1\r\nHost: :39080\r\n\r\n")
            resp = await raw.response()
            assert resp.status == 200, resp
            assert json.loads(resp.body) == HEALTH
            # Still a keep-alive connection: a second request on it is served too.
            await raw.send(b"GET /health HTTP/1.1\r\nHost: evil.example:39080\r\n\r\n")
            assert (await raw.response()).status == 200
    finally:
        await raw.aclose()


# --------------------------------------------------------------------------- deadlines


async def test_half_head_gets_408_after_head_timeout(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway
) -> None:
    gw = await start_gateway([("fake", unix_upstream.url)])
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(HEAD_TIMEOUT + 20):
            t0 = trio.current_time()
            await raw.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            resp = await raw.response()
            elapsed = trio.current_time() - t0
            rest = await raw.rest()
    finally:
        await raw.aclose()
    assert resp.status == 408, resp
    assert_openai_error(resp.body, "request_timeout")
    assert rest == b""
    assert HEAD_TIMEOUT <= elapsed < HEAD_TIMEOUT + 1


async def test_body_gap_over_30s_gets_408(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway
) -> None:
    unix_upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", unix_upstream.url)])
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(BODY_GAP_TIMEOUT + 20):
            await raw.send(chat_head(b"Content-Length: 100\r\n\r\n{\"model\":"))
            t0 = trio.current_time()
            resp = await raw.response()
            elapsed = trio.current_time() - t0
            rest = await raw.rest()
    finally:
        await raw.aclose()
    assert resp.status == 408, resp
    assert_openai_error(resp.body, "request_timeout")
    assert rest == b""
    assert BODY_GAP_TIMEOUT <= elapsed < BODY_GAP_TIMEOUT + 1
    assert unix_upstream.requests_to("/v1/chat/completions") == []


async def test_slow_body_with_short_gaps_is_accepted(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway
) -> None:
    unix_upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", unix_upstream.url)])
    body = chat_body()
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(200):
            await raw.send(chat_head(b"Content-Length: %d\r\n\r\n" % len(body)))
            for i in range(0, len(body), 20):  # every gap is under 30 s, the sum is not
                await trio.sleep(BODY_GAP_TIMEOUT - 5)
                await raw.send(body[i:i + 20])
            resp = await raw.response()
    finally:
        await raw.aclose()
    assert resp.status == 200, resp
    assert unix_upstream.requests_to("/v1/chat/completions")[0].body == body


@pytest.mark.parametrize("first_request", [True, False], ids=["after-a-request", "fresh"])
async def test_idle_connection_is_closed_after_60s(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway, first_request: bool
) -> None:
    gw = await start_gateway([("fake", unix_upstream.url)])
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(IDLE_TIMEOUT + 20):
            if first_request:
                await raw.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert (await raw.response()).status == 200
            t0 = trio.current_time()
            rest = await raw.rest()
            elapsed = trio.current_time() - t0
    finally:
        await raw.aclose()
    assert rest == b""  # a plain close, no response bytes
    assert IDLE_TIMEOUT <= elapsed < IDLE_TIMEOUT + 1


async def test_next_request_at_59s_is_served(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway
) -> None:
    gw = await start_gateway([("fake", unix_upstream.url)])
    client = await Client.open(gw.unix)
    try:
        with trio.fail_after(200):
            assert (await client.request("GET", "/health")).status == 200
            await trio.sleep(IDLE_TIMEOUT - 1)
            assert (await client.request("GET", "/health")).status == 200
            await trio.sleep(IDLE_TIMEOUT - 1)  # the idle clock restarted with that request
            assert (await client.request("GET", "/health")).status == 200
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- max_connections


async def _wait_for_connection_count(gw: Any, count: int) -> None:
    # Loopback delivery is asynchronous in the kernel: look again whenever the run is quiet.
    await settled(lambda: gw.gateway.ctx.connection_count == count, f"{count} connections")


async def test_max_connections(upstream: FakeUpstream, start_gateway: StartGateway,
                               transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)], max_connections=2)
    addr = gw.address(transport)
    first = await Raw.open(addr)
    second = await Raw.open(addr)
    try:
        with trio.fail_after(T):
            await _wait_for_connection_count(gw, 2)
            third = await Raw.open(addr)
            try:
                resp = await third.response()
                rest = await third.rest()
            finally:
                await third.aclose()
            assert resp.status == 503, resp
            assert resp.header("connection") == "close"
            assert_openai_error(resp.body, "server_overloaded")
            assert rest == b""
            # The two idle connections are untouched: the first is still served.
            await first.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert (await first.response()).status == 200
            await first.aclose()
            await _wait_for_connection_count(gw, 1)  # the gateway saw the close
            reply = await request(addr, "GET", "/health")
            assert reply.status == 200
    finally:
        await first.aclose()
        await second.aclose()


# --------------------------------------------------------------------------- routing errors


async def test_unknown_path_and_wrong_method(upstream: FakeUpstream,
                                             start_gateway: StartGateway,
                                             transport: str) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    raw = await Raw.open(gw.address(transport))
    try:
        with trio.fail_after(T):
            await raw.send(b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n")
            resp = await raw.response()
            assert resp.status == 404, resp
            assert_openai_error(resp.body, "not_found")
            # Same connection: these are not framing errors, keep-alive goes on.
            await raw.send(b"DELETE /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            resp = await raw.response()
            assert resp.status == 405, resp
            assert resp.header("allow") == "GET"
            assert_openai_error(resp.body, "method_not_allowed")
            await raw.send(b"GET /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\r\n")
            resp = await raw.response()
            assert resp.status == 405, resp
            assert resp.header("allow") == "POST"
            assert_openai_error(resp.body, "method_not_allowed")
    finally:
        await raw.aclose()


async def test_a_method_implemented_nowhere_is_501_whatever_the_path(
        upstream: FakeUpstream, start_gateway: StartGateway, transport: str) -> None:
    """SPEC §6.1 (RFC 9110 §9.1): 501 on any path, nothing forwarded, the connection kept."""
    gw = await start_gateway([("fake", upstream.url)])
    raw = await Raw.open(gw.address(transport))
    try:
        with trio.fail_after(T):
            for head in (b"FOO / HTTP/1.1", b"PROPFIND /v1/chat/completions HTTP/1.1",
                         b"TRACE /health HTTP/1.1", b"BREW /nope HTTP/1.1"):
                await raw.send(head + b"\r\nHost: localhost\r\n\r\n")
                resp = await raw.response()
                assert resp.status == 501, (head, resp)
                assert_openai_error(resp.body, "method_not_implemented")
                assert resp.header("connection") != "close"
            # The same connection still answers.
            await raw.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert (await raw.response()).status == 200
            # CONNECT: what follows it may be a tunnel, never another request: 501, close.
            await raw.send(b"CONNECT /api/v1/nodes HTTP/1.1\r\nHost: localhost\r\n\r\n"
                           b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            resp = await raw.response()
            assert resp.status == 501, resp
            assert resp.header("connection") == "close"
            assert await raw.rest() == b""  # the pipelined GET is never answered
    finally:
        await raw.aclose()
    assert upstream.requests_to("/v1/chat/completions") == []


# --------------------------------------------------------------------------- graceful drain


async def _run_to_end(gateway: Gateway, ended: trio.Event, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    try:
        await gateway.run(task_status=task_status)
    finally:
        ended.set()


@pytest.fixture
async def own_gateway(short_tmp: Path) -> AsyncIterator[Any]:
    """Start a Gateway in a nursery of the test's own, so the test can see ``run`` return."""
    async with trio.open_nursery() as nursery:

        async def start(backends: list[tuple[str, str]], drain_timeout: float,
                        **options: Any) -> tuple[Gateway, trio.Event]:
            cfg = gateway_config(backends, socket_dir=short_tmp / "s", **options)
            gateway = Gateway(open_settings(short_tmp / "data", cfg),
                              drain_timeout=drain_timeout)
            ended = trio.Event()
            await nursery.start(_run_to_end, gateway, ended)
            return gateway, ended

        yield start
        nursery.cancel_scope.cancel()


async def test_shutdown_lets_a_running_stream_finish(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream, own_gateway: Any
) -> None:
    events = sse_events(6)
    unix_upstream.on("POST", "/v1/chat/completions", sse_stream(events, gap=1.0))
    gateway, ended = await own_gateway([("fake", unix_upstream.url)], drain_timeout=30)
    socket_path = Path(gateway.ctx.socket_path)
    tcp = f"127.0.0.1:{gateway.ctx.tcp_port}"
    assert exists_now(socket_path)
    # The stream runs over the Unix socket (autojump clock: no bytes in flight when it
    # jumps); an open connection outlives the removal of the socket file.
    client = await Client.open(f"unix:{socket_path}")
    try:
        with trio.fail_after(60):
            await client.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
            head = await client.read_head()
            assert head.status_code == 200
            t0 = trio.current_time()
            gateway.shutdown()
            await trio.sleep(0.1)  # the stream is still running (gap=1)
            with pytest.raises(OSError, match="connect"):
                await connect(tcp)
            with pytest.raises(FileNotFoundError):
                await connect(f"unix:{socket_path}")
            assert not exists_now(socket_path)
            reply = await client.read_reply(head)
            assert trio.current_time() - t0 < len(events)  # not the drain deadline
            await ended.wait()
    finally:
        await client.aclose()
    assert reply.complete
    assert reply.body == b"".join(events)
    assert not exists_now(socket_path)


async def test_shutdown_cancels_a_stalled_stream_at_the_drain_deadline(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream, own_gateway: Any
) -> None:
    events = sse_events(4)
    unix_upstream.on("POST", "/v1/chat/completions", stall_between_chunks(1, events))
    gateway, ended = await own_gateway([("fake", unix_upstream.url)], drain_timeout=1)
    socket_path = Path(gateway.ctx.socket_path)
    client = await Client.open(f"unix:{socket_path}")
    try:
        with trio.fail_after(60):
            await client.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
            head = await client.read_head()
            assert head.status_code == 200
            t0 = trio.current_time()
            gateway.shutdown()
            reply = await client.read_reply(head)
            elapsed = trio.current_time() - t0
            await ended.wait()  # gateway.run returned
            conn_id = unix_upstream.requests_to("/v1/chat/completions")[0].conn_id
            await unix_upstream.wait_connection_closed(conn_id)
    finally:
        await client.aclose()
    assert not reply.complete  # cut off: no terminating chunk
    # What was relayed, then one SSE error event (SPEC: cut "with the SSE error event").
    assert reply.body.startswith(events[0])
    rest = reply.body[len(events[0]):]
    assert rest.startswith(b'data: {"error"')
    assert rest.count(b"data: ") == 1
    assert b"shutting_down" in rest
    assert 1 <= elapsed < 2
    assert not exists_now(socket_path)
