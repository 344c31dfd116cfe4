"""SPEC §16 on a real LAN: two ``sluice serve`` processes in two network namespaces joined
by a veth pair (:mod:`tests.netns`). Host B has external access on (its node listener on
the default port) and a fake model server answering ``b-model`` with a canary text; host A
balances load. In file order (they share the module's LAN):

- B's ``identity/key.pem`` is 0600 and ``identity/`` 0700 (A's too).
- On B's node port, seen from A's namespace: ``openssl s_client -tls1_2`` fails the
  handshake; ``-tls1_3`` without a certificate completes it and is shown B's certificate
  (its SHA-256 is B's identity); a plain HTTP request gets no HTTP answer.
- A man in the middle (:mod:`tests.mitm_relay`, in B's namespace with its own certificate:
  it rewrites ``/health``'s ``nodePort`` to its TLS port and relays that to B's node port,
  keeping every plaintext byte): pairing through it with B's right code fails (the CLI
  says the code was not accepted, the API answers 422 ``pairingCode``), each attempt costs
  one of B's tries, nothing is paired on either side, and the relay never saw the code.
- A passive capture (tcpdump on A's veth) of pairing by the CLI and of a streamed and a
  whole chat through A: the node is pinned to B's identity, the answers are byte-exact
  B's model server's, and the capture holds TLS 1.3 on B's node port (application data
  only, once the handshake is done) but not the prompt, the answer, the node key, the code,
  an admin token, or a request's path (its figures: ``lan_tls_capture`` in figures.json).
- A's pinned node moved to the relay's address: offline with ``node_identity_changed``,
  a chat is not served by B, and A sent the relay nothing but ``GET /health`` (its TLS
  handshake ended at the relay's certificate); moved back, B serves again.

The capture test skips without ``tcpdump``, the TLS version test without ``openssl``
(``scripts/test`` installs both); all skip without network namespaces (root, iproute2).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import ssl
import stat
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

from tests import pcap
from tests.client import CHAT, chat_body, error_of, request
from tests.fakenode import stream_events
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_stream,
)
from tests.figures import Figures
from tests.gateways import GatewayProcess
from tests.netns import COMMAND_TIMEOUT, LanRun, lan_run
from tests.tls_certs import identities

PROMPT = f"PROMPT-CANARY-{secrets.token_hex(8)}"
ANSWER = f"ANSWER-CANARY-{secrets.token_hex(8)}"
NODES = "/api/v1/nodes"
WITHIN = 10.0  # seconds for a node to change state (checks every second)
MAX_RECORD = 5 + 2**14 + 256  # a TLS record's header and largest encrypted fragment
# What crosses the LAN only inside TLS: requests' paths, a key's prefix.
INSIDE_TLS = (CHAT, "/v1/models", "/api/v1/pairing/exchange", "sk-sluice-")
RELAY = Path(__file__).with_name("mitm_relay.py")  # standard library only: run by its path


async def _canary(req: ReceivedRequest, w: ResponseWriter) -> None:
    """B's model: ANSWER as a whole chat answer or, for ``stream: true``, as SSE events."""
    streamed = json.loads(req.body).get("stream")
    handler = sse_stream(stream_events(ANSWER)) if streamed else \
        json_completion(ANSWER, "b-model")
    await handler(req, w)


