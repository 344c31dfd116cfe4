"""What ``GET /metrics`` shows (SPEC §9.2), in the Prometheus text format 0.0.4.

Two kinds of figures:

- **Counted** from the hub's ``request`` events (one
  :class:`~protocol.request_record.RequestRecord` per finished request) and from nowhere
  else: requests, durations, times to first byte, stream events, tokens, upstream attempts,
  failovers, the queue's waits and refusals. Each record costs a few plain dict and list
  updates (a histogram bucket is found with :func:`bisect.bisect_left`); nothing is
  formatted until a scrape.
- **Read at scrape time** from their owners: attempts in flight per upstream (the
  :class:`~proxy.routing.router.Router`'s counters), node up and latency (the node index),
  circuit states (the router's breakers), the queue's waiting counts (the scheduler's,
  :mod:`proxy.observe.queue_metrics`), client connections per transport
  (``Clients.by_transport`` of :mod:`proxy.context`), and the process figures
  (:mod:`proxy.observe.process_figures`, prometheus_client's, imported by the first scrape).

The sluice figures are written by :mod:`proxy.observe.exposition`: prometheus_client's own
``Counter``/``Histogram`` cost 16 µs or more per request on S1's load and its rendering
12 µs or more per line, against about 2 µs and 0.5 µs here (``bench/metrics_cost.py``; the README
quotes the figures).

Label values are only names the gateway was configured with: ``served_by`` and ``upstream``
are ``local:<backend>`` or ``node:<fingerprint>`` (``none`` when nothing served the
request); ``model`` is the id of a model the gateway routed (else ``none``), at most
:data:`MAX_MODEL_LABELS` of them, later ones counted as ``other``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from protocol.model_state import ModelState
from protocol.request_record import RequestRecord, token_counts
from proxy.observe.exposition import Exposition, bucket_labels, label_set
from proxy.observe.hub import RequestReader
from proxy.observe.queue_metrics import QueueFigures
from proxy.routing.breaker import BreakerState

if TYPE_CHECKING:
    from proxy.models.ondemand import OnDemand
    from proxy.observe.process_figures import ProcessFigures
    from proxy.routing.router import Router
    from proxy.routing.scheduler import Scheduler

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# Upper bounds (seconds) of the histogram buckets, for local LLM traffic: a cached or tiny
# answer in milliseconds, a long generation in minutes (streaming.total may be up to 20m).
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1200.0)
# First body byte, and a stream's first data event (the first token): from a millisecond (a
# local server with the model warm) to minutes (a model loading, or a long prompt;
# streaming.first_byte may be up to 8m).
TTFB_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0)
_DURATION_LES = bucket_labels(DURATION_BUCKETS)
_TTFB_LES = bucket_labels(TTFB_BUCKETS)

MAX_MODEL_LABELS = 500  # distinct model ids shown; the rest are model="other"
OTHER = "other"
NONE = "none"  # no model routed, or nothing served the request
# The client's API (the ``api`` label, SPEC §17.1): openai for the other OpenAI paths.
_APIS = (("/v1/messages", "messages"), ("/v1/responses", "responses"), ("/api/", "ollama"))


def api_of(path: str) -> str:
    """The API a request path speaks, as the ``api`` label says it."""
    for prefix, api in _APIS:
        if path.startswith(prefix):
            return api
    return "openai"


CIRCUIT_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class _Series:
    """What the requests of one (model, served_by, stream) added up to, with its label set
    escaped once. Histograms keep one count per bucket (the last for +Inf), made cumulative
    at scrape time."""

    __slots__ = ("cached", "codes", "completion", "duration", "duration_sum", "events",
                 "labels", "model", "pair", "prompt", "served_by", "ttfb", "ttfb_sum", "ttft",
                 "ttft_sum")

    def __init__(self, model: str, served_by: str, stream: bool) -> None:
        self.pair = label_set(("model", model), ("served_by", served_by))
        self.model = model
        self.served_by = served_by
        self.labels = f'{self.pair},stream="{"true" if stream else "false"}"'
        self.codes: dict[tuple[str, int], int] = {}  # by the client's API and status
        self.duration = [0] * len(_DURATION_LES)
        self.duration_sum = 0.0
        self.ttfb = [0] * len(_TTFB_LES)
        self.ttfb_sum = 0.0
        self.ttft = [0] * len(_TTFB_LES)
        self.ttft_sum = 0.0
        self.events = 0
        self.prompt = 0
        self.completion = 0
        self.cached = 0  # prompt tokens the upstream reused (SPEC §15)

    def __repr__(self) -> str:
        return f"_Series({self.labels}: {sum(self.codes.values())} requests)"


class Metrics(RequestReader):
    """The counted figures (fed by :meth:`attach`) and the scrape (:meth:`render`) that
    writes them with the read ones (see the module docstring)."""

    def __init__(self, router: Router, connections: dict[str, int], version: str,
                 scheduler: Scheduler | None = None,
                 ondemand: Callable[[], OnDemand | None] = lambda: None) -> None:
        super().__init__()
        self._router = router
        self._scheduler = scheduler  # the queue's waiting counts (SPEC §18)
        self._queue = QueueFigures()
        self._connections = connections  # client connections open per transport (Clients)
        self._version = version
        self._series: dict[tuple[str, str, bool], _Series] = {}
        self._models: set[str] = set()
        self._attempts: dict[tuple[str, str], int] = {}
        self._affinity: dict[str, int] = {}  # cache-aware routing's results (SPEC §15)
        self.failovers = 0
        self._process: ProcessFigures | None = None  # made by the first scrape
        self._ondemand = ondemand  # the managed models, when the gateway has any

    def __repr__(self) -> str:
        return (f"Metrics({len(self._series)} series, {len(self._models)} models, "
                f"failovers={self.failovers})")

    # -- the hot path: once per finished request ------------------------------------------

    def _on_request(self, kind: str, at: float, record: RequestRecord) -> None:
        """Add one finished request."""
        model = record.model
        if not record.routed or model is None:
            model = NONE
        elif model not in self._models:
            if len(self._models) < MAX_MODEL_LABELS:
                self._models.add(model)
            else:
                model = OTHER
        key = (model, record.served_by or NONE, record.stream)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(*key)
        codes = series.codes
        code = (api_of(record.path), record.status)
        codes[code] = codes.get(code, 0) + 1
        duration = record.duration
        series.duration[bisect_left(DURATION_BUCKETS, duration)] += 1
        series.duration_sum += duration
        ttfb = record.ttfb
        if ttfb is not None:
            series.ttfb[bisect_left(TTFB_BUCKETS, ttfb)] += 1
            series.ttfb_sum += ttfb
        ttft = record.ttft
        if ttft is not None:
            series.ttft[bisect_left(TTFB_BUCKETS, ttft)] += 1
            series.ttft_sum += ttft
        if record.events:
            series.events += record.events
        usage = record.find_usage()
        if usage:
            tokens = token_counts(usage)
            if tokens is not None:
                series.prompt += tokens[0]
                series.completion += tokens[1]
        if record.cached:
            series.cached += record.cached
        if record.affinity is not None:
            self._affinity[record.affinity] = self._affinity.get(record.affinity, 0) + 1
        attempts = self._attempts
        for attempt in record.attempts:
            attempts[attempt] = attempts.get(attempt, 0) + 1
        if record.failover is not None:
            self.failovers += 1
        if record.priority is not None:
            self._queue.add(record, model)

    def _label(self, model: str) -> str:
        """A model's label value (the same rule as for the counted figures)."""
        if model in self._models:
            return model
        if len(self._models) < MAX_MODEL_LABELS:
            self._models.add(model)
            return model
        return OTHER

    # -- a scrape --------------------------------------------------------------------------

    def _process_figures(self) -> ProcessFigures:
        if self._process is None:
            # Imported by the first scrape (once, about 30 ms), not at start: prometheus_client
            # and the servers its exposition module imports are about 2 MB of memory.
            from proxy.observe.process_figures import ProcessFigures

            self._process = ProcessFigures()
        return self._process

    def render(self) -> bytes:
        """The whole exposition (:data:`CONTENT_TYPE`)."""
        self.catch_up()
        out = Exposition()
        self._counted(out)
        self._read(out)
        self._queue.render(out, self._scheduler, self._label)
        ondemand = self._ondemand()
        if ondemand is not None:
            _models(out, ondemand)
        out.family("sluice_build_info", "gauge", "The gateway's version (always 1).")
        out.sample("sluice_build_info", label_set(("version", self._version)), 1)
        out.raw(self._process_figures().text())
        return out.text()

    def _counted(self, out: Exposition) -> None:
        series = sorted(self._series.items())
        codes: dict[tuple[str, str, int], int] = {}
        sums: dict[str, list[int]] = {}  # by model and served_by: events, prompt, completion
        for _, one in series:
            for (api, code), count in one.codes.items():
                codes[one.pair, api, code] = codes.get((one.pair, api, code), 0) + count
            total = sums.setdefault(one.pair, [0, 0, 0])
            total[0] += one.events
            total[1] += one.prompt
            total[2] += one.completion
        out.family("sluice_requests_total", "counter",
                   "Finished OpenAI API requests, by the client's API and the HTTP status "
                   "sent.")
        for (pair, api, code), count in sorted(codes.items()):
            out.sample("sluice_requests_total", f'{pair},api="{api}",code="{code}"', count)
        out.family("sluice_request_duration_seconds", "histogram",
                   "Time from the request to the end of its answer.")
        for _, one in series:
            out.histogram("sluice_request_duration_seconds", one.labels, _DURATION_LES,
                          one.duration, one.duration_sum)
        out.family("sluice_time_to_first_byte_seconds", "histogram",
                   "Time from the request to the first body byte sent to the client.")
        for _, one in series:
            out.histogram("sluice_time_to_first_byte_seconds", one.labels, _TTFB_LES,
                          one.ttfb, one.ttfb_sum)
        out.family("sluice_time_to_first_token_seconds", "histogram",
                   "Time from the request to the first SSE event with data sent to the client "
                   "(keep-alive comments before it not counted).")
        for _, one in series:
            out.histogram("sluice_time_to_first_token_seconds", one.labels, _TTFB_LES,
                          one.ttft, one.ttft_sum)
        out.family("sluice_stream_events_total", "counter", "SSE data events relayed.")
        for pair, (events, _, _) in sums.items():
            out.sample("sluice_stream_events_total", pair, events)
        out.family("sluice_tokens_total", "counter", "Tokens the upstreams reported in usage.")
        for pair, (_, prompt, completion) in sums.items():
            out.sample("sluice_tokens_total", f'{pair},type="prompt"', prompt)
            out.sample("sluice_tokens_total", f'{pair},type="completion"', completion)
        cached: dict[tuple[str, str], int] = {}
        for _, one in series:
            if one.served_by != NONE:
                where = (one.model, one.served_by)
                cached[where] = cached.get(where, 0) + one.cached
        out.family("sluice_prompt_tokens_cached_total", "counter",
                   "Prompt tokens the upstream reused from its cache, as its answers said.")
        for (model, upstream), count in sorted(cached.items()):
            out.sample("sluice_prompt_tokens_cached_total",
                       label_set(("model", model), ("upstream", upstream)), count)
        out.family("sluice_routing_affinity_total", "counter",
                   "Cache-aware routing choices, by why the upstream was chosen.")
        for result, count in sorted(self._affinity.items()):
            out.sample("sluice_routing_affinity_total", label_set(("result", result)), count)
        out.family("sluice_upstream_attempts_total", "counter",
                   "Tries of a request on an upstream, by outcome.")
        for (upstream, outcome), count in sorted(self._attempts.items()):
            out.sample("sluice_upstream_attempts_total",
                       label_set(("upstream", upstream), ("outcome", outcome)), count)
        out.family("sluice_failovers_total", "counter",
                   "Requests that failed over to a second node.")
        out.sample("sluice_failovers_total", "", self.failovers)

    def _read(self, out: Exposition) -> None:
        router = self._router
        config = router.settings.config
        in_flight = {f"local:{b.name}": 0 for b in config.backends}
        in_flight.update((f"node:{n.fingerprint}", 0) for n in config.nodes)
        for upstream, count in router.active_requests().items():
            if upstream in in_flight or count:
                in_flight[upstream] = count
        out.family("sluice_upstream_active_requests", "gauge",
                   "Attempts in flight on an upstream now.")
        for upstream, count in in_flight.items():
            out.sample("sluice_upstream_active_requests", label_set(("upstream", upstream)),
                       count)
        now = trio.current_time()
        up, latency, circuit = [], [], []
        for node in config.nodes:
            labels = label_set(("node", node.fingerprint))
            endpoint = router.nodes.endpoint(node.fingerprint) if node.enabled else None
            online = endpoint is not None and endpoint.online
            up.append((labels, 1 if online else 0))
            if online and endpoint is not None and endpoint.latency_ms is not None:
                latency.append((labels, endpoint.latency_ms / 1000))
            breaker = router.breakers.get(node.fingerprint)
            state = breaker.state(now) if breaker is not None else BreakerState.CLOSED
            circuit.append((labels, CIRCUIT_VALUES[state]))
        for name, help_text, samples in (
                ("sluice_node_up", "1 when the node's last check found it online, else 0.", up),
                ("sluice_node_latency_seconds", "The round trip of the node's last health "
                 "check.", latency),
                ("sluice_circuit_state", "The node's circuit: 0 closed, 1 half-open, 2 open.",
                 circuit)):
            out.family(name, "gauge", help_text)
            for labels, value in samples:
                out.sample(name, labels, value)
        out.family("sluice_client_connections", "gauge", "Client connections open now.")
        for transport, count in self._connections.items():
            out.sample("sluice_client_connections", label_set(("transport", transport)),
                       count)


