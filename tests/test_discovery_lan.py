"""LAN discovery end to end (SPEC §14): two ``sluice serve`` processes in two network
namespaces joined by a veth pair (:mod:`tests.netns`), real mDNS on that pair only.

Host B has external access on and ``discovery.announce: true`` (no ``allowed_hosts``);
host A balances load with ``discovery.browse: true``. In file order (they share the
module's LAN): A lists B (B's fingerprint and veth address, ``added`` false) and B's
namespace never accepted a TCP connection (discovery contacts nobody); a query from a
plain UDP socket in A's namespace is answered by B; a client in A's namespace reaches B
with ``Host: <B's address>`` (the Host guard's own-address rule; another Host still gets
403); A pairs with B by the code ``sluice pair`` shows on B (``sluice nodes add <the
discovered baseUrl> --code C`` on A), then streams a chat answer from B byte-exact; B
stopped with SIGTERM leaves A's list at once (its goodbye), not after 2 minutes;
a B without external access announces nothing, and A lists nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from protocol.config import DiscoveryConfig
from tests.client import CHAT, Client, chat_body, request
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.gateways import GatewayProcess
from tests.netns import Lan, lan_run, launch_in

DISCOVERED = "/api/v1/nodes/discovered"
EVENTS = 40  # events in B's streamed answer
SEEN_WITHIN = 8.0  # seconds: B announces at start, A asks at 0, 1, 3, 7 s
GONE_WITHIN = 5.0  # seconds after SIGTERM (forgetting alone would take 120)
QUIET_FOR = 4.0  # seconds a raw listener watches for packets of a B that must be silent

# A plain UDP socket in a namespace: joins the mDNS group on ``addr``, sends one browse
# query, then for ``seconds`` prints the source address of every packet it receives.
LISTENER = """
import json, socket, sys, time
from protocol.lan.dnssd import MDNS_GROUP, MDNS_PORT, query_packet
addr, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("0.0.0.0", MDNS_PORT))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
             socket.inet_aton(MDNS_GROUP) + socket.inet_aton(addr))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(addr))
print("ready", flush=True)
s.sendto(query_packet(), (MDNS_GROUP, MDNS_PORT))
seen = []
end = time.monotonic() + seconds
while (left := end - time.monotonic()) > 0:
    s.settimeout(left)
    try:
        data, source = s.recvfrom(9000)
    except TimeoutError:
        break
    seen.append([source[0], source[1], len(data)])
