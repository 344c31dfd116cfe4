"""Which candidate was sent which prompt prefix, for cache-aware routing (SPEC §15).

:class:`PrefixIndex` is a bounded, approximate memory of the prefix chains
(:func:`protocol.affinity.chain`) each candidate (a node, or one local backend, named by a
string) has answered, per model. It stands for what the candidates' KV caches hold: a
candidate holds the first *k* blocks of a new request's chain if it was sent a prompt that
began with them.

Layout (memory is the point: 100k blocks must cost a few tens of bytes over the bare
minimum per block): one ``OrderedDict`` from a block key to one int packing a bitmask of
candidate slots and the model's number, ``(mask << 16) | model_no``. Block keys already
hash in the model (the chain's seed), so a key belongs to one model; the model number is
there to forget one (candidate, model) pair and to guard against the (2^-64) chance of a
key shared by two models. Candidate names and model names get small numbers from tables
that free them when the last block of theirs goes; running counts of pairs (total, per
candidate) and of blocks per model keep ``len()`` and those frees O(1).

LRU. The ``OrderedDict`` order is recency, oldest first. :meth:`PrefixIndex.record`
touches a chain's blocks deepest first, so the shallow blocks of a conversation are the
most recent: eviction takes the deep ends of old conversations before the shared prefixes
(system prompts, tool lists) they hang from. :meth:`PrefixIndex.matches` is a pure read
and touches nothing: only an answered request refreshes its blocks (a candidate that was
only considered holds nothing new). The cap counts (block, candidate) pairs; eviction
removes a whole block (all its candidates) at a time, so it can go a few pairs below it.

:class:`SessionMap` is the LRU map from a session key to the candidate that served it last.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["PrefixIndex", "SessionMap"]

MODEL_BITS = 16
_MODEL_MASK = (1 << MODEL_BITS) - 1
_MAX_MODELS = _MODEL_MASK  # model numbers 1..65535 (0 is never used)


class _Numbers:
    """Names to small numbers and back; a number is freed for reuse (lowest first)."""

    __slots__ = ("_free", "_next", "by_name", "names")

    def __init__(self, first: int) -> None:
        self.by_name: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self._free: list[int] = []
        self._next = first

    def take(self, name: str) -> int:
        number = heapq.heappop(self._free) if self._free else self._next
        if number == self._next:
            self._next += 1
        self.by_name[name] = number
        self.names[number] = name
        return number

    def free(self, number: int) -> None:
        del self.by_name[self.names.pop(number)]
        heapq.heappush(self._free, number)

    def clear(self, first: int) -> None:
        self.by_name.clear()
        self.names.clear()
        self._free.clear()
        self._next = first


class PrefixIndex:
    """Block keys → the candidates holding them, at most ``max_blocks`` (block, candidate)
    pairs, least recently used out first. ``max_blocks`` 0: nothing is recorded."""

    __slots__ = ("_blocks", "_candidates", "_held", "_max", "_model_blocks", "_models",
                 "_pairs")

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 0:
            raise ValueError(f"max_blocks must not be negative, not {max_blocks}")
        self._max = max_blocks
        self._blocks: OrderedDict[int, int] = OrderedDict()  # key → mask << 16 | model_no
        self._candidates = _Numbers(0)  # name ↔ bit number
        self._models = _Numbers(1)  # model ↔ model number
        self._held: dict[int, int] = {}  # bit number → pairs held by that candidate
        self._model_blocks: dict[int, int] = {}  # model number → blocks of that model
        self._pairs = 0

    def __len__(self) -> int:
        return self._pairs

    @property
    def blocks(self) -> int:
        """Distinct block keys held (each by one candidate or more)."""
        return len(self._blocks)

    @property
    def max_blocks(self) -> int:
        return self._max

    @max_blocks.setter
    def max_blocks(self, value: int) -> None:
        """A new cap applies at once: shrinking evicts down to it now (0: forget all)."""
        if value < 0:
            raise ValueError(f"max_blocks must not be negative, not {value}")
        self._max = value
        self._evict()

    def held(self, candidate: str) -> int:
        """Blocks ``candidate`` holds now, all models together."""
        bit = self._candidates.by_name.get(candidate)
        return 0 if bit is None else self._held[bit]

    # -- bookkeeping -------------------------------------------------------------------

    def _lose(self, mask: int, model_no: int, whole: bool) -> None:
        """Account for the bits of ``mask`` gone from one block (the whole block if
        ``whole``); frees candidate and model numbers nobody uses any more."""
        held = self._held
        self._pairs -= mask.bit_count()
        while mask:
            low = mask & -mask
            bit = low.bit_length() - 1
            mask ^= low
            left = held[bit] - 1
            if left:
                held[bit] = left
            else:
                del held[bit]
                self._candidates.free(bit)
        if whole:
            left = self._model_blocks[model_no] - 1
            if left:
                self._model_blocks[model_no] = left
            else:
                del self._model_blocks[model_no]
                self._models.free(model_no)

    def _evict(self) -> None:
        blocks = self._blocks
        if self._max == 0:
            if blocks:
                self.clear()
            return
        while self._pairs > self._max:
            _key, value = blocks.popitem(last=False)
            self._lose(value >> MODEL_BITS, value & _MODEL_MASK, True)

    def clear(self) -> None:
        """Forget everything."""
        self._blocks.clear()
        self._candidates.clear(0)
        self._models.clear(1)
        self._held.clear()
        self._model_blocks.clear()
        self._pairs = 0

    # -- the API -----------------------------------------------------------------------

    def record(self, model: str, chain: Sequence[int], candidate: str) -> None:
        """``candidate`` answered a request with this chain: it holds all its blocks now.
        They become the most recently used, block 0 the most recent of all."""
        if self._max == 0 or not chain:
            return
        model_no = self._models.by_name.get(model)
        if model_no is None:
            if len(self._model_blocks) >= _MAX_MODELS:
                return  # 65535 models indexed at once: the newest goes unrecorded
            model_no = self._models.take(model)
            self._model_blocks[model_no] = 0
        bit = self._candidates.by_name.get(candidate)
        if bit is None:
            bit = self._candidates.take(candidate)
            self._held[bit] = 0
        flag = 1 << (bit + MODEL_BITS)
        fresh = flag | model_no
        blocks = self._blocks
        touch = blocks.move_to_end
        added = new_blocks = 0
        same: dict[int, int] = {}
        for key in reversed(chain):
            value = blocks.get(key)
            if value is None:
                blocks[key] = fresh
                added += 1
                new_blocks += 1
            elif value & _MODEL_MASK != model_no:  # a key of another model (2^-64): skip
                continue
            else:
                if not value & flag:
                    shared = same.get(value)  # one int object per new value, not per block
                    if shared is None:
                        shared = same[value] = value | flag
                    blocks[key] = shared
                    added += 1
                touch(key)
        self._pairs += added
        if added:
            self._held[bit] += added
        elif not self._held[bit]:  # new here, and every key was another model's: none kept
            del self._held[bit]
            self._candidates.free(bit)
        if new_blocks:
            self._model_blocks[model_no] += new_blocks
        elif not self._model_blocks[model_no]:
            del self._model_blocks[model_no]
            self._models.free(model_no)
        self._evict()

    def matches(self, model: str, chain: Sequence[int],
                candidates: Iterable[str]) -> dict[str, int]:
        """For every candidate asked, how many leading blocks of ``chain`` it holds
        (consecutive from block 0; 0 when it holds none, or is unknown). Reads only."""
        by_name = self._candidates.by_name
        asked = list(candidates)
        counts = dict.fromkeys(asked, 0)
        model_no = self._models.by_name.get(model)
        if model_no is None or not chain:
            return counts
        alive = 0
        for name in asked:
            bit = by_name.get(name)
            if bit is not None:
                alive |= 1 << bit
        if not alive:
            return counts
        depth: dict[int, int] = {}  # bit number → blocks held, for those that stopped
        get = self._blocks.get
        i = 0
        for key in chain:
            value = get(key)
            if value is None or value & _MODEL_MASK != model_no:
                break
            still = alive & (value >> MODEL_BITS)
            if still != alive:
                gone = alive ^ still
                while gone:
                    low = gone & -gone
                    depth[low.bit_length() - 1] = i
                    gone ^= low
                alive = still
                if not alive:
                    break
            i += 1
        for name in asked:
            bit = by_name.get(name)
            if bit is not None:
                counts[name] = i if alive >> bit & 1 else depth.get(bit, 0)
        return counts

    def drop(self, model: str, chain: Sequence[int], candidate: str) -> None:
        """``candidate`` turned out not to hold this chain (it reported no cached tokens):
        forget its entries for every block of it."""
        bit = self._candidates.by_name.get(candidate)
        model_no = self._models.by_name.get(model)
        if bit is None or model_no is None:
            return
        flag = 1 << (bit + MODEL_BITS)
        blocks = self._blocks
        for key in chain:
            value = blocks.get(key)
            if value is None or not value & flag or value & _MODEL_MASK != model_no:
                continue
            left = value ^ flag
            if left >> MODEL_BITS:
                blocks[key] = left  # order unchanged: the others' recency stays
                self._lose(1 << bit, model_no, False)
            else:
                del blocks[key]
                self._lose(1 << bit, model_no, True)
            if bit not in self._held:  # its last pair went: its number is free now
                return

    def forget(self, candidate: str, model: str | None = None) -> int:
        """``candidate`` left (``model`` None) or no longer holds ``model``: forget its
        entries (of that model). Returns the (block, candidate) pairs removed. O(blocks)."""
        bit = self._candidates.by_name.get(candidate)
        if bit is None:
            return 0
        model_no = 0
        if model is not None:
            found = self._models.by_name.get(model)
            if found is None:
                return 0
            model_no = found
        flag = 1 << (bit + MODEL_BITS)
        blocks = self._blocks
        hits = [(key, value) for key, value in blocks.items()
                if value & flag and (not model_no or value & _MODEL_MASK == model_no)]
        for key, value in hits:
            left = value ^ flag
            if left >> MODEL_BITS:
                blocks[key] = left
                self._lose(1 << bit, value & _MODEL_MASK, False)
            else:
                del blocks[key]
                self._lose(1 << bit, value & _MODEL_MASK, True)
        return len(hits)


class SessionMap:
    """Session key → the candidate that served that session last; at most ``cap`` keys,
    least recently set out first (:meth:`get` is a pure read). ``cap`` 0 keeps nothing."""

    __slots__ = ("_cap", "_map")

    def __init__(self, cap: int = 10000) -> None:
        if cap < 0:
            raise ValueError(f"cap must not be negative, not {cap}")
        self._cap = cap
        self._map: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    @property
    def cap(self) -> int:
        return self._cap

    @cap.setter
    def cap(self, value: int) -> None:
        """A new cap applies at once (shrinking drops the least recently set)."""
        if value < 0:
            raise ValueError(f"cap must not be negative, not {value}")
        self._cap = value
        while len(self._map) > value:
            self._map.popitem(last=False)

    def get(self, key: str) -> str | None:
        return self._map.get(key)

    def set(self, key: str, candidate: str) -> None:
        if not self._cap:
            return
        self._map[key] = candidate
        self._map.move_to_end(key)
        if len(self._map) > self._cap:
            self._map.popitem(last=False)

    def forget(self, candidate: str) -> int:
        """Drop every session that points at ``candidate``; returns how many."""
        gone = [key for key, name in self._map.items() if name == candidate]
        for key in gone:
            del self._map[key]
        return len(gone)
