"""``GET /metrics`` (SPEC §9.2): every counter and histogram after a known sequence of
requests, the gauges read from their owners, the label rules (only configured names,
``none``, at most 500 models then ``other``), always parsed with prometheus_client's own
text parser.

First in memory, with handmade request records given to the aggregator through the hub;
then end to end, with in-process gateways, fake model servers and fake nodes
(tests/test_metrics_gateway.py)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from protocol.config import BackendConfig, Config, NodeConfig
from protocol.request_info import RequestInfo, TimeoutClass
from protocol.request_record import RequestRecord
from proxy.context import Clients
from proxy.observe.exposition import Exposition, label_set
from proxy.observe.hub import Hub
from proxy.observe.metrics import (
    DURATION_BUCKETS,
    MAX_MODEL_LABELS,
    TTFB_BUCKETS,
    Metrics,
)
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import OFFLINE, ONLINE, NodeIndex
from proxy.routing.attempts import Outcome
from proxy.routing.router import Router
from tests.test_plan import FakeSettings

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

FAMILIES = {  # SPEC §9.2: every name and its type
    "sluice_requests": "counter",
    "sluice_request_duration_seconds": "histogram",
    "sluice_time_to_first_byte_seconds": "histogram",
    "sluice_time_to_first_token_seconds": "histogram",
    "sluice_stream_events": "counter",
    "sluice_tokens": "counter",
    "sluice_upstream_attempts": "counter",
    "sluice_failovers": "counter",
    "sluice_prompt_tokens_cached": "counter",  # SPEC §15
    "sluice_routing_affinity": "counter",
    "sluice_queue_waiting": "gauge",  # SPEC §18
    "sluice_queue_wait_seconds": "histogram",
    "sluice_queue_rejected": "counter",
    "sluice_upstream_active_requests": "gauge",
    "sluice_node_up": "gauge",
    "sluice_node_latency_seconds": "gauge",
    "sluice_circuit_state": "gauge",
    "sluice_client_connections": "gauge",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_start_time_seconds": "gauge",
    "sluice_build_info": "gauge",
}


def parse(text: bytes) -> tuple[dict[str, str], Samples]:
    """Family name -> type, and (sample name, labels) -> value, by prometheus_client's own
    parser (it refuses what is not the text format)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        assert family.name not in types, f"{family.name} twice"
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"{key} twice"
            samples[key] = sample.value
    return types, samples


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples called ``name``, by label set."""
    return {labels: value for (n, labels), value in samples.items() if n == name}


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def histogram(samples: Samples, name: str, bounds: tuple[float, ...],
              **pairs: str) -> tuple[list[float], float, float]:
    """A histogram series' cumulative bucket counts (+Inf last), its count and its sum."""
    buckets = [samples[f"{name}_bucket", labels(le=le, **pairs)]
               for le in [*(repr(b) for b in bounds), "+Inf"]]
    return (buckets, samples[f"{name}_count", labels(**pairs)],
            samples[f"{name}_sum", labels(**pairs)])


def expected_buckets(bounds: tuple[float, ...], values: list[float]) -> list[float]:
    """What a histogram's cumulative buckets must be: how many values are <= each bound."""
    return [float(sum(v <= b for v in values)) for b in (*bounds, float("inf"))]


NODES = (NodeConfig("node-a", "node-a", "http://127.0.0.2:9", 3),
         NodeConfig("node-b", "node-b", "http://127.0.0.3:9", 2),
         NodeConfig("node-c", "node-c", "http://127.0.0.4:9", 1, enabled=False))


def gateway_parts(*, nodes: tuple[NodeConfig, ...] = NODES) -> tuple[Router, Clients, Hub,
                                                                        Metrics]:
    """A router over one local backend ``fake`` (holding ``m``) and ``nodes``; the metrics
    reading it, attached to a hub."""
    config = attrs.evolve(Config(), backends=(BackendConfig("fake", "http://127.0.0.1:9"),),
                          nodes=nodes)
    backends = BackendRegistry(config.backends, {})
    backends.ready.set()
    backends.checked(backends.backends[0], [{"id": "m"}], None, 1.0)
    index = NodeIndex()
    index.sync(nodes)
    index.round_done()
    router = Router(FakeSettings(config), backends, index)  # type: ignore[arg-type]
    clients = Clients()
    hub = Hub()
    metrics = Metrics(router, clients.by_transport, "9.9.9")
    metrics.attach(hub)
    return router, clients, hub, metrics


