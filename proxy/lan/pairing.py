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

import attrs
import trio

from protocol.errors import SluiceError, bad_request
from protocol.lan.pairing import (
    CODE_LIFETIME,
    Claim,
    ClaimRateLimit,
    CodeState,
    Outcome,
    PairingCode,
    PairingState,
    claim_rate_limited,
    code_not_accepted,
    new_code,
)
from protocol.lan.pake import Exchange, HostSession, PairingProtocolError
from proxy import timestamps
from proxy.notifications import Notifications
from proxy.observe.hub import Hub

__all__ = ["Begun", "Pairing"]

log = logging.getLogger("sluice.pairing")

NOTIFICATION = "pairing_claimed"
EXCHANGE_TIME = 60.0  # seconds a begun exchange waits for its step 2
MAX_EXCHANGES = 8  # begun exchanges waiting at once


@attrs.frozen
class Begun:
    """A pairing exchange after its step 1 (SPEC §16): the host's SPAKE2 session, the code
    it runs against, the joiner's certificate DER and name, and until when step 2 may
    come (trio's clock)."""

    session: HostSession = attrs.field(repr=False)
    code: PairingCode = attrs.field(repr=False)
    certificate: bytes = attrs.field(repr=False)
    name: str
    until: float


class Pairing:
    """The gateway's pairing code and the claim budget of each peer address."""

    __slots__ = ("_begun", "_expires_at", "_hub", "_limit", "_notifications", "_state", "wall")

    def __init__(self, hub: Hub | None = None, notifications: Notifications | None = None,
                 *, wall: Callable[[], float] = timestamps.wall) -> None:
        self.wall = wall  # seconds since the epoch, for the expiry the API shows
        self._hub = hub
        self._notifications = notifications
        self._state = PairingState()
        self._limit = ClaimRateLimit()
        self._expires_at: str | None = None  # the current code's expiry, ISO 8601 UTC
        self._begun: dict[str, Begun] = {}  # joiner's pin -> its exchange after step 1

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
        self._settled(outcome, "claim", peer, claim.key_name, claim.fingerprint)

    def _settled(self, outcome: Outcome, what: str, peer: str, name: str,
                 fingerprint: str) -> None:
        """Log a claim's or an exchange's ``outcome``; raise the one 401 unless accepted."""
        if outcome is not Outcome.ACCEPTED:
            raise self._refusal(outcome, what, peer)
        log.info("pairing code %s by %s (%s) from %s",
                 "claimed" if what == "claim" else "proved in an exchange", name,
                 fingerprint, peer or "a local client")

    def _refusal(self, outcome: Outcome, what: str, peer: str) -> SluiceError:
        """Log a refused claim or exchange; the one 401 to raise."""
        who = peer or "a local client"
        if outcome is Outcome.NO_CODE:
            log.info("a pairing %s from %s was refused: no code is active", what, who)
        else:
            code = self._state.view(trio.current_time())
            left = code.tries_left if code is not None else 0
            log.info("a pairing %s from %s was refused: wrong code (%s)", what, who,
                     f"{left} tries left" if outcome is Outcome.WRONG else "the code is void now")
            self._publish()
        return code_not_accepted()

    # -- the exchange of SPEC §16 (host side) ------------------------------------------

    async def begin(self, exchange: Exchange, peer: str, own_pin: str) -> str:
        """Step 1 from the joiner ``exchange.fingerprint``: our SPAKE2 message. Counts
        against ``peer``'s attempts a minute (429); no active code -> the one 401. The
        session waits EXCHANGE_TIME for its step 2 (a new step 1 from the same joiner
        replaces it; at most MAX_EXCHANGES wait at once, the oldest goes first)."""
        self.admit(peer)
        now = trio.current_time()
        code = self._state.view(now)
        if code is None or code.state is not CodeState.ACTIVE:
            raise self._refusal(Outcome.NO_CODE, "exchange", peer)
        session = HostSession(code.value, own_pin, exchange.fingerprint)
        try:  # SPAKE2's arithmetic takes ~20 ms of CPU: off the event loop
            message = await trio.to_thread.run_sync(session.answer, exchange.message)
        except PairingProtocolError:
            raise bad_request("message: not a SPAKE2 message", param="message") from None
        begun = self._begun
        begun.pop(exchange.fingerprint, None)
        begun[exchange.fingerprint] = Begun(session, code, exchange.certificate,
                                            exchange.key_name, now + EXCHANGE_TIME)
        while len(begun) > MAX_EXCHANGES:
            begun.pop(next(iter(begun)))
        return message

    def finish(self, exchange: Exchange, peer: str) -> tuple[str, Begun]:
        """Step 2: our key confirmation and what step 1 brought (the joiner's certificate
        and name) when the joiner's confirmation proves it knows the code (the code is
        used from now on); else one try of the code is spent and the one 401 raised."""
        now = trio.current_time()
        begun = self._begun.pop(exchange.fingerprint, None)
        if begun is None or now >= begun.until:
            raise self._refusal(Outcome.NO_CODE, "exchange", peer)
        try:
            confirmation = begun.session.check(exchange.message)
        except PairingProtocolError:
            confirmation = None
        outcome = self._state.settle(begun.code, confirmation is not None, now, begun.name)
        self._settled(outcome, "exchange", peer, begun.name, exchange.fingerprint)
        assert confirmation is not None
        return confirmation, begun

    def paired(self, name: str, key_id: str) -> None:
        """The claim's access key is saved: tell the user (a notification, info level,
        and the ``pairing`` event of the claimed code)."""
        log.info("access key %s made for %s", key_id, name)
        self._publish()
        if self._notifications is not None:
            self._notifications.raise_(NOTIFICATION, f"{name} connected with a pairing code",
                                       level="info")
