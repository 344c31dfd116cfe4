"""What a gateway imports only when first asked for it: trio-websocket and wsproto (the events
WebSocket, SPEC §9.3) with the first subscriber, prometheus_client (the process figures of
``GET /metrics``, SPEC §9.2) with the first scrape. A gateway nobody watches or scrapes does
not hold them (about 4 MB of its memory; docs/performance.md, S5)."""

from __future__ import annotations

import subprocess
import sys

from tests.client import request
from tests.conftest import StartGateway
from tests.test_events_ws import RawFeed, subscribed

LAZY = ("trio_websocket", "wsproto", "prometheus_client", "http.server", "wsgiref")


def test_the_server_modules_leave_the_watchers_libraries_out() -> None:
    code = ("import sys, proxy.serve, proxy.server, proxy.api.routes, proxy.observe.events, "
            f"proxy.observe.metrics; print(sorted(m for m in {LAZY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


async def test_the_first_scrape_and_the_first_subscriber_load_them(
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    metrics = gw.gateway.ctx.metrics
    assert metrics._process is None  # nothing scraped yet
    reply = await request(gw.unix, "GET", "/metrics")
    assert reply.status == 200
    assert b"\nprocess_resident_memory_bytes " in reply.body
    assert metrics._process is not None
    feed = await RawFeed.open(gw.unix)
    await subscribed(gw, 1)
    assert (await feed.frame() or {}).get("type") == "hello"
    assert "proxy.observe.event_socket" in sys.modules
    await feed.stream.aclose()
