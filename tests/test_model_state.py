"""The managed model's states and their one table of moves (protocol/model_state.py)."""

from __future__ import annotations

import pytest

from protocol.model_state import (
    MOVES,
    RETRY_AFTER_FAILURE,
    IllegalMove,
    ModelState,
    Move,
    may_retry,
    move,
)

S = ModelState


def test_the_moves_of_spec_11() -> None:
    path = [(S.UNLOADED, Move.LOAD, S.LOADING), (S.LOADING, Move.READY, S.LOADED),
            (S.LOADED, Move.UNLOAD, S.UNLOADING), (S.UNLOADING, Move.STOPPED, S.UNLOADED),
            (S.LOADING, Move.START_FAILED, S.FAILED), (S.FAILED, Move.LOAD, S.LOADING),
            (S.LOADED, Move.CRASHED, S.FAILED)]
    for state, how, after in path:
        assert move(state, how) is after
    assert len(MOVES) == len(path)


@pytest.mark.parametrize(("state", "how"), [
    (s, m) for s in ModelState for m in Move if (s, m) not in MOVES])
def test_every_other_move_is_refused(state: ModelState, how: Move) -> None:
    with pytest.raises(IllegalMove):
        move(state, how)


def test_every_state_can_reach_loaded() -> None:
    reach = {S.LOADED}
    for _ in ModelState:
        reach |= {s for (s, _m), after in MOVES.items() if after in reach}
    assert reach == set(ModelState)


def test_the_retry_back_off() -> None:
    assert not may_retry(100.0, 100.0 + RETRY_AFTER_FAILURE - 0.001)
    assert may_retry(100.0, 100.0 + RETRY_AFTER_FAILURE)
