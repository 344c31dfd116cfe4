"""Pairing on the computer that adds, by SPEC §16: the code is proved with SPAKE2 over the
other computer's node listener (TLS 1.3), so it never crosses the network, and the access
key comes back inside that TLS link.

1. ``GET {baseUrl}/health`` (plain, no secret) says the other side's ``nodePort``; without
   one (an older sluice, or one without external access) the caller falls back to §14's
   claim (:mod:`proxy.lan.pairing_client`).
2. A TLS 1.3 connection to that port without a client certificate (ours is not trusted
   there yet): :func:`proxy.link.tls.open_for_pairing`, the handshake and HTTP/1.1 client
   of every other upstream; the certificate the other side presents is the one we will pin.
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
from typing import Any

import attrs
import trio

from protocol.errors import ConfigError, upstream_bad_response, upstream_unreachable
from protocol.headers import Header
from protocol.lan.pake import Joiner, PairingProtocolError, parse_welcome
from protocol.lan.pinning import health_node_port
from protocol.upstream_url import UpstreamAddress
from proxy.lan.pairing_client import ANSWER_CAP, NOT_ACCEPTED, answer_error, ask
from proxy.link.identity import Identity
from proxy.link.tls import open_for_pairing
from proxy.upstream.connection import UpstreamConnection, UpstreamFailure
from proxy.upstream.pool import ConnectionPool

__all__ = ["JOIN_TIMEOUT", "Joined", "join", "node_port_of"]

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


async def node_port_of(connections: ConnectionPool, address: UpstreamAddress, url: str, *,
                       connect_timeout: float) -> int | None:
    """The other gateway's node port from its ``GET /health``; None when it has none."""
    headers: list[Header] = [(b"host", address.authority), (b"accept", b"application/json")]
    status, _, body = await ask(connections, address, url, b"GET", b"/health", headers, b"",
                                connect_timeout=connect_timeout)
    return health_node_port(body) if status == 200 else None


async def _post(conn: UpstreamConnection, doc: dict[str, Any]) -> tuple[int, bytes]:
    """One JSON POST of the exchange over ``conn``: ``(status, body)``; the connection is
    ready for the next one after it."""
    body = json.dumps(doc).encode()
    await conn.send_request(b"POST", EXCHANGE_PATH, [
        (b"host", conn.address.authority), (b"content-type", b"application/json"),
        (b"accept", b"application/json"), (b"content-length", str(len(body)).encode())],
        body)
    head = await conn.receive_head()
    answer = await conn.receive_body(ANSWER_CAP)
    if conn.reusable:
        conn.recycle()
    return head.status_code, answer


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


async def _run(conn: UpstreamConnection, host_pin: str, url: str, code: str,
               identity: Identity, node_id: str, name: str) -> Any:
    """The two steps over a TLS link to a node that showed the certificate of
    ``host_pin``: its welcome."""
    joiner = Joiner(code, identity.fingerprint, host_pin)
    first = {"step": 1, "message": await trio.to_thread.run_sync(joiner.start),
             "fingerprint": identity.fingerprint,
             "certificate": base64.b64encode(identity.der).decode()}
    if name:
        first["name"] = name
    status, body = await _post(conn, first)
    reply = _message_of(status, body, url, 1).get("message")
    if not isinstance(reply, str):
        raise upstream_bad_response(f"{url} answered step 1 of the pairing exchange without "
                                    "a message")
    try:
        confirmation = await trio.to_thread.run_sync(joiner.finish, reply)
    except PairingProtocolError:
        raise upstream_bad_response(f"{url} answered step 1 of the pairing exchange with "
                                    "something that is not a SPAKE2 message") from None
    status, body = await _post(conn, {
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
    return welcome


async def join(address: UpstreamAddress, node_port: int, url: str, *, code: str,
               identity: Identity, node_id: str, name: str,
               connect_timeout: float) -> Joined:
    """Pair with the gateway at ``address``'s host, node port ``node_port``: what it gave
    (see :class:`Joined`). Raises the SluiceError this gateway answers ``POST
    /api/v1/nodes`` with (422 ``pairingCode`` for a code not accepted, 429, 502)."""
    node = UpstreamAddress(host=address.host, port=node_port, unix_path=None, base_path="")
    with trio.move_on_after(JOIN_TIMEOUT) as scope:
        try:
            conn, pin = await open_for_pairing(node, connect_timeout)
        except (UpstreamFailure, trio.TooSlowError) as exc:
            log.info("pairing with %s failed: no TLS link to port %d (%s)", url, node_port,
                     type(exc).__name__)
            raise upstream_unreachable(f"cannot pair with {url}: no TLS 1.3 link to its "
                                       f"node port {node_port}") from None
        try:
            welcome = await _run(conn, pin, url, code, identity, node_id, name)
        except UpstreamFailure as exc:
            log.info("pairing with %s failed: %s", url, type(exc).__name__)
            raise upstream_unreachable(f"cannot pair with {url}: the link to its node port "
                                       "broke during the exchange") from None
        finally:
            conn.close()
    if scope.cancelled_caught:
        raise upstream_unreachable(f"cannot pair with {url}: no answer within "
                                   f"{JOIN_TIMEOUT:g}s")
    log.info("paired with %s (%s), its certificate %s pinned", url, welcome.node_id, pin)
    return Joined(welcome.node_id, welcome.name, welcome.access_key, pin, node_port)

