"""Property: whatever way the upstream splits an SSE body into HTTP chunks, the client
receives exactly the upstream's bytes (CRLF and UTF-8 characters split across chunks,
comments, a 1 MiB event). Each example runs a real gateway and a real fake upstream."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.server import Gateway
from tests.client import chat_body, request
from tests.conftest import gateway_config, open_settings
from tests.fakeupstream import LLAMA_SSE_HEADERS, FakeUpstream, ReceivedRequest, ResponseWriter

PIECES = [
    b'data: {"choices":[{"delta":{"content":"caf\xc3\xa9 \xf0\x9f\x90\x8d"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\n',
    b": keep-alive\n\n",
    b":\n\n",
    b"event: response.output_text.delta\ndata: {\"delta\":\"\xe2\x82\xac\"}\n\n",
    b"data: line one\ndata: line two\n\n",
    b"data: [DONE]\n\n",
]
BIG_EVENT = b"data: " + b"\xc3\xa9" * (512 * 1024) + b"\n\n"  # 1 MiB of two-byte characters


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % len(body) for c in cuts} - {0})
    parts, last = [], 0
    for point in points:
        parts.append(body[last:point])
        last = point
    parts.append(body[last:])
    return parts


async def relay_once(parts: list[bytes], folder: Path) -> tuple[bytes, bool]:
    async def answer(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for part in parts:
            await w.chunk(part)
        await w.end()

    async with trio.open_nursery() as nursery:
        up = FakeUpstream()
        up.on("POST", "/v1/chat/completions", answer)
        await nursery.start(up.serve)
        cfg = gateway_config([("fake", up.url)], socket_dir=folder / "s")
        gateway = Gateway(open_settings(folder / "data", cfg))
        await nursery.start(gateway.run)
        with trio.fail_after(20):
            for address in (f"127.0.0.1:{gateway.ctx.tcp_port}",
                            f"unix:{gateway.ctx.socket_path}"):
                reply = await request(address, "POST", "/v1/chat/completions",
                                      chat_body(stream=True))
                assert reply.complete
                assert reply.body == b"".join(parts)
        nursery.cancel_scope.cancel()
    return reply.body, reply.complete


def run(parts: list[bytes]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    try:
        trio.run(relay_once, parts, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=12),
       cuts=st.lists(st.integers(min_value=1, max_value=10_000), max_size=20))
def test_client_gets_upstream_bytes_for_any_split(pieces: list[bytes], cuts: list[int]) -> None:
    run(split(b"".join(pieces), cuts))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(BIG_EVENT)), max_size=8))
def test_one_mebibyte_event_for_any_split(cuts: list[int]) -> None:
    run(split(PIECES[0] + BIG_EVENT + PIECES[-1], cuts))