print(json.dumps(seen), flush=True)
"""


def discovery(gw: GatewayProcess, **switches: bool) -> GatewayProcess:
    gw.config = attrs.evolve(gw.config, discovery=DiscoveryConfig(**switches))
    return gw


class Hosts:
    def __init__(self, lan: Lan, folder: Path, a: GatewayProcess, b: GatewayProcess,
                 model: FakeUpstream) -> None:
        self.lan = lan
        self.folder = folder
        self.a = a
        self.b = b
        self.model = model  # B's model server (b-model), on a Unix socket

    async def discovered(self) -> list[dict[str, Any]]:
        reply = await self.a.call("GET", DISCOVERED, via="unix")
        assert reply.status == 200, reply.body
        found: list[dict[str, Any]] = reply.json()
        return found

    def passive_opens(self, host: str) -> int:
        """TCP connections the kernel accepted in ``host``'s namespace so far."""
        lines = [line.split() for line in
                 self.lan.run(host, ["cat", "/proc/net/snmp"]).stdout.splitlines()
                 if line.startswith("Tcp:")]
        return int(lines[1][lines[0].index("PassiveOpens")])

    def listen(self, seconds: float) -> subprocess.Popen[str]:
        """The LISTENER in A's namespace, once it has joined the group."""
        proc = subprocess.Popen([*self.lan.prefix("a"), sys.executable, "-c", LISTENER,
                                 self.lan.addr["a"], str(seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr \
            else ""
        return proc

    @staticmethod
    def heard(proc: subprocess.Popen[str]) -> list[list[Any]]:
        out, err = proc.communicate(timeout=QUIET_FOR + 10)
        assert proc.returncode == 0, err
        seen: list[list[Any]] = json.loads(out.strip().splitlines()[-1])
        return seen


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with lan_run("LAN DISCOVERY TEST", "sl-disc-") as run:
        folder = run.folder
        model = run.serve(FakeUpstream(models=["b-model"], unix_path=str(folder / "b.sock")))
        model.on("POST", CHAT, sse_stream(sse_events(EVENTS, "b-model")))
        b = run.launch("b", discovery(GatewayProcess(
            folder / "b", "disc-b", lb=False, backends=[("b-fake", model.url)],
            allow_external_access=True), announce=True))
        a = run.launch("a", discovery(GatewayProcess(folder / "a", "disc-a", lb=True),
                                      browse=True))
        yield Hosts(run.lan, folder, a, b, model)


async def test_a_lists_b_without_contacting_it(hosts: Hosts) -> None:
    b_addr = hosts.lan.addr["b"]
    identity = await hosts.b.get_json("/api/v1/node/identity", via="unix")
    expected = {"fingerprint": identity["fingerprint"],
                "baseUrl": f"http://{b_addr}:{hosts.b.port}", "version": identity["version"],
                "added": False}
    start = time.monotonic()
    with trio.fail_after(SEEN_WITHIN):
        while not (found := await hosts.discovered()):
            await trio.sleep(0.02)  # another host: asked every 20 ms
    (entry,) = found
    assert entry["name"]  # the computer's name (both namespaces share this one's)
    assert entry == {**expected, "name": entry["name"]}
    assert identity["fingerprint"] == hosts.b.fingerprint
    assert time.monotonic() - start < SEEN_WITHIN
    settings = await hosts.a.get_json("/api/v1/settings/discovery", via="unix")
    assert settings == {"announce": False, "browse": True, "announcing": False,
                        "browsing": True}
    assert (await hosts.b.get_json("/api/v1/settings/discovery", via="unix")) == {
        "announce": True, "browse": False, "announcing": True, "browsing": False}
    # Nobody connected to B: not A's discovery, not its node checks (B is no node of A's).
    assert await trio.to_thread.run_sync(hosts.passive_opens, "b") == 0
    assert (await hosts.a.get_json("/api/v1/nodes", via="unix")) == []


async def test_b_answers_a_query_from_the_lan(hosts: Hosts) -> None:
    proc = await trio.to_thread.run_sync(hosts.listen, 2.0)
    heard = await trio.to_thread.run_sync(hosts.heard, proc)
    assert any(src == hosts.lan.addr["b"] and port == 5353 for src, port, _ in heard), heard


async def test_b_accepts_its_own_address_as_host(hosts: Hosts) -> None:
    lan, b = hosts.lan, hosts.b
    key = lan.sluice("b", "keys", "create", "--name", "host-a", "--data-dir",
                     str(b.data_dir)).strip()
    url = f"http://{lan.addr['b']}:{b.port}"
    before = await trio.to_thread.run_sync(hosts.passive_opens, "b")
    # http.client sends Host: <B's address>:<port>; B's allowed_hosts is empty.
    assert await trio.to_thread.run_sync(lan.http, "a", url + "/health", {}) == 200
    bearer = {"Authorization": f"Bearer {key}"}
    assert await trio.to_thread.run_sync(
        lan.http, "a", url + "/api/v1/node/identity", bearer) == 200
    assert await trio.to_thread.run_sync(
        lan.http, "a", url + "/health", {"Host": "evil.example"}) == 403
    assert await trio.to_thread.run_sync(hosts.passive_opens, "b") == before + 3


async def test_a_pairs_with_b_by_its_code_then_streams_from_it(hosts: Hosts) -> None:
    lan, a, b = hosts.lan, hosts.a, hosts.b
    (entry,) = await hosts.discovered()
    made = json.loads(await trio.to_thread.run_sync(
        lambda: lan.sluice("b", "pair", "--json", "--data-dir", str(b.data_dir))))
    code = made["code"]
    assert len(code) == 6
    assert code.isdigit()
    said = await trio.to_thread.run_sync(
        lambda: lan.sluice("a", "nodes", "add", entry["baseUrl"], "--code", code,
                           "--data-dir", str(a.data_dir)))
    assert entry["fingerprint"] in said
    nodes = await a.get_json("/api/v1/nodes", via="unix")
    # Named as it announced itself: the claim's answer names no one.
    assert [(n["fingerprint"], n["name"], n["baseUrl"], n["hasApiKey"]) for n in nodes] == [
        (entry["fingerprint"], entry["name"], entry["baseUrl"], True)]
    # SPEC §16: paired over B's node port by SPAKE2, B's certificate pinned.
    b_identity = (await b.get_json("/health", via="unix"))["identity"]
    assert [(n["link"], n["pin"]) for n in nodes] == [("pinned", b_identity)]
    assert "pinned" in said
    # B made a key for A, named after A's computer; the code is used up.
    keys = await b.get_json("/api/v1/access-keys", via="unix", admin=True)
    assert [k["name"] for k in keys if k["name"] != "host-a"] == [socket.gethostname()]
    again = await b.call("POST", "/api/v1/pairing/claim",
                         {"code": code, "fingerprint": "x", "name": "x"}, via="unix")
    assert again.status == 401
    with trio.fail_after(SEEN_WITHIN):
        while not (await hosts.discovered())[0]["added"]:
            await trio.sleep(0.02)  # another host: asked every 20 ms
    await a.wait_nodes({entry["fingerprint"]: ["b-model"]})
    # A streams from B over the veth pair with the key the code got: byte for byte what
    # B's model server sends.
    direct = await request(hosts.model.url, "POST", CHAT, chat_body("b-model", True),
                           [("content-type", "application/json")])
    client = await Client.open(a.unix)
    try:
        got = await client.request("POST", CHAT, chat_body("b-model", True),
                                   [("content-type", "application/json")])
    finally:
        await client.aclose()
    assert got.status == 200
    assert got.header("x-sluice-served-by") == f"node:{entry['fingerprint']}"
    assert got.body == direct.body
    assert got.body.count(b"\n\n") == EVENTS + 1  # and the [DONE] line
    node_key = yaml.safe_load((a.data_dir / "secrets.yaml").read_text())["node_keys"][
        entry["fingerprint"]]
    assert node_key.startswith("sk-sluice-")
    for log in (a.log(), b.log()):
        assert code not in log
        assert node_key not in log


async def test_b_stopped_leaves_the_list_at_once(hosts: Hosts) -> None:
    assert len(await hosts.discovered()) == 1
    start = time.monotonic()
    await hosts.b.astop()  # SIGTERM: the goodbye goes out before the listeners close
    with trio.fail_after(GONE_WITHIN):
        while await hosts.discovered():
            await trio.sleep(0.02)  # another host: asked every 20 ms
    assert time.monotonic() - start < GONE_WITHIN
    assert "withdrew the announcement" in hosts.b.log()


async def test_b_without_external_access_announces_nothing(hosts: Hosts) -> None:
    quiet = discovery(GatewayProcess(hosts.folder / "b2", "disc-b2", lb=False), announce=True)
    proc = await trio.to_thread.run_sync(hosts.listen, QUIET_FOR)
    try:
        await trio.to_thread.run_sync(launch_in, hosts.lan, "b", quiet)
        heard = await trio.to_thread.run_sync(hosts.heard, proc)
        assert [h for h in heard if h[0] == hosts.lan.addr["b"]] == []
        assert await hosts.discovered() == []
        assert (await quiet.get_json("/api/v1/settings/discovery", via="unix")) == {
            "announce": True, "browse": False, "announcing": False, "browsing": False}
    finally:
        proc.kill()
        await quiet.astop()
    assert "sluice.discovery" not in quiet.log()  # nothing of it ran
