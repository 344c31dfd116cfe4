"""Resolution (SPEC §7.1, §7.4): the seed document's fallback table, row by row; then
loaded holders first (SPEC §11)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest

from protocol.strategies import RoundRobinCursor
from proxy.routing.breaker import BreakerState, CircuitBreaker
from proxy.routing.resolve import (
    ALL_CIRCUITS_OPEN,
    MODEL_NOT_AVAILABLE,
    Forward,
    NodeView,
    NoRoute,
    RouteRequest,
    resolve,
)

NOW = 1000.0
TTL = 30.0
MNA, ACO = MODEL_NOT_AVAILABLE, ALL_CIRCUITS_OPEN


def breaker(circuit: str = "closed") -> CircuitBreaker:
    """A 3-failure, 60 s breaker in the named state at NOW."""
    b = CircuitBreaker(3, 60.0)
    if circuit == "closed":
        return b
    failed_at = NOW - 1 if circuit == "open" else NOW - 60
    for _ in range(3):
        permit = b.allow(failed_at, TTL)
        assert permit is not None
        b.record_failure(permit, failed_at)
    if circuit == "probe_out":
        assert b.allow(NOW, TTL) is not None
    return b


def node(fp: str, priority: int, models: str = "m", *, enabled: bool = True,
         online: bool = True, circuit: str = "closed", in_flight: int = 0,
         latency: float | None = None, loaded: str | None = None) -> NodeView:
    """``loaded``: the models it has loaded (SPEC §11); None = all it holds."""
    held = frozenset(models.split())
    return NodeView(fp, priority, held, breaker(circuit), enabled=enabled,
                    online=online, in_flight=in_flight, latency_ms=latency,
                    loaded=held if loaded is None else frozenset(loaded.split()))


def three(**circuits: str) -> list[NodeView]:
    """Nodes a, b, c (priorities 3, 2, 1), all holding model m."""
    return [node(fp, p, circuit=circuits.get(fp, "closed")) for fp, p in
            (("a", 3), ("b", 2), ("c", 1))]


def probe_out(view: NodeView) -> bool:
    return view.breaker.probe_out


class Row(NamedTuple):
    case: str
    request: dict[str, Any]  # RouteRequest fields beyond model/probe_ttl
    nodes: list[NodeView]
    expected: str  # "refuse <code>" or "forward <fingerprints in order>" (local: test_plan)
    may_fail_over: bool | None = None


LB = {"load_balancing": True}
ROWS = [
    # Load balancing off: local only, 503 when the model is not running here.
    Row("lb_off_model_not_local_is_503", {"load_balancing": False}, three(),
        f"refuse {MNA}"),
    # Load balancing on.
    Row("lb_on_model_on_a_node_is_forwarded", LB, [node("a", 3, "x"), node("b", 2, "m x")],
        "forward b", True),
    Row("lb_on_model_nowhere_is_503", LB, [node("a", 3, "x y")], f"refuse {MNA}"),
    Row("lb_on_no_nodes_is_503", LB, [], f"refuse {MNA}"),
    Row("lb_on_holders_in_priority_order", LB, [node("c", 1), node("a", 3), node("b", 2)],
        "forward abc"),
    Row("lb_on_holders_least_loaded", {**LB, "strategy": "least-loaded"},
        [node("a", 3, in_flight=4), node("b", 2, in_flight=1), node("c", 1, in_flight=1)],
        "forward bca"),
    Row("lb_on_holders_fastest", {**LB, "strategy": "fastest"},
        [node("a", 3), node("b", 2, latency=80.0), node("c", 1, latency=15.0)], "forward cba"),
    Row("lb_on_holders_round_robin_first_turn", {**LB, "strategy": "round-robin"}, three(),
        "forward abc"),
    Row("disabled_node_skipped", LB, [node("a", 3, enabled=False), node("b", 2)],
        "forward b"),
    Row("offline_node_skipped", LB, [node("a", 3, online=False), node("b", 2)], "forward b"),
    Row("only_disabled_or_offline_holders_is_503", LB,
        [node("a", 3, enabled=False), node("b", 2, online=False)], f"refuse {MNA}"),
    # Circuit breaker.
    Row("open_circuit_node_skipped_alternate_used", LB, three(a="open"), "forward bc"),
    Row("all_holders_circuits_open_is_503", LB, three(a="open", b="open", c="open"),
        f"refuse {ACO}"),
    Row("half_open_node_is_a_candidate_with_its_probe", LB, three(a="half_open"),
        "forward abc"),
    Row("half_open_node_with_probe_out_skipped", LB, three(a="probe_out"), "forward bc"),
    Row("only_probe_out_and_open_holders_is_all_circuits_open", LB,
        [node("a", 3, circuit="probe_out"), node("b", 2, circuit="open")], f"refuse {ACO}"),
    Row("online_by_health_check_but_circuit_open_still_skipped", LB,
        [node("a", 3, online=True, circuit="open")], f"refuse {ACO}"),
    # Failover: on a connect error or 5xx, resolved again without the failed node, once.
    Row("node_unreachable_failover_on_may_retry", LB, three(), "forward abc", True),
    Row("node_unreachable_failover_on_retry_excludes_tried", {**LB, "tried": {"a"}}, three(),
        "forward bc", False),
    Row("node_unreachable_failover_off_error_to_client", {**LB, "failover": False}, three(),
        "forward abc", False),
    Row("failover_without_an_alternate_is_refused", {**LB, "tried": {"a"}}, [node("a", 3)],
        f"refuse {MNA}"),
    Row("open_circuit_skipped_also_as_failover_target", {**LB, "tried": {"a"}},
        three(b="open"), "forward c", False),
    Row("failover_with_only_open_circuits_left", {**LB, "tried": {"a"}},
        three(b="open", c="open"), f"refuse {ACO}"),
    # Loaded first (load_balancing.prefer_loaded, SPEC §11): the strategy within each group.
    Row("loaded_holder_before_a_higher_priority_cold_one", LB,
        [node("a", 3, loaded=""), node("b", 2), node("c", 1, "m x", loaded="x")],
        "forward bac"),
    Row("prefer_loaded_off_is_the_plain_order", {**LB, "prefer_loaded": False},
        [node("a", 3, loaded=""), node("b", 2), node("c", 1, "m x", loaded="x")],
        "forward abc"),
    Row("nobody_loaded_is_the_plain_order", LB,
        [node("a", 3, loaded=""), node("b", 2, loaded=""), node("c", 1, loaded="")],
        "forward abc"),
    Row("loaded_first_least_loaded_within_groups", {**LB, "strategy": "least-loaded"},
        [node("a", 3, in_flight=3), node("b", 2, in_flight=1),
         node("c", 1, loaded="", in_flight=0)], "forward bac"),
    Row("loaded_holder_with_open_circuit_skipped", LB,
        [node("a", 3, loaded=""), node("b", 2, circuit="open")], "forward a"),
    Row("loaded_failover_target_first", {**LB, "tried": {"b"}},
        [node("a", 3, loaded=""), node("b", 2), node("c", 1)], "forward ca", False),
    # Loop guard: a forwarded request is served locally or refused, never forwarded.
    Row("forwarded_request_not_local_is_503_never_a_node", {**LB, "forwarded": True},
        three(), f"refuse {MNA}"),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_resolution_table(row: Row) -> None:
    fields = dict(row.request)
    fields["tried"] = frozenset(fields.get("tried", ()))
    request = RouteRequest(model="m", probe_ttl=TTL, **fields)
    result = resolve(request, row.nodes, RoundRobinCursor(), NOW)
    kind, _, detail = row.expected.partition(" ")
    if kind == "refuse":
        assert isinstance(result, NoRoute)
        assert (result.status, result.code) == (503, detail)
    else:
        assert isinstance(result, Forward)
        assert "".join(result.fingerprints) == detail
        if row.may_fail_over is not None:
            assert result.may_fail_over is row.may_fail_over


def request(**fields: Any) -> RouteRequest:
    return RouteRequest(model="m", load_balancing=True, probe_ttl=TTL, **fields)


def test_failover_sequence_with_breakers() -> None:
    nodes = three()
    first = resolve(request(), nodes, RoundRobinCursor(), NOW)
    assert isinstance(first, Forward)
    target = first.choose(NOW)
    assert target.fingerprint == "a"
    target.failed(NOW + 1)  # connect error
    assert nodes[0].breaker.consecutive_failures == 1
    again = resolve(request(tried=frozenset({"a"})), nodes, RoundRobinCursor(), NOW + 1)
    assert isinstance(again, Forward)
    assert again.fingerprints == ("b", "c")
    assert not again.may_fail_over
    again.choose(NOW + 1).succeeded(NOW + 2)
    assert nodes[1].breaker.consecutive_failures == 0


def test_choose_releases_the_probes_it_did_not_use() -> None:
    nodes = [node("a", 3), node("b", 2, circuit="half_open")]
    route = resolve(request(), nodes, RoundRobinCursor(), NOW)
    assert isinstance(route, Forward)
    assert probe_out(nodes[1])  # b was granted its probe as a candidate
    assert route.choose(NOW).fingerprint == "a"
    assert not probe_out(nodes[1])  # released unchanged
    assert nodes[1].breaker.state(NOW) is BreakerState.HALF_OPEN


def test_ten_concurrent_resolutions_to_a_half_open_node_send_one_probe() -> None:
    nodes = [node("a", 3, circuit="half_open")]
    results = [resolve(request(), nodes, RoundRobinCursor(), NOW) for _ in range(10)]
    forwards = [r for r in results if isinstance(r, Forward)]
    assert len(forwards) == 1
    assert forwards[0].targets[0].permit.probe
    assert {r.code for r in results if isinstance(r, NoRoute)} == {ACO}
    forwards[0].choose(NOW).succeeded(NOW + 1)
    assert nodes[0].breaker.state(NOW + 1) is BreakerState.CLOSED


def test_round_robin_cursor_advances_once_per_resolution() -> None:
    nodes, cursor = three(), RoundRobinCursor()
    firsts = []
    for _ in range(4):
        route = resolve(request(strategy="round-robin"), nodes, cursor, NOW)
        assert isinstance(route, Forward)
        firsts.append(route.choose(NOW).fingerprint)
    assert firsts == ["a", "b", "c", "a"]


def test_refusal_errors() -> None:
    missing = NoRoute("m", MNA).error()
    assert (missing.status, missing.code, missing.param) == (503, MNA, "model")
    opened = NoRoute("m", ACO).error()
    assert (opened.status, opened.code) == (503, ACO)
    assert json.loads(opened.body())["error"]["code"] == ACO


def test_bad_input_takes_no_permit() -> None:
    nodes = [node("a", 3, circuit="half_open")]
    with pytest.raises(ValueError, match="random"):
        resolve(request(strategy="random"), nodes, RoundRobinCursor(), NOW)
    assert not probe_out(nodes[0])
    with pytest.raises(ValueError, match="twice"):
        resolve(request(), [node("a", 3), node("a", 2)], RoundRobinCursor(), NOW)
