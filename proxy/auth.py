"""Who may ask what (SPEC §5): the per-request decision from the connection's transport,
its peer and the request head. The rules themselves are pure (:mod:`protocol.access`).

- Unix socket: the peer's uid (SO_PEERCRED) must be ours or root; no key ever.
- TCP (``tcp`` API listener and the ``local-tcp`` fallback): the Host/Origin guard; with
  external access, a Host that names this computer passes too (:mod:`proxy.own_host`).
- ``/admin/*``, writes under ``/api/v1/`` and the reads of :data:`ADMIN_READS` (the
  pairing code's state): the admin token, on every listener.
- The ``tcp`` API listener: an access key (or the admin token) from a non-loopback peer,
  and from loopback peers too when ``api.require_auth`` is on. ``GET /health`` and
  preflight ``OPTIONS`` need none.
- ``POST /api/v1/pairing/claim`` (SPEC §14) needs neither (its one-time code is the
  credential; :mod:`proxy.pairing`), only a small body.
- Where no key is needed, a request that carries one of our access keys anyway
  (``sk-sluice-...``: another gateway forwarding with our key, an app given a limited key)
  is held to that key's limits (SPEC §13); any other token there is ignored, unhashed (apps
  send dummy keys).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from protocol.access import (
    KEY_PREFIX,
    PAIRING_PATH,
    admin_token_invalid,
    admin_token_missing,
    api_key_header,
    bearer_token,
    forbidden_host,
    forbidden_origin,
    host_allowed,
    is_loopback_ip,
    key_invalid,
    key_missing,
    open_to_strangers,
    origin_allowed,
    token_equals,
)
from protocol.errors import bad_request
from protocol.pairing import check_claim_body

if TYPE_CHECKING:
    from proxy.context import GatewayContext
    from proxy.key_grants import Grant

log = logging.getLogger("sluice.auth")

Header = tuple[bytes, bytes]
ADMIN_WRITES = frozenset({b"POST", b"PUT", b"PATCH", b"DELETE"})
OPEN_PATHS = frozenset({"/health"})  # liveness: no key needed
# Reads that need the admin token too: whether a pairing code is active, and its tries
# left, are nothing for a holder of an access key to watch (SPEC §14).
ADMIN_READS = frozenset({PAIRING_PATH})
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_is_loopback(host: str) -> bool:
    """Whether a TCP peer address counts as this machine (the seam tests replace to play a
    remote client without sending traffic off the machine)."""
    return is_loopback_ip(host)


def uid_allowed(uid: int, our_uid: int) -> bool:
    return uid in (our_uid, 0)


def unix_peer(sock: trio.socket.SocketType) -> tuple[int, int] | None:
    """(pid, uid) of a Unix-socket peer; None where SO_PEERCRED does not exist."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux; the 0700 folder still guards
        return None
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option,
                                                      _PEERCRED.size))
    return pid, uid


def unix_peer_allowed(sock: trio.socket.SocketType) -> bool:
    """The SO_PEERCRED check; a refusal is logged at INFO (uid and pid only)."""
    peer = unix_peer(sock)
    if peer is None:  # pragma: no cover - see unix_peer
        return True
    pid, uid = peer
    if uid_allowed(uid, os.getuid()):
        return True
    log.info("refused a Unix-socket client: pid %d runs as uid %d, neither ours (%d) nor root",
             pid, uid, os.getuid())
    return False


def needs_admin(method: bytes, path: str) -> bool:
    return path == "/admin" or path.startswith("/admin/") or \
        (path.startswith("/api/v1/") and (method in ADMIN_WRITES or path in ADMIN_READS))


def _values(headers: Sequence[Header], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def guard(ctx: GatewayContext, transport: str, headers: Sequence[Header]) -> bytes | None:
    """The DNS-rebinding guard (TCP only); returns the request's Origin when CORS answers
    may name it, else None. Raises 403 for a refused Host or Origin."""
    api = ctx.config.api
    tcp = transport != "unix"
    if tcp:
        hosts = _values(headers, b"host")
        if len(hosts) > 1:
            raise bad_request("a request must carry one Host header", code="bad_http_request")
        host = hosts[0] if hosts else None
        if not host_allowed(host, api.allowed_hosts) and not (
                host is not None and api.allow_external_access and ctx.own_host.allows(host)):
            raise forbidden_host()  # our own address or <name>.local pass (SPEC §14)
    origins = _values(headers, b"origin")
    if not origins:
        return None
    if len(origins) == 1 and origin_allowed(origins[0], api.allowed_origins):
        return origins[0]
    if tcp:
        raise forbidden_origin()
    return None


def _presented(headers: Sequence[Header]) -> str | None:
    """The credential a request carries: ``Authorization: Bearer``, else ``x-api-key``
    (Anthropic's clients, SPEC §12)."""
    token = bearer_token(_values(headers, b"authorization"))
    if token is None:
        token = api_key_header(_values(headers, b"x-api-key"))
    return token


def _offered_key(ctx: GatewayContext, headers: Sequence[Header]) -> Grant | None:
    """Where no key is needed: the grant of one of our access keys if the request carries
    one; None for no token or any other (never hashed unless it looks like ours)."""
    for name, _ in headers:  # most requests here carry no credential: one pass, no parse
        if name == b"authorization" or name == b"x-api-key":
            break
    else:
        return None
    token = _presented(headers)
    if token is None or not token.startswith(KEY_PREFIX):
        return None
    key = ctx.settings.keys.find(token)
    return None if key is None else ctx.key_grants.grant(key)


def authorize(ctx: GatewayContext, transport: str, loopback_peer: bool, method: bytes,
              path: str, headers: Sequence[Header]) -> Grant | None:
    """The admin token and access-key checks; raises 401/403 (401 ``key_expired`` for a
    key past its expiry). Returns the grant of the access key the request used (the caller
    records its use: :meth:`KeyStore.used`, and holds the request to its limits), else
    None."""
    if method == b"OPTIONS":  # a preflight carries no credentials
        return None
    if open_to_strangers(method, path):  # a pairing claim (SPEC §14): its code is its key
        check_claim_body(headers)
        return None
    admin_call = needs_admin(method, path)
    if not admin_call and (transport != "tcp" or path in OPEN_PATHS or
                           (loopback_peer and not ctx.config.api.require_auth)):
        return None if path in OPEN_PATHS else _offered_key(ctx, headers)
    settings = ctx.settings
    token = _presented(headers)
    admin = settings.secrets.admin_token
    if admin_call:
        if token is None:
            raise admin_token_missing()
        if not token_equals(token, admin):
            raise admin_token_invalid()
        return None
    if token is None:
        raise key_missing()
    if token_equals(token, admin):
        return None
    key = settings.keys.find(token)
    if key is None:
        raise key_invalid()
    return ctx.key_grants.grant(key)
