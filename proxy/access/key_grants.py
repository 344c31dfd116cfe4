"""Access keys with limits on the request path (SPEC §13): what a request that presented a
known key may do (a :class:`Grant`, made by :func:`proxy.access.auth.authorize` and carried by the
request's :class:`~proxy.exchange.Exchange`), and the keys' runtime state, the token bucket
of each key with an ``rpm`` (:class:`KeyGrants`, one per gateway, in the context).

The rules are pure (:mod:`protocol.key_limits`); this module reads the clocks: the trio
clock for the buckets (so tests run on MockClock), the wall clock for expiry, through
:attr:`KeyGrants.wall`, the seam tests replace. A request without a key never gets here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from protocol.access import key_expired, model_not_allowed, rate_limited
from protocol.key_limits import KeyLimits, TokenBucket, retry_after
from proxy import timestamps

if TYPE_CHECKING:
    from proxy.access.key_store import AccessKey

__all__ = ["Grant", "KeyGrants"]


@attrs.frozen
class Grant:
    """A request's access key (its id, never the key) and that key's limits as they were
    when the request was authorized."""

    key_id: str
    limits: KeyLimits


class KeyGrants:
    """The access keys' runtime state: one token bucket per key with an ``rpm``, made at
    the key's first limited request (full), kept while the key exists."""

    __slots__ = ("_buckets", "wall")

    def __init__(self, wall: Callable[[], float] = timestamps.wall) -> None:
        self.wall = wall  # seconds since the epoch: the seam for expiry tests
        self._buckets: dict[str, TokenBucket] = {}

    def __repr__(self) -> str:
        return f"KeyGrants(buckets={len(self._buckets)})"

    def grant(self, key: AccessKey) -> Grant:
        """The grant of a known key (its record as it is now: a later change of the key
        makes a new record, not a change of this one); raises 401 ``key_expired`` past its
        expiry."""
        limits = key.limits
        if limits.expires is not None and limits.expired(self.wall()):
            raise key_expired(limits.expires_at or "")
        return Grant(key.id, limits)

    def check_model(self, grant: Grant, asked: str, served: str | None = None) -> None:
        """403 ``model_not_allowed`` unless the key may use ``asked`` or the model it is
        served as (``served``: an alias's target, SPEC §12)."""
        limits = grant.limits
        if limits.models is None or limits.allows(asked):
            return
        if served is None or served == asked or not limits.allows(served):
            raise model_not_allowed(asked)

    def admit(self, grant: Grant, asked: str, served: str) -> None:
        """A request for a model: the model check, then one request from the key's
        bucket (429 ``rate_limit_exceeded`` with ``Retry-After`` when it is empty)."""
        limits = grant.limits
        if limits.models is not None:
            self.check_model(grant, asked, served)
        rpm = limits.rpm
        if rpm is None:
            return
        now = trio.current_time()
        bucket = self._buckets.get(grant.key_id)
        if bucket is None:
            bucket = self._buckets[grant.key_id] = TokenBucket(rpm, now)
        wait = bucket.take(rpm, now)
        if wait:
            raise rate_limited(rpm, retry_after(wait))

    def forget(self, key_id: str) -> None:
        """Drop a revoked key's bucket."""
        self._buckets.pop(key_id, None)
