"""The cache-aware choice among a request's candidates (SPEC §15, strategy ``cache-aware``).

Each :class:`Contender` is one eligible candidate (a node, or a local backend) with its
load, how many leading blocks of the request's prefix chain it holds
(:meth:`protocol.prefix_index.PrefixIndex.matches`) and whether it served the request's
session last. :func:`choose` orders them: the first is the one to send to, the rest the
failover order, and says why the first was chosen (the request log's ``affinity``).

The rule, in order:

1. The **load bound**: a contender is *within the bound* when its waiting count is at most
   the least waiting count among the contenders plus ``load_bound``. Only contenders within
   it may be chosen for their cache or their session.
2. **Session**: the contender that served this session last, if within the bound → first,
   ``"session"``.
3. **Hit**: else the contender with the longest match (≥ 1 block) within the bound → first.
   Ties go by load. The result is ``"hit"`` only when its match is the longest of all the
   contenders; when a longer match was passed over for load, the shorter one still goes
   first (it saves what it can) but the result is ``"miss"`` (SPEC §15: the matched
   candidate was passed over).
4. **Miss**: else (no match within the bound) by load, ``"miss"``.

"By load" is: fewest waiting, then fewest in flight, then higher priority, then name, so
the order is deterministic. One contender: ``([it], None)``.

Against the known failure modes of prefix routing:

- *A shared system prompt matches everything*: every candidate that saw the shared prefix
  matches it equally, and equal matches are ordered by load, so new conversations spread
  over them; only a conversation's own later blocks pin it to one candidate.
- *Hotspots*: a candidate everyone's prefix lives on would take all the traffic; the load
  bound hands the excess to the least busy (which then caches the prefix too), so a hot
  prefix spreads to as many candidates as its load needs.
- *Stale load*: ``waiting`` comes from the caller's live counts: sluice's own in-flight
  count, which changes as each request starts and ends, beyond the free slots the server
  last reported (llama.cpp ``/slots`` and ``/props``, a node's ``/v1/models``). Only the
  slot half is polled, so a burst sluice sends itself is seen by the very next choice, not
  at the next health check; ``in_flight`` (always live) breaks ties between equal waits.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["HIT", "MISS", "SESSION", "SPILL", "Contender", "choose"]

HIT, SESSION, MISS, SPILL = "hit", "session", "miss", "spill"


@attrs.frozen
class Contender:
    name: str
    priority: int  # higher goes first among equally loaded
    in_flight: int = 0  # requests sluice has in flight to it
    waiting: int = 0  # of those, the ones beyond its free slots
    match: int = 0  # leading blocks of the request's chain it holds
    session: bool = False  # it served this request's session last


def _by_load(c: Contender) -> tuple[int, int, int, str]:
    return (c.waiting, c.in_flight, -c.priority, c.name)


def _by_match(c: Contender) -> tuple[int, int, int, int, str]:
    return (-c.match, c.waiting, c.in_flight, -c.priority, c.name)


def choose(contenders: Sequence[Contender],
           load_bound: int) -> tuple[list[Contender], str | None]:
    """The order to try ``contenders`` in and the affinity result (None with fewer than
    two). Always a permutation of the input. ``load_bound`` below 0 counts as 0."""
    if len(contenders) < 2:
        return list(contenders), None
    bound = min(c.waiting for c in contenders) + max(0, load_bound)
    first: int | None = None
    result = MISS
    sessions = [i for i, c in enumerate(contenders) if c.session and c.waiting <= bound]
    if sessions:
        first = min(sessions, key=lambda i: _by_load(contenders[i]))
        result = SESSION
    else:
        matched = [i for i, c in enumerate(contenders) if c.match >= 1 and c.waiting <= bound]
        if matched:
            first = min(matched, key=lambda i: _by_match(contenders[i]))
            longest = max(c.match for c in contenders)
            result = HIT if contenders[first].match == longest else MISS
    if first is None:
        order = sorted(contenders, key=_by_load)
    else:
        rest = [c for i, c in enumerate(contenders) if i != first]
        order = [contenders[first], *sorted(rest, key=_by_load)]
    return order, result
