"""The states of a managed model on demand (SPEC §11) and their legal moves, as one table
(h11's habit): :mod:`proxy.models.lifecycle` is the only one that moves them.

    unloaded --load--> loading --ready--> loaded --unload--> unloading --stopped--> unloaded
                          |                  |
                          +--start_failed--> failed --load (after the back-off)--> loading
                                             loaded --crashed--> failed

A model that is ``failed`` answers requests at once with its error until
``RETRY_AFTER_FAILURE`` seconds have passed since its last start; the next request then tries
to load it again. A loaded server that exits by itself makes its model ``failed`` too (SPEC
§11.1), with the same back-off.
"""

from __future__ import annotations

from enum import Enum

RETRY_AFTER_FAILURE = 10.0  # seconds before a failed model may be loaded again


class ModelState(Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class Move(Enum):
    LOAD = "load"  # a request (or preload, or the API) needs it
    READY = "ready"  # its server answers /health
    START_FAILED = "start_failed"  # the server exited, timed out or could not start
    UNLOAD = "unload"  # idle past keep_alive, room for another model, or the API
    STOPPED = "stopped"  # its server is gone
    CRASHED = "crashed"  # a loaded server exited by itself


MOVES: dict[tuple[ModelState, Move], ModelState] = {
    (ModelState.UNLOADED, Move.LOAD): ModelState.LOADING,
    (ModelState.FAILED, Move.LOAD): ModelState.LOADING,
    (ModelState.LOADING, Move.READY): ModelState.LOADED,
    (ModelState.LOADING, Move.START_FAILED): ModelState.FAILED,
    (ModelState.LOADED, Move.UNLOAD): ModelState.UNLOADING,
    (ModelState.LOADED, Move.CRASHED): ModelState.FAILED,
    (ModelState.UNLOADING, Move.STOPPED): ModelState.UNLOADED,
}


class IllegalMove(Exception):
    """A move the table does not have: a bug in the lifecycle, never a user's error."""


def move(state: ModelState, how: Move) -> ModelState:
    """The state after ``how``; IllegalMove when the table has no such move."""
    try:
        return MOVES[state, how]
    except KeyError:
        raise IllegalMove(f"{how.value} is not a move from {state.value}") from None


def may_retry(failed_at: float, now: float) -> bool:
    """Whether a failed model may be loaded again (at most once per RETRY_AFTER_FAILURE)."""
    return now - failed_at >= RETRY_AFTER_FAILURE
