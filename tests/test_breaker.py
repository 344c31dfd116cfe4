"""The circuit breaker (SPEC §7.4) with explicit times: no clock anywhere."""

from __future__ import annotations

import pytest

from protocol.config import CircuitBreakerConfig
from proxy.routing.breaker import MOVES, BreakerState, CircuitBreaker, Permit

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
TTL = 30.0  # the request's total timeout, bounding a probe


def fail(breaker: CircuitBreaker, now: float) -> None:
    permit = breaker.allow(now, TTL)
    assert permit is not None
    breaker.record_failure(permit, now)


def opened_at(now: float, threshold: int = 3, reset: float = 60.0) -> CircuitBreaker:
    breaker = CircuitBreaker(threshold, reset)
    for _ in range(threshold):
        fail(breaker, now)
    assert breaker.state(now) is OPEN
    return breaker


def probe(breaker: CircuitBreaker, now: float, ttl: float = TTL) -> Permit:
    permit = breaker.allow(now, ttl)
    assert permit is not None
    assert permit.probe
    return permit


def test_the_table_of_legal_moves() -> None:
    expected = {
        CLOSED: {OPEN},
        OPEN: {HALF_OPEN},
        HALF_OPEN: {CLOSED, OPEN},
    }
    assert expected == MOVES
    assert set(MOVES) == set(BreakerState)
    for state, targets in MOVES.items():
        assert state not in targets  # no self-moves: staying put is not a move


@pytest.mark.parametrize(
    ("start", "new"),
    [(s, n) for s in BreakerState for n in BreakerState if n not in MOVES[s]],
    ids=lambda s: s.value,
)
def test_an_illegal_move_is_refused(start: BreakerState, new: BreakerState) -> None:
    breaker = CircuitBreaker(3, 60.0)
    breaker._state = start
    with pytest.raises(AssertionError, match="illegal breaker move"):
        breaker._move(new)


def test_starts_closed_and_hands_out_ordinary_permits() -> None:
    breaker = CircuitBreaker(3, 60.0)
    assert breaker.state(0.0) is CLOSED
    permits = [breaker.allow(0.0, TTL) for _ in range(10)]
    assert all(p is not None and not p.probe for p in permits)
    assert breaker.consecutive_failures == 0
    assert not breaker.is_open(0.0)


def test_opens_at_exactly_the_threshold() -> None:
    breaker = CircuitBreaker(3, 60.0)
    fail(breaker, 1.0)
    fail(breaker, 2.0)
    assert breaker.state(2.0) is CLOSED
    assert breaker.consecutive_failures == 2
    fail(breaker, 3.0)
    assert breaker.state(3.0) is OPEN
    assert breaker.is_open(3.0)
    assert breaker.consecutive_failures == 3
    assert breaker.allow(3.0, TTL) is None
    assert breaker.opens_until(3.0) == 63.0


def test_a_success_resets_the_count() -> None:
    breaker = CircuitBreaker(3, 60.0)
    fail(breaker, 1.0)
    fail(breaker, 2.0)
    ok = breaker.allow(3.0, TTL)
    assert ok is not None
    breaker.record_success(ok, 3.0)
    assert breaker.consecutive_failures == 0
    fail(breaker, 4.0)
    fail(breaker, 5.0)
    assert breaker.state(5.0) is CLOSED  # 2 consecutive, not 4 in total


def test_half_open_exactly_at_reset_timeout() -> None:
    breaker = opened_at(10.0)
    assert breaker.state(69.999) is OPEN
    assert breaker.allow(69.999, TTL) is None
    assert breaker.state(70.0) is HALF_OPEN
    assert not breaker.is_open(70.0)
    assert breaker.opens_until(70.0) is None


def test_one_probe_only_under_ten_concurrent_requests() -> None:
    breaker = opened_at(0.0)
    permits = [breaker.allow(60.0, TTL) for _ in range(10)]
    granted = [p for p in permits if p is not None]
    assert len(granted) == 1
    assert granted[0].probe
    assert breaker.probe_out
    assert breaker.allow(75.0, TTL) is None  # still out, not expired


def test_probe_success_closes() -> None:
    breaker = opened_at(0.0)
    permit = probe(breaker, 60.0)
    breaker.record_success(permit, 61.0)
    assert breaker.state(61.0) is CLOSED
    assert breaker.consecutive_failures == 0
    assert not breaker.probe_out
    assert all(breaker.allow(61.0, TTL) is not None for _ in range(5))


