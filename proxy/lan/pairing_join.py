"""Pairing on the computer that adds, by SPEC §16: the code is proved with SPAKE2 over the
other computer's node listener (TLS 1.3), so it never crosses the network, and the access
key comes back inside that TLS link.

1. ``GET {baseUrl}/health`` (plain, no secret) says the other side's ``nodePort``; without
   one (an older sluice, or one without external access) the caller falls back to §14's
   claim (:mod:`proxy.lan.pairing_client`).
2. A TLS 1.3 connection to that port without a client certificate (ours is not trusted
   there yet); the certificate the other side presents is the one we will pin.
3. Two ``POST /api/v1/pairing/exchange`` round trips (:class:`protocol.lan.pake.Joiner`,
   both pins as identities); only when the other side's key confirmation checks do we
   trust its answer: its node id, name and the access key it made for us.

A man in the middle who presents his own certificate makes us compute with his pin: the
other side's check fails (one of its 5 tries spent) and nothing is pinned. The code and the
key never reach a log line or an error message.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
from typing import Any

import attrs
import h11
import trio

from protocol.errors import ConfigError, upstream_bad_response, upstream_unreachable
from protocol.headers import Header
from protocol.lan.pake import Joiner, PairingProtocolError, parse_welcome
from protocol.lan.pinning import fingerprint_of, health_node_port
from protocol.upstream_url import UpstreamAddress
from proxy.lan.identity import Identity
from proxy.lan.pairing_client import ANSWER_CAP, NOT_ACCEPTED, answer_error, ask
from proxy.upstream.pool import ConnectionPool

__all__ = ["JOIN_TIMEOUT", "Joined", "join", "node_port_of", "pairing_context"]

log = logging.getLogger("sluice.pairing")

JOIN_TIMEOUT = 15.0  # seconds, at most, for the whole exchange (two SPAKE2 steps)
EXCHANGE_PATH = b"/api/v1/pairing/exchange"


@attrs.frozen
class Joined:
    """What pairing gave: the other gateway's node id and name, the access key it made for
    us (bound to our certificate), its certificate's pin and its node port."""

    node_id: str
    name: str
    access_key: str = attrs.field(repr=False)
    pin: str
    node_port: int


def pairing_context() -> ssl.SSLContext:
    """TLS 1.3 only, no client certificate, any server certificate: what the server
    presents is checked by the exchange (its pin is an identity of the SPAKE2 run)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def node_port_of(connections: ConnectionPool, address: UpstreamAddress, url: str, *,
                       connect_timeout: float) -> int | None:
    """The other gateway's node port from its ``GET /health``; None when it has none."""
    headers: list[Header] = [(b"host", address.authority), (b"accept", b"application/json")]
    status, _, body = await ask(connections, address, url, b"GET", b"/health", headers, b"",
                                connect_timeout=connect_timeout)
    return health_node_port(body) if status == 200 else None


async def _post(stream: trio.abc.Stream, conn: h11.Connection, host: bytes,
                doc: dict[str, Any]) -> tuple[int, bytes]:
    """One JSON POST of the exchange over ``stream``: ``(status, body)``."""
    body = json.dumps(doc).encode()
    request = h11.Request(method=b"POST", target=EXCHANGE_PATH, headers=[
        (b"host", host), (b"content-type", b"application/json"),
        (b"accept", b"application/json"), (b"content-length", str(len(body)).encode())])
    await stream.send_all(conn.send(request) + conn.send(h11.Data(data=body))
                          + conn.send(h11.EndOfMessage()))
    status, chunks, size = 0, [], 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > ANSWER_CAP:
                raise ValueError("answer too large")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return status, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise ValueError("the connection closed mid-answer")


def _message_of(status: int, body: bytes, url: str, step: int) -> dict[str, Any]:
    """The JSON object of a 200 answer; the error we answer for anything else."""
    if status != 200:
        raise answer_error(status, [], body, url)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        raise upstream_bad_response(f"{url} answered step {step} of the pairing exchange "
                                    "with something that is not a JSON object")
    return doc


