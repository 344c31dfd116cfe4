"""How much of each upstream's prompts its cache served (SPEC §15 ``cacheHitRate`` in the
routing stats): the prompt tokens of every answer that said how many it reused, and those
reused, added to the upstream's :class:`~proxy.routing.attempts.Counters` in the hub's batch
(a subscriber of ``request`` records), never on the request path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from protocol.request_record import RequestRecord, token_counts
from proxy.routing.attempts import Counters


class CountersByUpstream(Protocol):
    """Where the counters are (:class:`~proxy.routing.router.Router`): each node's and
    each local backend's, by name."""

    @property
    def counters(self) -> Mapping[str, Counters]: ...
    @property
    def backend_counters(self) -> Mapping[str, Counters]: ...


def count_tokens(router: CountersByUpstream, kind: str, at: float,
                 record: RequestRecord | Any) -> None:
    """Add one finished request's prompt and reused tokens to the upstream that served it."""
    served_by = record.served_by
    if served_by is None or not record.routed:
        return
    record.find_usage()
    cached = record.cached
    tokens = token_counts(record.usage)
    if cached is None or tokens is None:
        return
    where, _, name = served_by.partition(":")
    counters = (router.counters.get(name) if where == "node"
                else router.backend_counters.get(name))
    if counters is not None:
        counters.prompt_tokens += tokens[0]
        counters.cached_tokens += min(cached, tokens[0])