def test_probe_failure_reopens_at_once_for_a_full_reset_timeout() -> None:
    breaker = opened_at(0.0)
    permit = probe(breaker, 60.0)
    breaker.record_failure(permit, 65.0)
    assert breaker.state(65.0) is OPEN
    assert breaker.opens_until(65.0) == 125.0  # from the failure, not from the first opening
    assert breaker.allow(124.9, TTL) is None
    assert breaker.state(125.0) is HALF_OPEN
    probe(breaker, 125.0)


@pytest.mark.parametrize("outcome", ["4xx", "client disconnect"])
def test_a_neutral_probe_outcome_releases_the_probe_only(outcome: str) -> None:
    breaker = opened_at(0.0)
    permit = probe(breaker, 60.0)
    breaker.record_neutral(permit, 61.0)
    assert breaker.state(61.0) is HALF_OPEN  # neither closed nor reopened
    assert breaker.consecutive_failures == 3
    again = probe(breaker, 61.0)  # a new probe may go
    assert again is not permit


def test_neutral_outcomes_do_not_count_while_closed() -> None:
    breaker = CircuitBreaker(2, 60.0)
    fail(breaker, 1.0)
    for _ in range(5):
        permit = breaker.allow(2.0, TTL)
        assert permit is not None
        breaker.record_neutral(permit, 2.0)
    assert breaker.consecutive_failures == 1
    assert breaker.state(2.0) is CLOSED


def test_a_hung_probe_expires_as_a_failure() -> None:
    breaker = opened_at(0.0)
    hung = probe(breaker, 60.0, ttl=10.0)
    assert hung.expires_at == 70.0
    assert breaker.allow(69.9, TTL) is None
    # At its expiry it counts as failed: reopened at 70 for a full reset_timeout.
    assert breaker.state(70.0) is OPEN
    assert breaker.consecutive_failures == 4
    assert breaker.opens_until(70.0) == 130.0
    assert breaker.state(130.0) is HALF_OPEN
    fresh = probe(breaker, 130.0)
    # The hung probe reporting late changes nothing: it is stale.
    breaker.record_success(hung, 131.0)
    assert breaker.state(131.0) is HALF_OPEN
    assert breaker.probe_out
    breaker.record_success(fresh, 131.0)
    assert breaker.state(131.0) is CLOSED


def test_a_long_silence_after_a_hung_probe_goes_straight_to_a_new_probe() -> None:
    breaker = opened_at(0.0)
    probe(breaker, 60.0, ttl=10.0)
    assert breaker.state(500.0) is HALF_OPEN  # expired at 70, reopened, half-open at 130
    probe(breaker, 500.0)


def test_stale_permits_are_ignored() -> None:
    breaker = CircuitBreaker(2, 60.0)
    early = [breaker.allow(0.0, TTL) for _ in range(3)]
    assert all(p is not None for p in early)
    a, b, c = (p for p in early if p is not None)
    breaker.record_failure(a, 1.0)
    breaker.record_failure(b, 1.0)
    assert breaker.state(1.0) is OPEN
    breaker.record_failure(c, 2.0)  # a late failure does not extend the open window
    assert breaker.opens_until(2.0) == 61.0
    permit = probe(breaker, 61.0)
    breaker.record_success(c, 62.0)  # only the probe can close the circuit
    assert breaker.state(62.0) is HALF_OPEN
    breaker.record_success(permit, 62.0)
    assert breaker.state(62.0) is CLOSED
    breaker.record_failure(c, 63.0)  # issued before the circuit moved: still stale
    assert breaker.consecutive_failures == 0


def test_threshold_one_opens_on_the_first_failure() -> None:
    breaker = CircuitBreaker(1, 5.0)
    fail(breaker, 0.0)
    assert breaker.state(0.0) is OPEN
    assert breaker.state(5.0) is HALF_OPEN


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(0, 60.0)
    with pytest.raises(ValueError, match="reset_timeout"):
        CircuitBreaker(3, 0.0)
    with pytest.raises(ValueError, match="ttl"):
        CircuitBreaker(3, 60.0).allow(0.0, 0.0)


def test_from_config_and_repr() -> None:
    breaker = CircuitBreaker.from_config(CircuitBreakerConfig(failure_threshold=2,
                                                              reset_timeout=9.0))
    assert (breaker.failure_threshold, breaker.reset_timeout) == (2, 9.0)
    assert repr(breaker) == "CircuitBreaker(closed, failures=0/2, reset_timeout=9.0)"
    fail(breaker, 0.0)
    fail(breaker, 0.0)
    breaker.state(9.0)
    probe(breaker, 9.0)
    assert repr(breaker) == "CircuitBreaker(half_open, failures=2/2, reset_timeout=9.0, probe out)"