async def _run(stream: trio.SSLStream[trio.SocketStream], host: bytes, url: str, code: str,
               identity: Identity, node_id: str, name: str) -> tuple[Any, str]:
    """The two steps over a TLS stream already shaken hands: (welcome, host pin)."""
    der = stream.getpeercert(binary_form=True)
    if not der:
        raise upstream_bad_response(f"{url} presented no certificate on its node port")
    host_pin = fingerprint_of(der)
    joiner = Joiner(code, identity.fingerprint, host_pin)
    conn = h11.Connection(h11.CLIENT)
    first = {"step": 1, "message": await trio.to_thread.run_sync(joiner.start),
             "fingerprint": identity.fingerprint,
             "certificate": base64.b64encode(identity.der).decode()}
    if name:
        first["name"] = name
    status, body = await _post(stream, conn, host, first)
    reply = _message_of(status, body, url, 1).get("message")
    if not isinstance(reply, str):
        raise upstream_bad_response(f"{url} answered step 1 of the pairing exchange without "
                                    "a message")
    try:
        confirmation = await trio.to_thread.run_sync(joiner.finish, reply)
    except PairingProtocolError:
        raise upstream_bad_response(f"{url} answered step 1 of the pairing exchange with "
                                    "something that is not a SPAKE2 message") from None
    status, body = await _post(stream, conn, host, {
        "step": 2, "message": confirmation, "fingerprint": identity.fingerprint})
    welcome = parse_welcome(_message_of(status, body, url, 2))
    if welcome is None:
        raise upstream_bad_response(f"{url} answered the pairing exchange with something "
                                    "that is not a confirmation and an access key")
    try:
        proved = joiner.confirm(welcome.message)
    except PairingProtocolError:
        proved = False
    if not proved:  # not the computer that showed the code: trust nothing it sent
        log.warning("pairing with %s: its key confirmation did not check; nothing was "
                    "pinned (someone between the two computers?)", url)
        raise ConfigError("pairingCode", NOT_ACCEPTED)
    if welcome.node_id == node_id:
        raise ConfigError("baseUrl", "that URL is this gateway itself")
    return welcome, host_pin


async def join(address: UpstreamAddress, node_port: int, url: str, *, code: str,
               identity: Identity, node_id: str, name: str,
               connect_timeout: float) -> Joined:
    """Pair with the gateway at ``address``'s host, node port ``node_port``: what it gave
    (see :class:`Joined`). Raises the SluiceError this gateway answers ``POST
    /api/v1/nodes`` with (422 ``pairingCode`` for a code not accepted, 429, 502)."""
    host = address.host or ""
    with trio.move_on_after(JOIN_TIMEOUT) as scope:
        try:
            with trio.fail_after(connect_timeout):
                sock = await trio.open_tcp_stream(host, node_port)
                stream = trio.SSLStream(sock, pairing_context(), server_hostname=None)
                await stream.do_handshake()
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            log.info("pairing with %s failed: no TLS link to port %d (%s)", url, node_port,
                     type(exc).__name__)
            raise upstream_unreachable(f"cannot pair with {url}: no TLS 1.3 link to its "
                                       f"node port {node_port}") from None
        try:
            welcome, pin = await _run(stream, _authority(host, node_port), url, code,
                                      identity, node_id, name)
        except (OSError, trio.BrokenResourceError, ValueError, h11.ProtocolError) as exc:
            log.info("pairing with %s failed: %s", url, type(exc).__name__)
            raise upstream_unreachable(f"cannot pair with {url}: the link to its node port "
                                       "broke during the exchange") from None
        finally:
            await trio.aclose_forcefully(stream)
    if scope.cancelled_caught:
        raise upstream_unreachable(f"cannot pair with {url}: no answer within "
                                   f"{JOIN_TIMEOUT:g}s")
    log.info("paired with %s (%s), its certificate %s pinned", url, welcome.node_id, pin)
    return Joined(welcome.node_id, welcome.name, welcome.access_key, pin, node_port)


def _authority(host: str, port: int) -> bytes:
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()
