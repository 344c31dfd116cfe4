"""What SPEC §16's TLS costs, measured in one process: a gateway with a node listener and a
fake model server, and a client that is this repository's own upstream pool (what gateway A
runs when it forwards to B), all in one trio loop on 127.0.0.1. So every figure is the CPU
of both ends of a link plus the fake model server, and the difference between two figures
is what TLS adds to both gateways together.

- ``plain``: requests over one reused connection to the API port (loopback TCP), carrying
  the same access key as the pinned ones (so both pay its look-up);
- ``pinned``: the same requests over one reused pinned TLS connection to the node port;
- ``handshake``: a fresh pinned connection per request against a fresh plain one (TCP
  connect, and for TLS the whole TLS 1.3 handshake with both certificates, the pin check and
  the wait for the ticket), so the difference is one handshake.

Rounds interleave the cases (ABBA); the figures are the medians of the rounds' CPU time per
request (``time.process_time``) and wall time per request (``time.perf_counter``; one
process, so both ends' work is in it, one after the other). ``--json PATH`` writes them
(S7TLS in bench/run.py takes its handshake figures from there).

    .venv/bin/python bench/tls_link.py --rounds 7 --requests 2000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.config import BackendConfig, Config, default_config, dump_config_yaml
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from proxy import binding, listeners
from proxy.lan.node_peers import NodePeers
from proxy.link.tls import End, tls_context
from proxy.server import Gateway
from proxy.settings.store import Settings
from proxy.upstream.pool import ConnectionPool, whole_exchange
from tests.client import CHAT, chat_body
from tests.fakeupstream import FakeUpstream, json_completion, sse_events, sse_stream
from tests.tls_certs import identities

# The gateway in here sends no mDNS (SPEC §14), as none the tests start does.
os.environ["SLUICE_NO_MDNS"] = "1"

Case = Callable[[], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(data_dir: Path, backend_url: str, socket_dir: Path) -> Settings:
    """The default config but for API port 0, ``socket_dir``, the fake as the one backend,
    external access on and a node port, written to ``data_dir`` and opened (what
    tests/conftest.py's helpers make, without importing the test suite's fixtures)."""
    cfg: Config = default_config()
    cfg = attrs.evolve(
        cfg, api=attrs.evolve(cfg.api, port=0, allow_external_access=True,
                              node_port=free_port()),
        local=attrs.evolve(cfg.local, socket_dir=str(socket_dir)),
        backends=(BackendConfig(name="fake", url=backend_url, kind="llm", apis="auto"),))
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (data_dir / "config.yaml").write_text(dump_config_yaml(cfg))
    return Settings.open(data_dir)


async def run(rounds: int, requests: int, handshakes: int, stream: bool
              ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """CPU µs per request by case, wall µs per request by case (medians over rounds), and the
    connections the reused pools made."""
    real = listeners.open_api_listeners

    async def loopback(port: int, *, external: bool) -> list[trio.SocketListener]:
        return await real(port, external=False)  # nothing listens beyond loopback

    setattr(binding, "open_api_listeners", loopback)  # noqa: B010
    figures: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sl-tls-", dir="/tmp") as tmp:
        folder = Path(tmp)
        own, peer = identities(folder / "ids", "b", "a")
        async with trio.open_nursery() as nursery:
            upstream = FakeUpstream()
            await nursery.start(upstream.serve)
            upstream.on("POST", CHAT, sse_stream(sse_events(20)) if stream
                        else json_completion())
            settings = settings_for(folder / "data", upstream.url, folder / "s")
            record, key = await settings.keys.add("a")
            peers = NodePeers({peer.fingerprint: (peer.der, record.id)})
            gateway = Gateway(settings, drain_timeout=1, identity=own, node_peers=peers)
            await nursery.start(gateway.run)
            await gateway.backends.ready.wait()
            ctx = gateway.ctx
            assert ctx.tcp_port is not None
            assert ctx.node_port is not None
            plain_at = parse_upstream_url(f"http://127.0.0.1:{ctx.tcp_port}")
            pinned_at = parse_upstream_url(
                f"http://127.0.0.1:{ctx.node_port}").pinned(own.fingerprint)
            tls = tls_context(End.CLIENT, peer)
            body = chat_body(stream=stream)
            headers = [(b"authorization", b"Bearer " + key.encode()),
                       (b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]

            async def one(pool: ConnectionPool, address: UpstreamAddress) -> None:
                head, _ = await whole_exchange(pool, address, b"POST", CHAT.encode(),
                                               [(b"host", address.authority), *headers],
                                               body, cap=1 << 20)
                assert head.status_code == 200

            pools: dict[str, ConnectionPool] = {}

            async def reused(address: UpstreamAddress) -> Case:
                pool = pools[address.key] = ConnectionPool(tls=tls)
                # Its probes learn that the gateway keeps connections after streamed
                # answers (until then each is probed before it is reused).
                await nursery.start(pool.run)

                async def case() -> None:
                    for _ in range(requests):
                        await one(pool, address)
                return case

            def fresh(address: UpstreamAddress) -> Case:
                async def case() -> None:
                    for _ in range(handshakes):
                        pool = ConnectionPool(tls=tls)
                        await one(pool, address)
                        pool.close()
                return case

            cases = {"plain": (await reused(plain_at), requests),
                     "pinned": (await reused(pinned_at), requests),
                     "plain fresh": (fresh(plain_at), handshakes),
                     "pinned fresh": (fresh(pinned_at), handshakes)}
            for name, (case, _) in cases.items():  # warm up
                await case()
                figures[name], walls[name] = [], []
            order = list(cases)
            for n in range(rounds):
                for name in order if n % 2 == 0 else reversed(order):
                    case, count = cases[name]
                    began, wall = time.process_time(), time.perf_counter()
                    await case()
                    figures[name].append((time.process_time() - began) / count * 1e6)
                    walls[name].append((time.perf_counter() - wall) / count * 1e6)
            connects = {"plain": pools[plain_at.key].connects,
                        "pinned": pools[pinned_at.key].connects}
            gateway.shutdown()
            nursery.cancel_scope.cancel()
    setattr(binding, "open_api_listeners", real)  # noqa: B010
    medians = {name: statistics.median(values) for name, values in figures.items()}
    wall_medians = {name: statistics.median(values) for name, values in walls.items()}
    return medians, wall_medians, connects


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--handshakes", type=int, default=300)
    ap.add_argument("--stream", action="store_true", help="a 20-event streamed chat")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    got, walls, connects = trio.run(run, args.rounds, args.requests, args.handshakes,
                                    args.stream)
    kind = "streamed chat (20 events)" if args.stream else "chat completion"
    print(f"CPU µs per request, {kind}, both ends and the fake model server, "
          f"median of {args.rounds} rounds:")
    for name, value in got.items():
        print(f"  {name:13s} {value:8.1f}   (wall {walls[name]:8.1f})")
    print(f"  TLS on a reused connection: +{got['pinned'] - got['plain']:.1f} µs "
          f"({got['pinned'] / got['plain']:.3f}x)")
    print(f"  one handshake (both ends):  +{got['pinned fresh'] - got['plain fresh']:.1f} µs")
    print(f"  connections made by the reused pools: {connects}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "rounds": args.rounds, "requests": args.requests, "handshakes": args.handshakes,
            "stream": args.stream, "cpu_us": got, "wall_us": walls,
            "connects": connects}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
