"""Who may ask what (SPEC §5): the I/O side of the per-request decision. The rules are pure:
the DNS-rebinding guard is :mod:`protocol.rebinding`, who may call each path is the route
table's (:func:`proxy.api.routes.access_level`), and the decision for a request at its level
is :func:`protocol.access.authorize`; this module feeds them what the connection and the
settings know.

- Unix socket: the peer's uid (SO_PEERCRED) must be ours or root (asked by its
  :class:`~proxy.link.listener.Listener`); no key ever.
- TCP (every listener but the Unix socket): the Host/Origin guard; with external access, a
  Host that names this computer passes too (:mod:`proxy.lan.own_host`).
- The decision is the access table's (:func:`protocol.access.authorize`), in the column of
  the listener the request came on; on the node listener (SPEC §16) with the access key
  bound to the client's certificate pin in ``ctx.node_peers``.
- The admin token and the access keys come from the settings (secrets.yaml); a key the
  request used comes back as its :class:`~proxy.access.key_grants.Grant` (a key past its expiry:
  401 ``key_expired``), which the caller records and holds the request to (SPEC §13).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from protocol.access import Access
from protocol.access import authorize as decide
from protocol.errors import bad_request
from protocol.headers import Header
from protocol.rebinding import (
    forbidden_host,
    forbidden_origin,
    host_allowed,
    origin_allowed,
)

if TYPE_CHECKING:
    from proxy.access.key_grants import Grant
    from proxy.context import GatewayContext
    from proxy.link.listener import Peer

log = logging.getLogger("sluice.auth")


def _values(headers: Sequence[Header], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def guard(ctx: GatewayContext, tcp: bool, headers: Sequence[Header]) -> bytes | None:
    """The DNS-rebinding guard (``tcp``: the listener's host guard, every TCP listener's);
    returns the request's Origin when CORS answers may name it, else None. Raises 403 for
    a refused Host or Origin (a refused Origin on TCP only)."""
    api = ctx.config.api
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


def authorize(ctx: GatewayContext, peer: Peer, level: Access,
              headers: Sequence[Header]) -> Grant | None:
    """The admin token and access-key checks for a request at ``level`` from ``peer``
    (:func:`protocol.access.authorize` in its listener's column, with the admin token,
    ``api.require_auth``, the stored keys of the moment and, for a client certificate, the
    key bound to it); raises 401/403/404/413 (401 ``key_expired`` for a key past its
    expiry). Returns the grant of the access key the request used (the caller records its
    use: :meth:`KeyStore.used`, and holds the request to its limits), else None."""
    settings = ctx.settings
    bound = None  # the key bound to the client's certificate (the node listener's)
    if peer.certificate is not None and (peers := ctx.node_peers) is not None:
        bound = peers.key_id_for(peer.certificate)
    key = decide(level, peer.listener.column, headers, loopback=peer.loopback,
                 require_auth=ctx.config.api.require_auth,
                 admin_token=settings.secrets.admin_token, find_key=settings.keys.find,
                 bound_key_id=bound)
    return None if key is None else ctx.key_grants.grant(key)
