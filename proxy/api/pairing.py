"""``/api/v1/pairing`` (SPEC §14), on the computer to add: make, show and cancel the
one-time pairing code (admin token), and ``/api/v1/pairing/claim``, where another computer
trades the code for an access key (no token, no key: its level in the route table is
:attr:`protocol.access.Access.CLAIM`; SPEC §16: served to loopback callers only).

SPEC §16's ``/api/v1/pairing/exchange``: the same trade over the node listener's TLS, as
SPAKE2 in two steps (:mod:`protocol.lan.pake`), so the code never travels; the key made is
bound to the joiner's certificate. ``/api/v1/pairing/peers``: the computers paired so,
each by its certificate's pin; deleting one revokes its key.

The claim's access key is made exactly as ``POST /api/v1/access-keys`` makes one
(:meth:`KeyStore.add`: stored hashed, listed by ``GET /api/v1/access-keys``),
named after the claiming computer. The code and the key are in the answers that carry them
and nowhere else: not in a log line, an error, a notification or an event.
"""

from __future__ import annotations

from typing import Any

from protocol.access import (
    PAIRING_CLAIM_PATH,
    PAIRING_EXCHANGE_PATH,
    PAIRING_PATH,
    exchange_elsewhere,
)
from protocol.errors import SluiceError, Source, bad_request, no_such_item
from protocol.lan.pairing import parse_claim
from protocol.lan.pake import parse_exchange
from protocol.lan.pinning import normalize_pin
from proxy.access.key_store import peer_of
from proxy.api.call import Call, saving
from proxy.lan.pairing_client import computer_name
from proxy.link import peer_checks

__all__ = ["CLAIM_PATH", "EXCHANGE_PATH", "PATH", "PEERS_PATH", "PEERS_PREFIX", "cancel_code",
           "claim_code", "exchange", "list_peers", "make_code", "show_code", "unpair"]

PATH = PAIRING_PATH
CLAIM_PATH = PAIRING_CLAIM_PATH
EXCHANGE_PATH = PAIRING_EXCHANGE_PATH
PEERS_PATH = "/api/v1/pairing/peers"
PEERS_PREFIX = PEERS_PATH + "/"


def show_code(call: Call) -> tuple[int, Any]:
    """``{active, state, expiresAt, triesLeft, name}``, never the code (the admin token,
    even to read: the path is ADMIN_ONLY in :data:`proxy.api.routes.ROUTES`)."""
    return 200, call.ctx.pairing.view()


def make_code(call: Call) -> tuple[int, Any]:
    """A new code (replacing any earlier one): ``{code, expiresAt, replaced}``."""
    if call.json_object(empty_ok=True):
        raise bad_request("POST /api/v1/pairing takes no fields", code="invalid_request")
    return 200, call.ctx.pairing.issue()


def cancel_code(call: Call) -> tuple[int, Any]:
    """End the active code: the GET body after, with ``cancelled`` (false when no code was
    active)."""
    cancelled = call.ctx.pairing.cancel()
    return 200, {**call.ctx.pairing.view(), "cancelled": cancelled}


async def claim_code(call: Call) -> tuple[int, Any]:
    """``{code, fingerprint, name?}`` -> ``{fingerprint, accessKey}``: 429 over the peer's
    claims a minute (before the body is looked at), 422 naming a bad field, 401 for any
    code that is not accepted."""
    ctx = call.ctx
    if call.peer and not peer_checks.peer_is_loopback(call.peer):
        raise SluiceError(403, "a pairing code is claimed over the network only through the "
                               "pairing exchange on the node port (SPEC §16): update the "
                               "other computer's sluice", type="permission_error",
                          code="claim_local_only", source=Source.CLIENT)
    pairing = ctx.pairing
    pairing.admit(call.peer)
    claim = parse_claim(call.json_object())
    pairing.claim(claim, call.peer)  # raises the 401; from here on the code is used
    with saving("the access key"):
        entry, key = await ctx.settings.keys.add(claim.key_name)
    ctx.notifications.clear("external_access_without_keys")
    pairing.paired(claim.key_name, entry["id"])
    return 200, {"fingerprint": ctx.settings.node_id, "accessKey": key}


async def exchange(call: Call) -> tuple[int, Any]:
    """SPEC §16, on the node listener only (elsewhere the access table answers 404): step
    1 ``{step: 1, message, fingerprint, name?, certificate}`` -> ``{message}`` (our SPAKE2
    message); step 2 ``{step: 2, message,
    fingerprint}`` -> ``{message, fingerprint, name, accessKey}``: our key confirmation
    and, only when the joiner's proved the code, the access key made for it, bound to its
    certificate (the joiner trusts the key only once our confirmation checks)."""
    ctx = call.ctx
    identity = ctx.identity
    if identity is None:  # pragma: no cover - the node listener is opened with one only
        raise exchange_elsewhere()
    doc = parse_exchange(call.json_object())
    if doc.step == 1:
        return 200, {"message": await ctx.pairing.begin(doc, call.peer,
                                                        identity.fingerprint)}
    confirmation, begun = ctx.pairing.finish(doc, call.peer)
    with saving("the access key"):
        entry, key = await ctx.settings.keys.add(begun.name,
                                                 peer=(doc.fingerprint, begun.certificate))
    ctx.notifications.clear("external_access_without_keys")
    ctx.pairing.paired(begun.name, entry["id"])
    return 200, {"message": confirmation, "fingerprint": ctx.settings.node_id,
                 "name": computer_name(), "accessKey": key}


def list_peers(call: Call) -> tuple[int, Any]:
    """The computers paired by the exchange: ``[{fingerprint, name, keyId, pairedAt,
    lastUsedAt}]`` (``fingerprint`` = its certificate's pin), in pairing order."""
    peers = []
    for key in call.ctx.settings.keys.all:
        peer = peer_of(key)
        if peer is not None:
            peers.append({"fingerprint": peer[0], "name": key.get("name"), "keyId": key.id,
                          "pairedAt": key.get("created_at"),
                          "lastUsedAt": key.get("last_used_at")})
    return 200, peers


async def unpair(call: Call) -> tuple[int, Any]:
    """Forget a paired computer: revoke the key bound to its certificate; its open links
    close and its next handshake is refused. 404 when no peer has that pin."""
    raw = call.path[len(PEERS_PREFIX):]
    pin = normalize_pin(raw)
    keys = call.ctx.settings.keys
    found = [key.id for key in keys.all if (peer := peer_of(key)) and peer[0] == pin]
    if pin is None or not found:
        raise no_such_item("paired computer", "fingerprint", raw[:80])
    with saving("the access keys"):
        for key_id in found:
            await keys.revoke(key_id)
    return 200, {"fingerprint": pin, "unpaired": True}