@attrs.define
class Hosts:
    run: LanRun
    a: GatewayProcess
    b: GatewayProcess
    model: FakeUpstream  # B's model server (b-model), on a Unix socket

    @property
    def b_url(self) -> str:
        return f"http://{self.run.lan.addr['b']}:{self.b.port}"

    def code(self) -> str:
        made = json.loads(self.run.lan.sluice("b", "pair", "--json", "--data-dir",
                                              str(self.b.data_dir)))
        code: str = made["code"]
        return code

    def nodes_add(self, url: str, code: str) -> subprocess.CompletedProcess[str]:
        """``sluice nodes add URL --code C`` on A (its exit status not checked)."""
        return self.run.lan.run("a", [sys.executable, "-m", "proxy", "nodes", "add", url,
                                      "--code", code, "--data-dir", str(self.a.data_dir)],
                                check=False, timeout=30)

    async def pair(self) -> str:
        """A pairs with B by a code of B's, with the CLI on both sides; the code."""
        code = await trio.to_thread.run_sync(self.code)
        said = await trio.to_thread.run_sync(self.nodes_add, self.b_url, code)
        assert said.returncode == 0, said.stdout + said.stderr
        return code

    async def tries_left(self) -> int:
        left: int = (await self.b.get_json("/api/v1/pairing", via="unix",
                                           admin=True))["triesLeft"]
        return left

    async def node_state(self) -> dict[str, Any]:
        pool = await self.a.get_json("/api/v1/pool/distributed-status", via="unix")
        entry: dict[str, Any] = next(e for e in pool["endpoints"]
                                     if e["fingerprint"] == self.b.fingerprint)
        return entry

    def node_key(self) -> str:
        key: str = yaml.safe_load((self.a.data_dir / "secrets.yaml").read_text())[
            "node_keys"][self.b.fingerprint]
        return key

    async def chat(self, stream: bool) -> Any:
        body = chat_body("b-model", stream, messages=[{"role": "user", "content": PROMPT}])
        return await request(self.a.unix, "POST", CHAT, body,
                             [("content-type", "application/json")])