def record(**fields: Any) -> RequestRecord:
    """A finished request: a whole answer of model ``m`` from local:fake, unless told."""
    values: dict[str, Any] = {
        "id": "r", "started_at": 1.7e9, "method": "POST", "path": "/v1/chat/completions",
        "model": "m", "stream": False, "transport": "unix", "served_by": "local:fake",
        "status": 200, "outcome": "success", "failover": None, "ttfb": 0.001,
        "duration": 0.002, "bytes_out": 100, "events": None, "usage": None, "error": None,
        "attempts": (("local:fake", "success"),), "routed": True}
    values.update(fields)
    return RequestRecord(**values)


# The known sequence: (what it stands for, its record).
SEQUENCE = [
    ("local, whole", record(ttfb=0.003, duration=0.004,
                            usage={"prompt_tokens": 5, "completion_tokens": 1})),
    ("local, streamed", record(stream=True, ttfb=0.02, ttft=0.05, duration=0.3, events=5,
                               usage={"prompt_tokens": 3, "completion_tokens": 4})),
    ("forwarded, whole", record(served_by="node:node-a", ttfb=0.04, duration=0.06,
                                usage={"input_tokens": 2, "output_tokens": 8},
                                attempts=(("node:node-a", "success"),))),
    ("failed over, streamed", record(
        served_by="node:node-b", stream=True, failover="node-a", ttfb=0.2, ttft=0.2,
        duration=2.0,
        events=4, attempts=(("node:node-a", "failure"), ("node:node-b", "success")))),
    ("aborted mid-stream", record(stream=True, outcome="aborted", ttfb=0.01, ttft=1.0,
                                  duration=1.5, events=2,
                                  attempts=(("local:fake", "aborted"),))),
    ("aborted before the answer", record(stream=True, status=0, outcome="aborted", ttfb=None,
                                         duration=0.05, attempts=(("local:fake", "aborted"),))),
    ("timed out (504)", record(status=504, outcome="failure", error="upstream_timeout", ttfb=30.0,
                               duration=30.0, attempts=(("local:fake", "failure"),))),
    ("the upstream's 400", record(status=400, outcome="refused", ttfb=0.001, duration=0.001,
                                  attempts=(("local:fake", "refused"),))),
    ("unknown model (404)", record(model="nope", routed=False, served_by=None, status=404,
                                   outcome="refused", error="model_not_found", ttfb=0.0002,
                                   duration=0.0002, attempts=())),
    ("no upstream (503)", record(model="elsewhere", routed=False, served_by=None, status=503,
                                 outcome="refused", error="model_not_available", ttfb=0.0003,
                                 duration=0.0003, attempts=())),
]


