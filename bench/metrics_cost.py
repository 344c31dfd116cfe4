"""The per-request cost of the metrics (SPEC §9.2, issue 12): what counting one finished
request costs with sluice's aggregator (:class:`proxy.observe.metrics.Metrics`: plain dicts
and lists, rendered by a prometheus_client collector at scrape time) against the same
updates made with prometheus_client's own ``Counter``/``Histogram``
(``.labels(...).inc()`` / ``.observe()``), for the records of S1 (a whole answer served by
a local backend, with ``usage``) and S3 (a stream of 20 SSE events), each delivered
through the hub as the gateway does.

A microbenchmark, not a test: ``PYTHONPATH=. .venv/bin/python bench/metrics_cost.py``.
Prints µs per request (the median of the rounds' medians, and the best round) and one
scrape's time with 1 and with 200 series.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from protocol.request_record import RequestRecord, token_counts
from proxy.context import Clients
from proxy.observe.hub import Hub
from proxy.observe.metrics import (
    DURATION_BUCKETS,
    MAX_MODEL_LABELS,
    NONE,
    OTHER,
    TTFB_BUCKETS,
    Metrics,
)
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.settings.store import Settings

USAGE = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}


def s1_record(i: int) -> RequestRecord:
    return RequestRecord(
        id=f"req-{i}", started_at=1.7e9, method="POST", path="/v1/chat/completions",
        model="fake-model", stream=False, transport="tcp", served_by="local:fake",
        status=200, outcome="success", failover=None, ttfb=0.0004, duration=0.0005,
        bytes_out=310, events=None, usage=USAGE, error=None,
        attempts=(("local:fake", "success"),), routed=True)


def s3_record(i: int) -> RequestRecord:
    return RequestRecord(
        id=f"req-{i}", started_at=1.7e9, method="POST", path="/v1/chat/completions",
        model="fake-model", stream=True, transport="tcp", served_by="local:fake",
        status=200, outcome="success", failover=None, ttfb=0.0007, duration=0.004,
        bytes_out=4100, events=20, usage=USAGE, error=None,
        attempts=(("local:fake", "success"),), routed=True)


class NativeMetrics:
    """The same figures with prometheus_client's own metric objects, updated per request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("sluice_requests", "", ["model", "served_by", "code"],
                                registry=r)
        self.duration = Histogram("sluice_request_duration_seconds", "",
                                  ["model", "served_by", "stream"], registry=r,
                                  buckets=DURATION_BUCKETS)
        self.ttfb = Histogram("sluice_time_to_first_byte_seconds", "",
                              ["model", "served_by", "stream"], registry=r,
                              buckets=TTFB_BUCKETS)
        self.events = Counter("sluice_stream_events", "", ["model", "served_by"], registry=r)
        self.tokens = Counter("sluice_tokens", "", ["model", "served_by", "type"], registry=r)
        self.attempts = Counter("sluice_upstream_attempts", "", ["upstream", "outcome"],
                                registry=r)
        self.failovers = Counter("sluice_failovers", "", registry=r)
        self.models: set[str] = set()

    def on_request(self, kind: str, at: float, record: RequestRecord) -> None:
        model = record.model
        if not record.routed or model is None:
            model = NONE
        elif model not in self.models:
            if len(self.models) < MAX_MODEL_LABELS:
                self.models.add(model)
            else:
                model = OTHER
        served_by = record.served_by or NONE
        stream = "true" if record.stream else "false"
        self.requests.labels(model, served_by, str(record.status)).inc()
        self.duration.labels(model, served_by, stream).observe(record.duration)
        if record.ttfb is not None:
            self.ttfb.labels(model, served_by, stream).observe(record.ttfb)
        if record.events:
            self.events.labels(model, served_by).inc(record.events)
        tokens = token_counts(record.usage)
        if tokens is not None:
            self.tokens.labels(model, served_by, "prompt").inc(tokens[0])
            self.tokens.labels(model, served_by, "completion").inc(tokens[1])
        for upstream, outcome in record.attempts:
            self.attempts.labels(upstream, outcome).inc()
        if record.failover is not None:
            self.failovers.inc()


def per_request_us(publish: Callable[[RequestRecord], None], records: list[RequestRecord],
                   rounds: int) -> list[float]:
    """µs per request of each round (one round publishes every record once)."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for record in records:
            publish(record)
        out.append((time.perf_counter() - start) / len(records) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="records per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.open(Path(tmp))  # writes the default config.yaml
        router = Router(settings, BackendRegistry((), {}), NodeIndex())

        def measure() -> None:
            print(f"{args.requests} records x {args.rounds} rounds; µs per request "
                  "(median of rounds / best round), each published through the hub")
            for name, make in (("S1 whole answer", s1_record), ("S3 stream", s3_record)):
                records = [make(i) for i in range(args.requests)]
                rows = []
                for label, subscribe in (
                        ("none subscribed", None),
                        ("sluice aggregator", "ours"),
                        ("prometheus_client Counter/Histogram", "native")):
                    hub = Hub()
                    if subscribe == "ours":
                        Metrics(router, Clients().by_transport, "bench").attach(hub)
                    elif subscribe == "native":
                        hub.subscribe(NativeMetrics().on_request, ("request",))

                    def publish(record: RequestRecord, hub: Hub = hub) -> None:
                        hub.publish("request", record)

                    per_request_us(publish, records, 2)  # warm up
                    figures = per_request_us(publish, records, args.rounds)
                    rows.append((label, statistics.median(figures), min(figures)))
                print(f"\n{name}")
                for label, median, best in rows:
                    print(f"  {label:38} {median:6.2f} / {best:6.2f}")
            print("\none scrape, ms (median of 9), models x (stream, whole) series")
            for models in (1, 10, 200):
                hub = Hub()
                ours = Metrics(router, Clients().by_transport, "bench")
                ours.attach(hub)
                native = NativeMetrics()
                hub.subscribe(native.on_request, ("request",))
                for i in range(models):
                    for make in (s1_record, s3_record):
                        record = make(i)
                        record.model = f"model-{i}"
                        hub.publish("request", record)
                for label, scrape in (
                        ("sluice (own exposition + process)", ours.render),
                        ("prometheus_client generate_latest",
                         lambda n=native: generate_latest(n.registry))):
                    times = []
                    for _ in range(9):
                        start = time.perf_counter()
                        size = len(scrape())
                        times.append((time.perf_counter() - start) * 1000)
                    print(f"  {models:3} model(s): {label:36} {statistics.median(times):7.2f}"
                          f" ms, {size} bytes")

        async def run() -> None:
            measure()

        trio.run(run)  # a scrape reads trio's clock (the circuit states)


if __name__ == "__main__":
    main()
