"""``/api/v1/pairing`` (SPEC §14), on the computer to add: make, show and cancel the
one-time pairing code (admin token), and ``/api/v1/pairing/claim``, where another computer
trades the code for an access key (no token, no key: its level in the route table is
:attr:`protocol.access.Access.CLAIM`).

The claim's access key is made exactly as ``POST /api/v1/access-keys`` makes one
(:meth:`KeyStore.add`: stored hashed, listed by ``GET /api/v1/access-keys``),
named after the claiming computer. The code and the key are in the answers that carry them
and nowhere else: not in a log line, an error, a notification or an event.
"""

from __future__ import annotations

from typing import Any

from protocol.access import PAIRING_CLAIM_PATH, PAIRING_PATH
from protocol.errors import bad_request
from protocol.lan.pairing import parse_claim
from proxy.api.call import Call, saving

__all__ = ["CLAIM_PATH", "PATH", "cancel_code", "claim_code", "make_code", "show_code"]

PATH = PAIRING_PATH
CLAIM_PATH = PAIRING_CLAIM_PATH


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
    pairing = ctx.pairing
    pairing.admit(call.peer)
    claim = parse_claim(call.json_object())
    pairing.claim(claim, call.peer)  # raises the 401; from here on the code is used
    with saving("the access key"):
        entry, key = await ctx.settings.keys.add(claim.key_name)
    ctx.notifications.clear("external_access_without_keys")
    pairing.paired(claim.key_name, entry["id"])
    return 200, {"fingerprint": ctx.settings.node_id, "accessKey": key}
