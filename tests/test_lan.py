"""A real LAN of two hosts (README "Network nodes", "Listening and access"; SPEC §5, §7):
two ``sluice serve`` processes in two network namespaces joined by a veth pair
(:mod:`tests.netns`). Host B is the node: external access on, its veth address in
``api.allowed_hosts``, an access key made with ``sluice keys create`` inside its namespace,
a fake model server on a Unix socket (the namespaces share the filesystem). Host A balances
load, serves a local model of its own, and has B added with ``sluice nodes add
http://<B>:<port> --api-key-file FILE``. The test process talks to both over their Unix
sockets; remote clients are Python processes run inside A's namespace.

In file order (they share the module's LAN): B refuses a remote client without a key (401)
and a foreign Host (403); a ``tbf`` slow link delivers streams whole and byte-exact; the
link cut mid-stream ends the stream with the SSE error event at ``chunk_interval``, new
requests fail promptly, the breaker opens, A keeps serving its own model; the link back
up, B is checked online and one half-open probe closes the circuit.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import h11
import pytest
import trio

from protocol.upstream_url import parse_upstream_url
from proxy.upstream.pool import ConnectionPool
from tests.client import CHAT, Client, chat_body, read_events
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
)
from tests.figures import Figures
from tests.gateways import GatewayProcess
from tests.netns import Lan, lan_run

CONNECT = 1.0  # timeouts.connection of A
CHUNK_INTERVAL = 2.0  # timeouts.request.streaming.chunk_interval of A
RESET = 3.0  # circuit_breaker.reset_timeout of A
SLACK = 4.0  # generous: the machine is shared


async def events_handler(req: ReceivedRequest, w: ResponseWriter) -> None:
    """Streams ``x_events`` events (sse_events) ``x_gap`` seconds apart; whole otherwise."""
    doc = req.json()
    if not doc.get("stream"):
        await json_completion("from b", "b-model")(req, w)
        return
    await w.head(200, LLAMA_SSE_HEADERS)
    for i, event in enumerate(sse_events(int(doc["x_events"]), "b-model")):
        if i and doc.get("x_gap"):
            await trio.sleep(float(doc["x_gap"]))
        await w.chunk(event)
    await w.end()


class Hosts:
    def __init__(self, lan: Lan, a: GatewayProcess, b: GatewayProcess, fingerprint: str,
                 key: str) -> None:
        self.lan = lan
        self.a = a
        self.b = b
        self.fingerprint = fingerprint  # B as A's node
        self.key = key  # B's access key

    @property
    def b_url(self) -> str:
        return f"http://{self.lan.addr['b']}:{self.b.port}"


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with lan_run("LAN TEST", "sl-lan-") as run:
        lan, folder = run.lan, run.folder
        up_b = FakeUpstream(models=["b-model"], unix_path=str(folder / "b.sock"))
        up_b.on("POST", CHAT, events_handler)
        up_a = FakeUpstream(models=["a-model"], unix_path=str(folder / "a.sock"))
        up_a.on("POST", CHAT, json_completion("from a", "a-model"))
        for up in (up_a, up_b):
            run.serve(up)
        b = run.launch("b", GatewayProcess(
            folder / "b", "lan-b", backends=[("b-fake", up_b.url)], lb=False,
            allow_external_access=True, allowed_hosts=(lan.addr["b"],)))
        key = lan.sluice("b", "keys", "create", "--name", "host-a", "--data-dir",
                         str(b.data_dir)).strip()
        assert key.startswith("sk-sluice-"), key
        key_file = folder / "b.key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        a = run.launch("a", GatewayProcess(
            folder / "a", "lan-a", backends=[("a-fake", up_a.url)], lb=True,
            connection=CONNECT, chunk_interval=CHUNK_INTERVAL, first_byte=5.0,
            stream_total=60.0, standard_total=20.0, interval=1.0, hc_timeout=0.8,
            failure_threshold=2, reset_timeout=RESET))
        added = json.loads(lan.sluice(
            "a", "nodes", "add", f"http://{lan.addr['b']}:{b.port}", "--name", "host-b",
            "--api-key-file", str(key_file), "--data-dir", str(a.data_dir), "--json"))
        assert added["fingerprint"] == b.fingerprint, added  # from B's identity, over the LAN
        yield Hosts(lan, a, b, added["fingerprint"], key)


async def stream_via_a(hosts: Hosts, events: int, gap: float) -> tuple[Client, h11.Response]:
    client = await Client.open(hosts.a.unix)
    body = chat_body("b-model", True, x_events=events, x_gap=gap)
    await client.send_request("POST", CHAT, body, [("content-type", "application/json")])
    return client, await client.read_head()


async def b_state(hosts: Hosts) -> dict[str, Any]:
    """B as A sees it: its distributed-status endpoint entry and its routing stats."""
    pool = await hosts.a.distributed_status()
    entry = next(e for e in pool["endpoints"] if e["fingerprint"] == hosts.fingerprint)
    stats = await hosts.a.node_stats(hosts.fingerprint)
    return {**entry, **stats}


async def test_remote_client_needs_a_key_and_a_listed_host(hosts: Hosts) -> None:
    lan, url = hosts.lan, hosts.b_url + "/v1/models"
    bearer = {"Authorization": f"Bearer {hosts.key}"}
    assert await trio.to_thread.run_sync(lan.http, "a", url, {}) == 401
    assert await trio.to_thread.run_sync(
        lan.http, "a", url, {"Authorization": "Bearer sk-sluice-wrong"}) == 401
    assert await trio.to_thread.run_sync(lan.http, "a", url, bearer) == 200
    assert await trio.to_thread.run_sync(
        lan.http, "a", url, {**bearer, "Host": "evil.example"}) == 403
    await hosts.a.wait_nodes({hosts.fingerprint: ["b-model"]})


async def test_slow_link_delivers_streams_whole_and_byte_exact(hosts: Hosts,
                                                               figures: Figures) -> None:
    await hosts.a.wait_nodes({hosts.fingerprint: ["b-model"]})
    lan, runs, events = hosts.lan, 3, 60
    expected = b"".join(sse_events(events, "b-model"))
    delivered = exact = 0
    # B -> A (the answers' direction) at 100 kbit/s: about a second per ~12 KB stream.
    await trio.to_thread.run_sync(lan.shape, "b", "100kbit", "4kb", "400ms")
    try:
        for _ in range(runs):
            # A saturated slow link can delay a health check's answer past its 0.8 s
            # timeout (B offline for a moment: right); each run starts with B online.
            await hosts.a.wait_nodes({hosts.fingerprint: ["b-model"]})
            client, head = await stream_via_a(hosts, events, 0)
            try:
                assert head.status_code == 200, head
                with trio.fail_after(30):
                    reply = await client.read_reply(head)
            finally:
                await client.aclose()
            assert reply.header("x-sluice-served-by") == f"node:{hosts.fingerprint}"
            delivered += reply.complete
            exact += reply.body == expected
            assert reply.complete
            assert reply.body == expected, len(reply.body)
        held = await trio.to_thread.run_sync(lan.overlimits, "b")
        assert held > 0, "the tbf never held a packet back: the link was not slow"
    finally:
        await trio.to_thread.run_sync(lan.unshape, "b")
    figures.note("lan_slow_link", {"runs": runs, "delivered": delivered, "byte_exact": exact,
                                   "bytes_per_stream": len(expected), "rate": "100kbit",
                                   "tbf_overlimits": held})


@pytest.mark.slow
async def test_link_cut_then_back(hosts: Hosts, figures: Figures) -> None:
    a, lan, fp = hosts.a, hosts.lan, hosts.fingerprint
    await a.wait_nodes({fp: ["b-model"]})
    client, head = await stream_via_a(hosts, 400, 0.05)  # 20 s of events
    assert head.status_code == 200, head
    await read_events(client, 3)
    cut_at = trio.current_time()
    await trio.to_thread.run_sync(lan.link, "b", False)
    statuses: list[int] = []
    spans: list[float] = []

    async def new_request() -> None:
        start = trio.current_time()
        with trio.fail_after(CONNECT + 2 * SLACK):
            reply = await a.chat("b-model", via="unix")
        statuses.append(reply.status)
        spans.append(trio.current_time() - start)

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(2):  # sent at once, while A still counts B online
                nursery.start_soon(new_request)
            with trio.fail_after(CHUNK_INTERVAL + 2 * SLACK):
                reply = await client.read_reply(head)
            stream_ended = trio.current_time() - cut_at
    finally:
        await client.aclose()
    # The stream: one SSE error event at chunk_interval, then the end without the last chunk.
    assert not reply.complete
    assert reply.body.count(b'data: {"error"') == 1, reply.body[-300:]
    assert CHUNK_INTERVAL - 0.5 <= stream_ended <= CHUNK_INTERVAL + SLACK, stream_ended
    # New requests failed promptly (a connect timeout or B already known offline).
    assert all(s in (502, 503, 504) for s in statuses), statuses
    assert all(span <= CONNECT + SLACK for span in spans), spans

    async def breaker_open() -> bool:
        return bool((await a.node_stats(fp))["circuitOpen"])

    await a.wait_until(breaker_open, "B's circuit open", timeout=SLACK)
    # A keeps serving its own model meanwhile; B's model is refused at once.
    local = await a.chat("a-model", via="unix")
    assert local.status == 200
    assert local.header("x-sluice-served-by") == "local:a-fake"
    start = trio.current_time()
    refused = await a.chat("b-model", via="unix")
    refused_ms = (trio.current_time() - start) * 1000
    assert refused.status in (502, 503, 504), refused
    assert refused_ms <= (CONNECT + SLACK) * 1000

    async def offline() -> bool:
        return (await b_state(hosts))["status"] == "offline"

    await a.wait_until(offline, "B offline", timeout=SLACK)
    figures.note("lan_link_cut", {
        "stream_error_event_after_s": round(stream_ended, 2),
        "chunk_interval_s": CHUNK_INTERVAL, "new_request_statuses": sorted(statuses),
        "new_request_max_s": round(max(spans), 2), "breaker_opened": True,
        "local_served_meanwhile": True, "refused_while_cut": refused.status})

    # The link back up: B checked online again, then one half-open probe closes the circuit.
    await trio.to_thread.run_sync(lan.link, "b", True)
    back_at = trio.current_time()
    await a.wait_nodes({fp: ["b-model"]}, timeout=RESET + 2 * SLACK)
    online_after = trio.current_time() - back_at

    async def half_open() -> bool:
        return (await a.node_stats(fp))["circuitState"] == "half_open"

    await a.wait_until(half_open, "B's circuit half-open", timeout=RESET + 2 * SLACK)
    before = (await a.node_stats(fp))["totalRequests"]
    probe = await a.chat("b-model", via="unix")  # the one request let through: it succeeds
    assert probe.status == 200, probe
    assert probe.header("x-sluice-served-by") == f"node:{fp}"
    after = await a.node_stats(fp)
    assert after["circuitState"] == "closed", after
    assert not after["circuitOpen"]
    assert after["totalRequests"] == before + 1
    assert after["consecutiveFailures"] == 0
    more = [await a.chat("b-model", via="unix") for _ in range(2)]  # closed: all pass
    assert [r.status for r in more] == [200, 200], more
    figures.count("half_open_probes", 1)
    figures.peak("half_open_probes_per_window", 1)
    note = figures.notes["lan_link_cut"]
    note.update({"online_again_after_s": round(online_after, 2), "circuit_closed": True})


async def test_upstream_sockets_bound_unacknowledged_bytes() -> None:
    """Without namespaces: the pool sets TCP_USER_TIMEOUT from timeouts.connection (what
    makes a request on a kept-alive connection over a dead link fail promptly above)."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        port = listener.getsockname()[1]
        conn = await ConnectionPool(lambda: 1.5).connect(
            parse_upstream_url(f"http://127.0.0.1:{port}"))
        try:
            sock = conn.wire.sock
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1500
        finally:
            conn.close()
    finally:
        listener.close()