def _models(out: Exposition, ondemand: OnDemand) -> None:
    """The managed models' figures (SPEC §11), read from the lifecycle."""
    from proxy.models.managed import LOAD_BUCKETS, OUTCOMES

    models = sorted(ondemand.lifecycle.models.items())
    les = bucket_labels(LOAD_BUCKETS)
    out.family("sluice_model_loads_total", "counter",
               "Loads of a managed model, by how they ended.")
    for name, model in models:
        for outcome in OUTCOMES:
            out.sample("sluice_model_loads_total",
                       label_set(("model", name), ("outcome", outcome)),
                       model.loads.outcomes.get(outcome, 0))
    out.family("sluice_model_load_seconds", "histogram",
               "Time from the start of a managed model's load to its server answering.")
    for name, model in models:
        out.histogram("sluice_model_load_seconds", label_set(("model", name)), les,
                      model.loads.buckets, model.loads.seconds)
    out.family("sluice_model_loaded", "gauge", "1 when the managed model is loaded, else 0.")
    for name, model in models:
        out.sample("sluice_model_loaded", label_set(("model", name)),
                   1 if model.state is ModelState.LOADED else 0)
    out.family("sluice_model_memory_bytes", "gauge",
               "The managed model's server's measured memory (RSS) while loaded, else 0.")
    for name, model in models:
        out.sample("sluice_model_memory_bytes", label_set(("model", name)),
                   model.memory if model.state is ModelState.LOADED else 0)