@attrs.define
class Relay:
    url: str  # its plain port, as a node's base URL
    pin: str  # its certificate's
    record: Path
    log: Path

    def seen(self) -> dict[str, bytes]:
        """Every plaintext stream it kept, by file name."""
        return {p.name: p.read_bytes() for p in sorted(self.record.iterdir())}

    def said(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with lan_run("TLS LAN TEST", "sl-tls-") as run:
        model = run.serve(FakeUpstream(models=["b-model"],
                                       unix_path=str(run.folder / "b.sock")))
        model.on("POST", CHAT, _canary)
        b = run.launch("b", GatewayProcess(run.folder / "b", "tls-b", lb=False,
                                           backends=[("b-fake", model.url)],
                                           allow_external_access=True))
        a = run.launch("a", GatewayProcess(run.folder / "a", "tls-a", lb=True))
        yield Hosts(run, a, b, model)


@pytest.fixture(scope="module")
def relay(hosts: Hosts) -> Relay:
    return _relay(hosts, "mitm")


@pytest.fixture(scope="module")
def downgrader(hosts: Hosts) -> Relay:
    """A relay that says B has no node port, hoping for the clear-text claim."""
    return _relay(hosts, "mitm-down", "--hide-node-port")


def _relay(hosts: Hosts, name: str, *extra: str) -> Relay:
    run, b = hosts.run, hosts.b
    folder = run.folder / name
    (own,) = identities(folder, "id")
    record, ready = folder / "seen", folder / "ports.json"
    record.mkdir()
    node_port = _health(b)["nodePort"]
    proc = run.spawn("b", [sys.executable, str(RELAY), "--listen",
                           run.lan.addr["b"], "--target", run.lan.addr["b"], "--api-port",
                           str(b.port), "--node-port", str(node_port), "--cert",
                           str(own.cert_path), "--key", str(own.key_path), "--record",
                           str(record), "--ready", str(ready), *extra], folder / "log")
    deadline = time.monotonic() + COMMAND_TIMEOUT
    while not ready.exists():
        assert proc.poll() is None, (folder / "log").read_text()
        assert time.monotonic() < deadline, "the relay did not start"
        time.sleep(0.02)
    ports = json.loads(ready.read_text())
    return Relay(f"http://{run.lan.addr['b']}:{ports['plain']}", own.fingerprint, record,
                 folder / "log")


def _health(gw: GatewayProcess) -> dict[str, Any]:
    """``GET /health`` over the gateway's Unix socket (outside any trio loop)."""
    health: dict[str, Any] = trio.run(gw.get_json, "/health")
    return health


def test_identity_files_are_private(hosts: Hosts) -> None:
    for gw in (hosts.b, hosts.a):
        folder = gw.data_dir / "identity"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, gw
        assert stat.S_IMODE((folder / "key.pem").stat().st_mode) == 0o600, gw
        assert (folder / "cert.pem").is_file()


# A client in A's namespace: a plain HTTP request to a port; what came back before the
# close (hex), or "timeout".
PLAIN = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
got = b""
try:
    while data := s.recv(4096):
        got += data
    print("closed", got.hex())
except TimeoutError:
    print("timeout", got.hex())
"""


@pytest.mark.skipif(shutil.which("openssl") is None, reason="NO TLS VERSION TEST: openssl "
                    "is not installed (scripts/test installs it)")
async def test_the_node_port_takes_tls13_only(hosts: Hosts) -> None:
    lan = hosts.run.lan
    health = await hosts.b.get_json("/health", via="unix")
    where = f"{lan.addr['b']}:{health['nodePort']}"

    def s_client(*args: str) -> subprocess.CompletedProcess[str]:
        return lan.run("a", ["openssl", "s_client", "-connect", where, *args], stdin="",
                       check=False)

    old = await trio.to_thread.run_sync(s_client, "-tls1_2")
    assert old.returncode != 0, old.stdout
    assert "CONNECTED" in old.stdout  # TCP went through; the handshake did not
    assert "alert protocol version" in old.stderr, old.stderr
    assert "BEGIN CERTIFICATE" not in old.stdout  # refused before any certificate
    new = await trio.to_thread.run_sync(s_client, "-tls1_3", "-showcerts")
    assert new.returncode == 0, new.stdout + new.stderr
    assert "New, TLSv1.3" in new.stdout
    # B asked for a client certificate (a CertificateRequest), and took none.
    assert "Requested Signature Algorithms" in new.stdout
    pems = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", new.stdout,
                      re.S)
    assert len(pems) == 1, new.stdout  # B's own, self-signed
    der = ssl.PEM_cert_to_DER_cert(pems[0])
    assert f"sha256:{hashlib.sha256(der).hexdigest()}" == health["identity"]
    plain = await trio.to_thread.run_sync(
        lambda: lan.run("a", [sys.executable, "-c", PLAIN, lan.addr["b"],
                              str(health["nodePort"])]).stdout.split())
    assert plain[0] == "closed", plain
    got = bytes.fromhex(plain[1]) if len(plain) > 1 else b""
    assert b"HTTP/" not in got, got
    assert "Traceback" not in hosts.b.log()


async def test_pairing_through_a_man_in_the_middle_fails(hosts: Hosts, relay: Relay) -> None:
    a, b = hosts.a, hosts.b
    code = await trio.to_thread.run_sync(hosts.code)
    assert await hosts.tries_left() == 5
    said = await trio.to_thread.run_sync(hosts.nodes_add, relay.url, code)
    assert said.returncode != 0, said.stdout
    assert "not accepted" in said.stdout + said.stderr
    assert await hosts.tries_left() == 4
    # The same through the API: 422 naming the code, one more try spent.
    reply = await a.call("POST", NODES, {"baseUrl": relay.url, "pairingCode": code},
                         via="unix", admin=True)
    assert (reply.status, error_of(reply)["param"]) == (422, "pairingCode"), reply.body
    assert await hosts.tries_left() == 3
    assert await a.get_json(NODES, via="unix") == []
    assert await b.get_json("/api/v1/pairing/peers", via="unix", admin=True) == []
    assert await b.get_json("/api/v1/access-keys", via="unix", admin=True) == []
    # The relay was in the middle of both exchanges, and saw neither the code nor a key.
    seen = relay.seen()
    exchanges = [s for name, s in seen.items() if name.endswith("-tls-up")]
    assert len(exchanges) == 2, relay.said()
    assert all(b"POST /api/v1/pairing/exchange" in s for s in exchanges)
    for name, stream in seen.items():
        assert code.encode() not in stream, name
        assert b"accessKey" not in stream, name
    assert code not in a.log() + b.log()


async def test_no_downgrade_to_the_clear_text_claim(hosts: Hosts, downgrader: Relay) -> None:
    """A relay that hides B's node port gets no code: A refuses to pair across the network
    without the TLS exchange (the §14 claim would send the code in clear)."""
    a = hosts.a
    code = await trio.to_thread.run_sync(hosts.code)
    before = await hosts.tries_left()
    reply = await a.call("POST", NODES, {"baseUrl": downgrader.url, "pairingCode": code},
                         via="unix", admin=True)
    assert (reply.status, error_of(reply)["param"]) == (422, "baseUrl"), reply.body
    assert "no node port" in error_of(reply)["message"]
    assert await hosts.tries_left() == before
    assert await a.get_json(NODES, via="unix") == []
    seen = downgrader.seen()
    assert seen, downgrader.said()  # it was asked (GET /health) ...
    for name, stream in seen.items():  # ... and saw no claim, no code
        assert b"/api/v1/pairing/claim" not in stream, name
        assert code.encode() not in stream, name


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="NO TLS CAPTURE TEST: tcpdump "
                    "is not installed (scripts/test installs it)")
async def test_a_passive_capture_holds_no_secret(hosts: Hosts, figures: Figures) -> None:
    run, a, b = hosts.run, hosts.a, hosts.b
    health = await b.get_json("/health", via="unix")
    node_port = health["nodePort"]
    file = run.folder / "a.pcap"
    capture = await trio.to_thread.run_sync(run.capture, "a", file)
    code = await hosts.pair()
    [node] = await a.get_json(NODES, via="unix")
    assert (node["fingerprint"], node["link"], node["pin"], node["baseUrl"]) == (
        b.fingerprint, "pinned", health["identity"], hosts.b_url)
    await a.wait_nodes({b.fingerprint: ["b-model"]})
    asked = sum(PROMPT.encode() in r.body for r in hosts.model.requests_to(CHAT))
    answers = []
    for streamed in (True, False):
        body = chat_body("b-model", streamed, messages=[{"role": "user", "content": PROMPT}])
        direct = await request(hosts.model.url, "POST", CHAT, body)
        got = await hosts.chat(streamed)
        assert (got.status, got.header("x-sluice-served-by")) == (200,
                                                                 f"node:{b.fingerprint}")
        assert got.body == direct.body  # byte for byte B's model server's
        assert ANSWER.encode() in got.body
        answers.append(got.body)
    # Both crossed the link (B's model server got the prompt from B, through A).
    assert sum(PROMPT.encode() in r.body for r in hosts.model.requests_to(CHAT)) == asked + 4
    node_key = hosts.node_key()
    counts = await trio.to_thread.run_sync(capture.stop)
    data = file.read_bytes()

    secret = {"prompt": PROMPT, "answer": ANSWER, "node key": node_key, "code": code,
              "A's admin token": a.admin_token, "B's admin token": b.admin_token}
    for what, text in secret.items():
        assert text.encode() not in data, f"the capture holds the {what}"
    for text in INSIDE_TLS:
        assert text.encode() not in data, f"{text} in the clear"
    # What was captured: B's API port in the clear (GET /health: the search works), and
    # TLS on its node port.
    segments = pcap.segments(data)
    assert counts.get("captured") == sum(1 for _ in pcap.packets(data)) > 0, counts
    assert counts.get("dropped") == 0, counts
    b_node = (run.lan.addr["b"], node_port)
    b_api = (run.lan.addr["b"], b.port)
    assert b"GET /health HTTP/1.1" in data
    flows = pcap.streams(segments)
    # The pairing's connection and the pinned link (at least), each way.
    links = sorted({src for src, dst in flows if dst == b_node and (b_node, src) in flows})
    assert len(links) >= 2, links
    sent = received = 0
    for way in [(src, b_node) for src in links] + [(b_node, src) for src in links]:
        stream = flows[way]
        records = pcap.tls_records(stream)
        kinds = [kind for kind, _ in records]
        assert kinds[0] == pcap.HANDSHAKE, way
        if way[0] == b_node:
            assert pcap.server_hello_version(records[0][1]) == pcap.TLS13, way
        first_data = kinds.index(pcap.APPLICATION_DATA)
        assert set(kinds[:first_data]) <= {pcap.HANDSHAKE, pcap.CHANGE_CIPHER_SPEC}, way
        assert set(kinds[first_data:]) == {pcap.APPLICATION_DATA}, way  # all encrypted
        assert len(stream) - sum(5 + len(f) for _, f in records) < MAX_RECORD, way
        encrypted = sum(len(f) for kind, f in records if kind == pcap.APPLICATION_DATA)
        if way[0] == b_node:
            received += encrypted
        else:
            sent += encrypted
    assert received > sum(map(len, answers))
    figures.note("lan_tls_capture", {
        "bytes": len(data), "packets": counts["captured"], "dropped": counts["dropped"],
        "tls_connections_to_node_port": len(links),
        "node_port_packets": sum(1 for s in segments if b_node in (s.src, s.dst)),
        "tls_application_bytes_a_to_b": sent, "tls_application_bytes_b_to_a": received,
        "plain_api_port_bytes": sum(len(s) for w, s in flows.items() if b_api in w),
        "searched_for": [*sorted(secret), *INSIDE_TLS], "found": 0})


async def test_a_pinned_node_moved_behind_a_man_in_the_middle_is_refused(
        hosts: Hosts, relay: Relay) -> None:
    a, b, fp = hosts.a, hosts.b, hosts.b.fingerprint
    if not await a.get_json(NODES, via="unix"):  # the capture test skipped: pair here
        await hosts.pair()
    await a.wait_nodes({fp: ["b-model"]}, WITHIN)
    before = set(relay.seen())
    chats = len(hosts.model.requests_to(CHAT))
    moved = await a.call("PATCH", f"{NODES}/{fp}", {"baseUrl": relay.url}, via="unix",
                         admin=True)
    assert moved.status == 200, moved.body
    assert moved.json()["pin"] == (await b.get_json("/health", via="unix"))["identity"]

    async def refused() -> bool:
        return (await hosts.node_state()).get("lastError") == "node_identity_changed"

    await a.wait_until(refused, "the relay's certificate refused", WITHIN)
    assert (await hosts.node_state())["status"] == "offline"
    notes = (await a.get_json("/api/v1/notifications", via="unix"))["notifications"]
    [changed] = [n for n in notes if n["code"] == "node_identity_changed"]
    assert relay.pin in changed["message"]
    failed = await hosts.chat(False)
    assert failed.status != 200, failed.body
    assert len(hosts.model.requests_to(CHAT)) == chats  # not served by B
    # A asked the relay for the node port, then ended its handshake at the certificate.
    assert "the handshake with the gateway that connected failed" in relay.said()
    new = {name: s for name, s in relay.seen().items() if name not in before}
    assert [name for name in new if "-tls-" in name] == [], relay.said()
    assert any(name.endswith("-plain-up") for name in new), relay.said()
    assert all(s.startswith(b"GET /health ") for n, s in new.items() if n.endswith("-up"))
    key = hosts.node_key().encode()
    for name, stream in relay.seen().items():
        assert PROMPT.encode() not in stream, name
        assert key not in stream, name
        assert CHAT.encode() not in stream, name
    # Back at B's own address the pin checks again: B serves.
    back = await a.call("PATCH", f"{NODES}/{fp}", {"baseUrl": hosts.b_url}, via="unix",
                        admin=True)
    assert back.status == 200, back.body
    await a.wait_nodes({fp: ["b-model"]}, WITHIN)
    served = await hosts.chat(False)
    assert (served.status, served.header("x-sluice-served-by")) == (200, f"node:{fp}")