async def test_every_counter_and_histogram_after_a_known_sequence() -> None:
    _, _, hub, metrics = gateway_parts()
    for _, one in SEQUENCE:
        hub.publish("request", one)
    types, samples = parse(metrics.render())
    assert types == FAMILIES
    assert series(samples, "sluice_requests_total") == {
        labels(model="m", served_by="local:fake", api="openai", code="200"): 3,
        labels(model="m", served_by="local:fake", api="openai", code="0"): 1,
        labels(model="m", served_by="local:fake", api="openai", code="504"): 1,
        labels(model="m", served_by="local:fake", api="openai", code="400"): 1,
        labels(model="m", served_by="node:node-a", api="openai", code="200"): 1,
        labels(model="m", served_by="node:node-b", api="openai", code="200"): 1,
        labels(model="none", served_by="none", api="openai", code="404"): 1,
        labels(model="none", served_by="none", api="openai", code="503"): 1,
    }
    # Each histogram series, against the values its records carried.
    groups: dict[tuple[str, str, str], list[RequestRecord]] = {}
    for _, one in SEQUENCE:
        key = ((one.model or "none") if one.routed else "none", one.served_by or "none",
               "true" if one.stream else "false")
        groups.setdefault(key, []).append(one)
    assert len(groups) == 5
    for (model, served_by, stream), members in groups.items():
        pairs = {"model": model, "served_by": served_by, "stream": stream}
        for name, bounds, values in (
                ("sluice_request_duration_seconds", DURATION_BUCKETS,
                 [r.duration for r in members]),
                ("sluice_time_to_first_byte_seconds", TTFB_BUCKETS,
                 [r.ttfb for r in members if r.ttfb is not None]),
                ("sluice_time_to_first_token_seconds", TTFB_BUCKETS,
                 [r.ttft for r in members if r.ttft is not None])):
            buckets, count, total = histogram(samples, name, bounds, **pairs)
            assert buckets == expected_buckets(bounds, values), (name, pairs)
            assert count == len(values)
            assert total == pytest.approx(sum(values))
    # A few buckets by hand: a value on a bound falls in that bucket (le is "<=").
    local_whole = {"model": "m", "served_by": "local:fake", "stream": "false"}
    buckets, count, _ = histogram(samples, "sluice_request_duration_seconds",
                                  DURATION_BUCKETS, **local_whole)
    assert count == 3
    assert buckets[DURATION_BUCKETS.index(0.005)] == 2  # 0.004 and 0.001
    assert buckets[DURATION_BUCKETS.index(20.0)] == 2
    assert buckets[DURATION_BUCKETS.index(30.0)] == 3  # the 504 at exactly 30 s
    buckets, count, _ = histogram(samples, "sluice_time_to_first_byte_seconds",
                                  TTFB_BUCKETS, **local_whole)
    assert buckets[0] == 1  # 0.001 is in le="0.001"
    _, count, _ = histogram(samples, "sluice_time_to_first_byte_seconds", TTFB_BUCKETS,
                            model="m", served_by="local:fake", stream="true")
    assert count == 2  # no first byte for the request that ended before its answer
    buckets, count, total = histogram(samples, "sluice_time_to_first_token_seconds",
                                      TTFB_BUCKETS, model="m", served_by="local:fake",
                                      stream="true")
    assert count == 2  # the streams with a data event only
    assert total == pytest.approx(1.05)
    assert buckets[TTFB_BUCKETS.index(0.05)] == 1
    assert series(samples, "sluice_stream_events_total") == {
        labels(model="m", served_by="local:fake"): 7,
        labels(model="m", served_by="node:node-a"): 0,
        labels(model="m", served_by="node:node-b"): 4,
        labels(model="none", served_by="none"): 0,
    }
    assert series(samples, "sluice_tokens_total") == {
        labels(model="m", served_by="local:fake", type="prompt"): 8,
        labels(model="m", served_by="local:fake", type="completion"): 5,
        labels(model="m", served_by="node:node-a", type="prompt"): 2,
        labels(model="m", served_by="node:node-a", type="completion"): 8,
        labels(model="m", served_by="node:node-b", type="prompt"): 0,
        labels(model="m", served_by="node:node-b", type="completion"): 0,
        labels(model="none", served_by="none", type="prompt"): 0,
        labels(model="none", served_by="none", type="completion"): 0,
    }
    assert series(samples, "sluice_upstream_attempts_total") == {
        labels(upstream="local:fake", outcome="success"): 2,
        labels(upstream="local:fake", outcome="refused"): 1,
        labels(upstream="local:fake", outcome="failure"): 1,
        labels(upstream="local:fake", outcome="aborted"): 2,
        labels(upstream="node:node-a", outcome="success"): 1,
        labels(upstream="node:node-a", outcome="failure"): 1,
        labels(upstream="node:node-b", outcome="success"): 1,
    }
    assert series(samples, "sluice_failovers_total") == {labels(): 1}
    # No model id the gateway did not route, nothing that was not configured.
    every_label = {value for (_, pairs) in samples for _, value in pairs}
    assert not every_label & {"nope", "elsewhere"}


async def test_an_empty_gateway_shows_every_family() -> None:
    _, _, _, metrics = gateway_parts()
    types, samples = parse(metrics.render())
    assert types == FAMILIES
    assert series(samples, "sluice_requests_total") == {}
    assert series(samples, "sluice_failovers_total") == {labels(): 0}
    assert series(samples, "sluice_build_info") == {labels(version="9.9.9"): 1}
    assert samples["process_start_time_seconds", labels()] > 1e9
    assert samples["process_resident_memory_bytes", labels()] > 0
    assert samples["process_open_fds", labels()] > 0
    assert ("process_cpu_seconds_total", labels()) in samples
    assert series(samples, "sluice_client_connections") == {
        labels(transport="unix"): 0, labels(transport="tcp"): 0}


