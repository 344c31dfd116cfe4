"""What an upstream does with its connection after a streamed (chunked) answer, as learned
from what it did, and what the pool therefore does with such a connection.

Why it is needed (UPSTREAMS.md): llama.cpp's server answers ``Keep-Alive: timeout=5,
max=100`` and then closes the connection after every streamed answer. Its FIN can arrive a
moment after the answer's last chunk, so a request that follows a stream at once can be
written into a connection that is already closing; a written POST is never sent a second
time to the same server (it may be generating), so that request would fail. Checking an
idle connection before reuse cannot close that gap: whether the FIN has arrived yet is a
matter of timing.

So nothing is assumed. While an upstream's behaviour is unknown, a connection that carried
a streamed answer goes to no request: the pool first sends it a harmless ``GET`` (a probe,
which may be sent again anywhere). A probe that gets no answer at all (closed or reset
before a byte) shows the upstream closes after streams: from then on such connections are
closed at once and every request after a stream opens a fresh connection. An upstream that
answered ``PROBES_TO_TRUST`` probes in a row keeps its connections: they go back to the
pool as they are, at no cost. One sign of the contrary later (such a connection found
closed when taken, or a request written onto one lost before its answer) turns it to
closing for good. Decisions only, no I/O: :mod:`proxy.upstream.pool` carries them out.
"""

from __future__ import annotations

from enum import Enum

PROBES_TO_TRUST = 8  # probes answered in a row before connections after streams are pooled
PROBES_AT_ONCE = 2  # probes in flight per upstream; a connection beyond that is closed


class Verdict(Enum):
    UNKNOWN = "unknown"  # not learned yet: probe each connection after a stream
    KEEPS = "keeps"  # keeps its connections after streams: pool them
    CLOSES = "closes"  # closes them (llama.cpp): never pool them


class Action(Enum):
    POOL = "pool"  # back to the idle pool, for the next request
    PROBE = "probe"  # to a probe first; pooled only if the upstream answers it
    CLOSE = "close"  # closed now; the next request opens a fresh connection


class Sign(Enum):
    ANSWERED = "answered"  # a probe on a connection after a stream got an answer
    LOST = "lost"  # a probe got nothing: the connection was closed or reset
    FOUND_CLOSED = "found closed"  # a pooled connection after a stream was found spent


# The moves of the verdict (h11 style: one table). An ANSWERED sign in UNKNOWN moves to
# KEEPS only at the PROBES_TO_TRUST-th answer in a row (StreamReuse.see counts them).
MOVES: dict[tuple[Verdict, Sign], Verdict] = {
    (Verdict.UNKNOWN, Sign.ANSWERED): Verdict.UNKNOWN,
    (Verdict.UNKNOWN, Sign.LOST): Verdict.CLOSES,
    (Verdict.UNKNOWN, Sign.FOUND_CLOSED): Verdict.CLOSES,
    (Verdict.KEEPS, Sign.ANSWERED): Verdict.KEEPS,
    (Verdict.KEEPS, Sign.LOST): Verdict.CLOSES,
    (Verdict.KEEPS, Sign.FOUND_CLOSED): Verdict.CLOSES,
    (Verdict.CLOSES, Sign.ANSWERED): Verdict.CLOSES,
    (Verdict.CLOSES, Sign.LOST): Verdict.CLOSES,
    (Verdict.CLOSES, Sign.FOUND_CLOSED): Verdict.CLOSES,
}


class StreamReuse:
    """One upstream's verdict, the probes answered in a row and the probes in flight."""

    __slots__ = ("answered", "probing", "verdict")

    def __init__(self) -> None:
        self.verdict = Verdict.UNKNOWN
        self.answered = 0
        self.probing = 0

    def __repr__(self) -> str:
        return (f"StreamReuse({self.verdict.value}, answered={self.answered}, "
                f"probing={self.probing})")

    def after_stream(self, *, can_probe: bool = True) -> Action:
        """What to do with a reusable connection whose last answer was streamed. A PROBE
        counts as in flight until :meth:`probe_ended`."""
        verdict = self.verdict
        if verdict is Verdict.KEEPS:
            return Action.POOL
        if verdict is Verdict.CLOSES or not can_probe or self.probing >= PROBES_AT_ONCE:
            return Action.CLOSE
        self.probing += 1
        return Action.PROBE

    def probe_ended(self) -> None:
        self.probing -= 1

    def see(self, sign: Sign) -> Verdict:
        """Take one sign; returns the new verdict."""
        verdict = MOVES[self.verdict, sign]
        if verdict is Verdict.UNKNOWN:  # another answer in a row
            self.answered += 1
            if self.answered >= PROBES_TO_TRUST:
                verdict = Verdict.KEEPS
        self.verdict = verdict
        return verdict
