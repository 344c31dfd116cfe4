"""The one routing choice (SPEC §7.1, §7.3, §15, §18), pure: candidates with their load,
slots and cache match in, the ordered choice out.

Every way a request is placed is a row of :func:`choose` or one of its :class:`Rules`:

- **local first** (§7.1): when a local backend holds the model, the choice is among the
  local ones — in config order (their ``priority``), or ``cache-aware`` among several;
- **spill-over** (§15, ``Rules.spill_over``): when every local holder is full (known slots,
  none free), the nodes with a free slot, ordered by the strategy, are chosen instead
  (affinity ``spill``); with none, the local order stands;
- **the nodes** (no local holder): ordered by the strategy (§7.3; ``prefer_loaded`` first),
  with cache-aware's affinity result;
- **the queue** (§18, ``Rules.queue``): only candidates with a free slot may be chosen (an
  unknown slot count is unlimited); an empty :class:`Choice` means the request waits.

The caller snapshots each candidate into a :class:`~protocol.strategies.Candidate` (``local``,
``free`` from :func:`protocol.slots.free_slots`, ``waiting``, ``match``, ``session``; breakers
already asked: only permitted nodes are candidates) and owns the cursors; round-robin and
weighted advance them once per choice. :func:`needs_nodes` says, from the local candidates
alone, whether the nodes must be asked at all (so a local hit never touches a breaker).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from protocol.affinity_choice import SPILL
from protocol.config import Strategy
from protocol.strategies import (
    Candidate,
    RoundRobinCursor,
    WeightedCursor,
    affinity_result,
    order_candidates,
    priority_key,
)

__all__ = ["Choice", "Rules", "choose", "needs_nodes"]


@attrs.frozen
class Rules:
    """The settings the choice follows (``load_balancing``, and ``scheduling.queue``)."""

    strategy: Strategy | str = Strategy.PRIORITY
    prefer_loaded: bool = True
    spill_over: bool = False
    load_bound: int = 1
    queue: bool = False  # only a candidate with a free slot may be chosen (SPEC §18)


@attrs.frozen
class Choice:
    """The candidates to try, in order (the first is the one to send to; only nodes fail
    over), and the request log's ``affinity``. Empty: nobody may take it now (it waits)."""

    order: tuple[Candidate, ...] = ()
    affinity: str | None = None

    @property
    def first(self) -> Candidate | None:
        return self.order[0] if self.order else None


def _full(candidate: Candidate) -> bool:
    return candidate.free == 0


def needs_nodes(local: Sequence[Candidate], rules: Rules) -> bool:
    """Whether the nodes take part: no local holder, or spill-over with every local holder
    full."""
    return not local or (rules.spill_over and all(_full(c) for c in local))


def choose(candidates: Sequence[Candidate], rules: Rules, cursor: RoundRobinCursor,
           weighted: WeightedCursor | None = None) -> Choice:
    """The ordered choice among ``candidates`` (see the module docstring)."""
    strategy = Strategy(rules.strategy)
    local = [c for c in candidates if c.local]
    nodes = [c for c in candidates if not c.local]
    if local:
        if rules.spill_over and all(_full(c) for c in local):
            spill = [c for c in nodes if c.free]  # a known free slot: None and 0 stay out
            if spill:
                return Choice(tuple(_order(strategy, spill, rules, cursor, weighted)), SPILL)
        return _local_choice(strategy, local, rules, cursor)
    free = [c for c in nodes if not _full(c)] if rules.queue else nodes
    if not free:
        return Choice()
    order = _order(strategy, free, rules, cursor, weighted)
    affinity = (affinity_result(order[0], nodes) if strategy is Strategy.CACHE_AWARE
                else None)
    return Choice(tuple(order), affinity)


def _local_choice(strategy: Strategy, local: list[Candidate], rules: Rules,
                  cursor: RoundRobinCursor) -> Choice:
    """Config order, or cache-aware among several; with the queue, the free ones only."""
    free = [c for c in local if not _full(c)] if rules.queue else local
    if not free:
        return Choice()
    if strategy is not Strategy.CACHE_AWARE or len(local) < 2:
        return Choice(tuple(sorted(free, key=priority_key)))
    order = order_candidates(strategy, free, cursor, load_bound=rules.load_bound)
    return Choice(tuple(order), affinity_result(order[0], local))


def _order(strategy: Strategy, candidates: list[Candidate], rules: Rules,
           cursor: RoundRobinCursor, weighted: WeightedCursor | None) -> list[Candidate]:
    return order_candidates(strategy, candidates, cursor, prefer_loaded=rules.prefer_loaded,
                            weighted=weighted, load_bound=rules.load_bound)