@pytest.mark.slow
async def test_at_most_500_models_then_other() -> None:
    _, _, hub, metrics = gateway_parts()
    for i in range(MAX_MODEL_LABELS + 100):
        hub.publish("request", record(model=f"model-{i:03}"))
    hub.publish("request", record(model="model-007"))  # admitted before the cap: its own
    _, samples = parse(metrics.render())
    requests = series(samples, "sluice_requests_total")
    models = {dict(pairs)["model"] for pairs in requests}
    assert len(models) == MAX_MODEL_LABELS + 1
    assert "other" in models
    other = labels(model="other", served_by="local:fake", api="openai", code="200")
    assert requests[other] == 100
    seventh = labels(model="model-007", served_by="local:fake", api="openai", code="200")
    assert requests[seventh] == 2
    assert "model-499" in models
    assert "model-599" not in models


async def test_label_values_are_escaped() -> None:
    _, _, hub, metrics = gateway_parts()
    odd = 'we"ird\\model\nid'
    hub.publish("request", record(model=odd))
    _, samples = parse(metrics.render())
    assert series(samples, "sluice_requests_total") == {
        labels(model=odd, served_by="local:fake", api="openai", code="200"): 1}


async def test_gauges_read_their_owners(autojump_clock: trio.testing.MockClock) -> None:
    router, clients, _, metrics = gateway_parts()
    index = router.nodes
    a, b = index.endpoints  # node-c is disabled: not indexed
    index.checked(a, ONLINE, [{"id": "remote"}], None, 12.5)
    index.checked(b, OFFLINE, [], "connection refused", None)
    cb = router.settings.config.circuit_breaker
    breaker = router._breaker("node-b", cb)
    now = trio.current_time()
    for _ in range(cb.failure_threshold):
        permit = breaker.allow(now, 30.0)
        assert permit is not None
        breaker.record_failure(permit, now)
    plan = await router.plan(RequestInfo("m", False, TimeoutClass.STANDARD), [])
    clients.by_transport["unix"] = 2
    clients.by_transport["tcp"] = 1
    _, samples = parse(metrics.render())
    assert series(samples, "sluice_upstream_active_requests") == {
        labels(upstream="local:fake"): 1, labels(upstream="node:node-a"): 0,
        labels(upstream="node:node-b"): 0, labels(upstream="node:node-c"): 0}
    assert series(samples, "sluice_node_up") == {
        labels(node="node-a"): 1, labels(node="node-b"): 0, labels(node="node-c"): 0}
    assert series(samples, "sluice_node_latency_seconds") == {labels(node="node-a"): 0.0125}
    assert series(samples, "sluice_circuit_state") == {
        labels(node="node-a"): 0, labels(node="node-b"): 2, labels(node="node-c"): 0}
    assert series(samples, "sluice_client_connections") == {
        labels(transport="unix"): 2, labels(transport="tcp"): 1}
    plan.attempt.finish(Outcome.SUCCESS, trio.current_time())
    await trio.sleep(cb.reset_timeout)
    _, samples = parse(metrics.render())
    assert series(samples, "sluice_upstream_active_requests")[labels(upstream="local:fake")] == 0
    assert series(samples, "sluice_circuit_state")[labels(node="node-b")] == 1  # half-open


async def test_detached_metrics_count_nothing() -> None:
    _, _, hub, metrics = gateway_parts()
    metrics.detach()
    hub.publish("request", record())
    _, samples = parse(metrics.render())
    assert series(samples, "sluice_requests_total") == {}
    assert not hub.wants("request")


def test_exposition_lines() -> None:
    out = Exposition()
    out.family("x_total", "counter", "Things.")
    out.sample("x_total", label_set(("a", "1"), ("b", 'q"')), 3)
    out.sample("x_total", "", 0.5)
    assert out.text() == (b'# HELP x_total Things.\n# TYPE x_total counter\n'
                          b'x_total{a="1",b="q\\""} 3\nx_total 0.5\n')
