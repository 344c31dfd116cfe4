"""Graceful drain of a real ``sluice serve`` process (SPEC §4, README "What it guarantees"):
20 streams running, SIGTERM; accepting stops at once, the streams go on until the drain
deadline, then each is cut with one SSE error event; socket files removed; exit code 0.

The drain deadline comes from the hidden ``SLUICE_DRAIN_TIMEOUT`` knob of ``proxy.server``;
the slow fake upstream (in this test's trio loop, on a Unix socket) sends one event every
0.2 s for longer than that deadline.
"""

from __future__ import annotations

import signal
from pathlib import Path

import h11
import pytest
import trio

from tests.client import Client, Reply, chat_body, read_events
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.figures import Figures
from tests.gateways import GatewayProcess

STREAMS = 20
DRAIN = 3.0  # seconds: the drain deadline given to the process
GAP = 0.2  # seconds between two events of the slow upstream
EVENTS = 60  # 12 s of events: far longer than the drain deadline
SLACK = 3.0  # generous: the machine is shared


async def _open_stream(address: str) -> tuple[Client, h11.Response]:
    client = await Client.open(address)
    await client.send_request("POST", "/v1/chat/completions", chat_body(stream=True),
                              [("content-type", "application/json")])
    head = await client.read_head()
    assert head.status_code == 200, head
    await read_events(client, 1)  # the stream is running
    return client, head


async def _refused(address: str) -> bool:
    """A new TCP connection is refused, or accepted and never answered / closed unserved."""
    host, port = address.rsplit(":", 1)
    try:
        stream = await trio.open_tcp_stream(host, int(port))
    except OSError:
        return True
    client = Client(stream)
    try:
        with trio.move_on_after(0.5):
            reply = await client.request("GET", "/health")
            return reply.status != 200
        return True  # not answered
    except Exception:  # closed unserved (reset, EOF, a broken answer)
        return True
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_sigterm_drains_twenty_streams(short_tmp: Path, nursery: trio.Nursery,
                                             monkeypatch: pytest.MonkeyPatch,
                                             figures: Figures) -> None:
    up = FakeUpstream(unix_path=str(short_tmp / "up.sock"))
    up.on("POST", "/v1/chat/completions", sse_stream(sse_events(EVENTS), gap=GAP))
    await nursery.start(up.serve)
    monkeypatch.setenv("SLUICE_DRAIN_TIMEOUT", str(DRAIN))
    gw = GatewayProcess(short_tmp / "g", "drain", backends=[("fake", up.url)],
                        chunk_interval=30.0, lb=False)
    gw.launch()
    try:
        await gw.ready()
        address = gw.address
        clients = [await _open_stream(address) for _ in range(STREAMS)]
        replies: list[Reply] = []
        ended_at: list[float] = []

        async def finish(client: Client, head: h11.Response) -> None:
            with trio.fail_after(DRAIN + 2 * SLACK):
                replies.append(await client.read_reply(head))
            ended_at.append(trio.current_time())

        assert gw.proc is not None
        async with trio.open_nursery() as readers:
            for client, head in clients:
                readers.start_soon(finish, client, head)
            sent_at = trio.current_time()
            gw.proc.send_signal(signal.SIGTERM)
            # Accepting stops at once: the socket file goes, new connections are refused.
            with trio.fail_after(SLACK):
                while not await _refused(address):
                    await trio.sleep(0.05)
            refused_after = trio.current_time() - sent_at
            assert not gw.socket_path.exists()
            # The running streams are still running a second later.
            await trio.sleep(1.0)
            assert not ended_at, "a stream ended before the drain deadline"
        for client, _ in clients:
            await client.aclose()
        code = await trio.to_thread.run_sync(gw.proc.wait, 10)
    finally:
        await gw.astop()

    finished = sum(1 for r in replies if r.complete)
    cut = [r for r in replies if not r.complete and r.body.rstrip().endswith(b"}")
           and b'data: {"error"' in r.body]
    for reply in replies:
        assert reply.status == 200
        # Events kept coming during the drain (more than the first one) ...
        assert reply.body.count(b"\n\n") >= 1 + int((DRAIN - 1.0) / GAP), reply.body[-300:]
        # ... then one error event and the end of the connection, without the last chunk.
        assert not reply.complete
        assert reply.body.count(b'data: {"error"') == 1, reply.body[-300:]
        assert b"shutting_down" in reply.body.rsplit(b"data: ", 1)[1]
    assert len(cut) == STREAMS
    spans = [t - sent_at for t in ended_at]
    assert all(DRAIN - 0.5 <= s <= DRAIN + SLACK for s in spans), spans
    assert code == 0, gw.log()
    assert not gw.socket_path.exists()
    assert not (gw.data_dir / "state.json").exists()
    assert "Traceback" not in gw.log(), gw.log()
    figures.note("drain", {"streams": STREAMS, "finished": finished,
                           "cut_with_error_event": len(cut), "drain_s": DRAIN,
                           "refused_after_ms": round(refused_after * 1000),
                           "cut_after_s_max": round(max(spans), 2)})
