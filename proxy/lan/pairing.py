"""Pairing on the computer to add (SPEC §14): its one pairing code and the claims against
it, on trio's clock (so tests run on MockClock). The rules are pure
(:mod:`protocol.lan.pairing`); this module reads the clocks, keeps the wall-clock expiry the
API shows, logs (never a code, never a key) and publishes each change as a ``pairing``
event (its payload the ``GET /api/v1/pairing`` body, plus ``name`` once claimed).

One :class:`Pairing` per gateway (``ctx.pairing``). Nothing is kept on disk: a restart
forgets the code, which is what a one-time code that lives 5 minutes should do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from protocol.lan.pairing import (
    CODE_LIFETIME,
    Claim,
    ClaimRateLimit,
    CodeState,
    Outcome,
    PairingState,
    claim_rate_limited,
    code_not_accepted,
    new_code,
)
from proxy import timestamps
from proxy.notifications import Notifications
from proxy.observe.hub import Hub

__all__ = ["Pairing"]

log = logging.getLogger("sluice.pairing")

NOTIFICATION = "pairing_claimed"


class Pairing:
    """The gateway's pairing code and the claim budget of each peer address."""

    __slots__ = ("_expires_at", "_hub", "_limit", "_notifications", "_state", "wall")

    def __init__(self, hub: Hub | None = None, notifications: Notifications | None = None,
                 *, wall: Callable[[], float] = timestamps.wall) -> None:
        self.wall = wall  # seconds since the epoch, for the expiry the API shows
        self._hub = hub
        self._notifications = notifications
        self._state = PairingState()
        self._limit = ClaimRateLimit()
        self._expires_at: str | None = None  # the current code's expiry, ISO 8601 UTC

    def __repr__(self) -> str:
        return f"Pairing({self._state!r}, {self._limit!r})"

    def view(self) -> dict[str, Any]:
        """The ``GET /api/v1/pairing`` body (never the code): ``active``, ``state`` (none,
        active, claimed, expired, void, cancelled), ``expiresAt``, ``triesLeft`` and
        ``name`` (the computer that claimed it, once claimed)."""
        code = self._state.view(trio.current_time())
        if code is None:
            return {"active": False, "state": CodeState.NONE.value, "expiresAt": None,
                    "triesLeft": None, "name": None}
        active = code.state is CodeState.ACTIVE
        return {"active": active, "state": code.state.value, "expiresAt": self._expires_at,
                "triesLeft": code.tries_left if active else 0, "name": code.claimed_by}

    def _publish(self) -> None:
        hub = self._hub
        if hub is not None and hub.wants("pairing"):
            hub.publish("pairing", self.view())

    def issue(self) -> dict[str, Any]:
        """A new code, valid CODE_LIFETIME seconds; it replaces an earlier one. The answer
        of ``POST /api/v1/pairing``: ``{code, expiresAt, replaced}`` (the one place the
        code is shown)."""
        issued = self._state.issue(new_code(), trio.current_time(), CODE_LIFETIME)
        self._expires_at = timestamps.iso_second(self.wall() + CODE_LIFETIME)
        log.info("a pairing code was made, valid until %s%s", self._expires_at,
                 " (it replaces the earlier one)" if issued.replaced else "")
        self._publish()
        return {"code": issued.code, "expiresAt": self._expires_at, "replaced": issued.replaced}

    def cancel(self) -> bool:
        """End the active code; False when there was none."""
        cancelled = self._state.cancel(trio.current_time())
        if cancelled:
            log.info("the pairing code was cancelled")
            self._publish()
        return cancelled

    def admit(self, peer: str) -> None:
        """One claim from ``peer`` (an IP address; "" for a local client), before its body
        is looked at: 429 with ``Retry-After`` when it is over its claims a minute."""
        retry = self._limit.take(peer or "local", trio.current_time())
        if retry is not None:
            log.info("a pairing claim from %s was refused: over %d claims a minute",
                     peer or "a local client", self._limit.rate)
            raise claim_rate_limited(retry)

    def claim(self, claim: Claim, peer: str) -> None:
        """Check the claim's code: returns when it is accepted (the code is used from now
        on), raises the one 401 otherwise."""
        outcome = self._state.claim(claim.code, trio.current_time(), claim.key_name)
        who = peer or "a local client"
        if outcome is Outcome.ACCEPTED:
            log.info("pairing code claimed by %s (%s) from %s", claim.key_name,
                     claim.fingerprint, who)
            return
        if outcome is Outcome.NO_CODE:
            log.info("a pairing claim from %s was refused: no code is active", who)
        else:
            code = self._state.view(trio.current_time())
            left = code.tries_left if code is not None else 0
            log.info("a pairing claim from %s was refused: wrong code (%s)", who,
                     f"{left} tries left" if outcome is Outcome.WRONG else "the code is void now")
            self._publish()
        raise code_not_accepted()

    def paired(self, name: str, key_id: str) -> None:
        """The claim's access key is saved: tell the user (a notification, info level,
        and the ``pairing`` event of the claimed code)."""
        log.info("access key %s made for %s", key_id, name)
        self._publish()
        if self._notifications is not None:
            self._notifications.raise_(NOTIFICATION, f"{name} connected with a pairing code",
                                       level="info")
