"""The verdict on an upstream's connections after streamed answers (protocol/stream_reuse.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.stream_reuse import (
    MOVES,
    PROBES_AT_ONCE,
    PROBES_TO_TRUST,
    Action,
    Sign,
    StreamReuse,
    Verdict,
)


def test_the_table_has_every_move() -> None:
    assert set(MOVES) == {(v, s) for v in Verdict for s in Sign}
    # Closing is for good; any sign of a close leads there.
    assert all(MOVES[Verdict.CLOSES, s] is Verdict.CLOSES for s in Sign)
    assert all(MOVES[v, s] is Verdict.CLOSES for v in Verdict
               for s in (Sign.LOST, Sign.FOUND_CLOSED))


def test_unknown_probes_and_trusts_after_answers_in_a_row() -> None:
    reuse = StreamReuse()
    for _ in range(PROBES_TO_TRUST - 1):
        assert reuse.after_stream() is Action.PROBE
        reuse.probe_ended()
        assert reuse.see(Sign.ANSWERED) is Verdict.UNKNOWN
    assert reuse.after_stream() is Action.PROBE
    reuse.probe_ended()
    assert reuse.see(Sign.ANSWERED) is Verdict.KEEPS
    assert reuse.after_stream() is Action.POOL
    assert reuse.probing == 0


def test_a_lost_probe_closes_for_good() -> None:
    reuse = StreamReuse()
    assert reuse.after_stream() is Action.PROBE
    reuse.probe_ended()
    assert reuse.see(Sign.LOST) is Verdict.CLOSES
    for _ in range(PROBES_TO_TRUST * 2):
        assert reuse.see(Sign.ANSWERED) is Verdict.CLOSES  # a late probe's answer
        assert reuse.after_stream() is Action.CLOSE


def test_trust_ends_at_the_first_connection_found_closed() -> None:
    reuse = StreamReuse()
    reuse.verdict = Verdict.KEEPS
    assert reuse.see(Sign.FOUND_CLOSED) is Verdict.CLOSES
    assert reuse.after_stream() is Action.CLOSE


def test_probes_in_flight_are_bounded_and_need_a_prober() -> None:
    reuse = StreamReuse()
    assert [reuse.after_stream() for _ in range(PROBES_AT_ONCE + 2)] == \
        [Action.PROBE] * PROBES_AT_ONCE + [Action.CLOSE] * 2
    reuse.probe_ended()
    assert reuse.after_stream(can_probe=False) is Action.CLOSE
    assert reuse.after_stream() is Action.PROBE
    assert reuse.probing == PROBES_AT_ONCE


@given(st.lists(st.sampled_from(Sign), max_size=40))
def test_the_verdict_follows_the_signs(signs: list[Sign]) -> None:
    """CLOSES once any close was seen; KEEPS only after PROBES_TO_TRUST answers and no close
    before them; a connection after a stream is pooled only then."""
    reuse = StreamReuse()
    for count, sign in enumerate(signs, 1):
        verdict = reuse.see(sign)
        seen = signs[:count]
        first_close = next((i for i, s in enumerate(seen) if s is not Sign.ANSWERED), None)
        answered_before = seen[:first_close].count(Sign.ANSWERED)
        if answered_before >= PROBES_TO_TRUST:
            expected = Verdict.KEEPS if first_close is None else Verdict.CLOSES
        else:
            expected = Verdict.UNKNOWN if first_close is None else Verdict.CLOSES
        assert verdict is expected
        action = reuse.after_stream()
        assert (action is Action.POOL) == (verdict is Verdict.KEEPS)
        assert (action is Action.CLOSE) == (verdict is Verdict.CLOSES)
        if action is Action.PROBE:
            reuse.probe_ended()
        assert reuse.probing == 0
