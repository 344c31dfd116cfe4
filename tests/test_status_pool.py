"""``sluice status``: the node pool table (issue 6). The table is a pure function of the
status's ``distributed`` block and the three pool answers (the registry, distributed-status
and routing-stats), tested here with fixed inputs; one test runs ``sluice status`` against
an in-process gateway with load balancing on and a node registered."""

from __future__ import annotations

from typing import Any

from proxy.cli.render import show, show_pool

SUMMARY = {"enabled": True, "strategy": "priority", "totalNodes": 2, "onlineNodes": 1,
           "remoteModels": 3}


def registry(fp: str, name: str, priority: int, enabled: bool = True) -> dict[str, Any]:
    return {"fingerprint": fp, "name": name, "baseUrl": "http://192.168.1.50:39080",
            "priority": priority, "enabled": enabled, "hasApiKey": False}


def health(fp: str, status: str, latency: int | None, models: int,
           priority: int) -> dict[str, Any]:
    return {"fingerprint": fp, "baseUrl": "http://192.168.1.50:39080", "status": status,
            "latencyMs": latency, "loadedModelCount": models, "priority": priority}


def stats(fp: str, name: str, counts: tuple[int, int, int, int], avg: float | None,
          state: str = "closed", failures: int = 0, enabled: bool = True) -> dict[str, Any]:
    active, ok, failed, aborted = counts
    return {"fingerprint": fp, "name": name, "enabled": enabled,
            "totalRequests": active + ok + failed + aborted, "successCount": ok,
            "failureCount": failed, "abortedCount": aborted, "avgLatencyMs": avg,
            "activeRequests": active, "circuitOpen": state == "open", "circuitState": state,
            "consecutiveFailures": failures}


def routing_stats(*nodes: dict[str, Any], failovers: int = 0) -> dict[str, Any]:
    local = {"totalRequests": 40, "successCount": 39, "failureCount": 0, "abortedCount": 1,
             "avgLatencyMs": 3.25, "activeRequests": 0}
    parts = [*nodes, local]
    return {"nodes": list(nodes), "local": local,
            "totalRequests": sum(p["totalRequests"] for p in parts),
            "totalSuccesses": sum(p["successCount"] for p in parts),
            "totalFailures": sum(p["failureCount"] for p in parts),
            "totalAborted": sum(p["abortedCount"] for p in parts),
            "failovers": failovers,
            "circuitBreaker": {"failureThreshold": 3, "resetTimeoutSecs": 60}}


GPU, SPARE = "node-3f9a1c0b5e2d7a41", "node-77aa01bc22cd33ef"


def two_nodes() -> dict[str, Any]:
    return {
        "nodes": [registry(GPU, "gpu-box", 2), registry(SPARE, "spare", 1)],
        "distributedStatus": {
            "enabled": True, "strategy": "priority", "totalNodes": 2, "onlineNodes": 1,
            "models": [], "endpoints": [health(GPU, "online", 12, 3, 2),
                                        health(SPARE, "offline", None, 0, 1)]},
        "routingStats": routing_stats(
            stats(GPU, "gpu-box", (1, 117, 2, 0), 85.34),
            stats(SPARE, "spare", (0, 5, 4, 0), 1534.2, "open", 3), failovers=2),
    }


def test_two_nodes() -> None:
    assert show_pool(SUMMARY, two_nodes(), local_models=2) == (
        "load balancing: on, strategy priority, 1 of 2 nodes online, 3 remote models\n"
        "\n"
        "PRIO NODE                            STATUS  LATENCY MODELS CIRCUIT  IN-FLIGHT REQ  OK"
        " FAIL AVG-TTFB\n"
        "   - local                           -             -      2 -                0  40  39"
        "    0    3.2ms\n"
        "   2 gpu-box (node-3f9a1c0b5e2d7a41) online     12ms      3 closed           1 120 117"
        "    2   85.3ms\n"
        "   1 spare (node-77aa01bc22cd33ef)   offline       -      0 open (3)         0   9   5"
        "    4    1.53s\n"
        "\n"
        "totals: requests 169, successes 161, failures 6, aborted 1, failovers 2")


def test_why_a_node_is_offline_follows_the_totals() -> None:
    pool = two_nodes()
    pool["distributedStatus"]["endpoints"][1]["lastError"] = (
        "GET /v1/models answered 403 (a wrong key, or the node refuses this Host)")
    pool["distributedStatus"]["endpoints"][0]["lastError"] = None
    assert show_pool(SUMMARY, pool).splitlines()[-2:] == [
        "totals: requests 169, successes 161, failures 6, aborted 1, failovers 2",
        f"{SPARE}: GET /v1/models answered 403 (a wrong key, or the node refuses this Host)"]


def test_priority_order_and_half_open_circuit() -> None:
    """Rows follow the priorities whatever order the answers list them in. A wide CIRCUIT
    column leaves less room for NODE: the fingerprints are cut to fit."""
    pool = two_nodes()
    pool["nodes"].reverse()
    pool["distributedStatus"]["endpoints"].reverse()
    pool["routingStats"]["nodes"][0] = stats(GPU, "gpu-box", (0, 0, 3, 0), None, "half_open", 3)
    assert show_pool(SUMMARY, pool).splitlines()[2:6] == [
        "PRIO NODE                        STATUS  LATENCY MODELS CIRCUIT       IN-FLIGHT REQ OK"
        " FAIL AVG-TTFB",
        "   - local                       -             -      - -                     0  40 39"
        "    0    3.2ms",
        "   2 gpu-box (node-3f9a1c0b5e2…) online     12ms      3 half-open (3)         0   3  0"
        "    3        -",
        "   1 spare (node-77aa01bc22cd3…) offline       -      0 open (3)              0   9  5"
        "    4    1.53s"]


def test_load_balancing_off() -> None:
    pool = two_nodes()
    assert show_pool(None, pool) == "load balancing: off (2 nodes registered)"
    pool["nodes"].pop()
    assert show_pool(None, pool) == "load balancing: off (1 node registered)"
    assert show_pool(None, {**pool, "nodes": []}) == "load balancing: off (no nodes registered)"
    # No registry answer: routing-stats lists every configured node too.
    assert show_pool(None, {**pool, "nodes": None}) == "load balancing: off (2 nodes registered)"
    assert show_pool(None, {"nodes": None, "distributedStatus": None, "routingStats": None}) \
        == "load balancing: off"


def test_no_routing_stats() -> None:
    """A gateway without routing-stats (an older one answers 404): those columns are "-"."""
    pool = {**two_nodes(), "routingStats": None}
    assert show_pool(SUMMARY, pool, local_models=0).splitlines()[2:] == [
        "PRIO NODE                            STATUS  LATENCY MODELS CIRCUIT IN-FLIGHT REQ OK"
        " FAIL AVG-TTFB",
        "   - local                           -             -      0 -               -   -  -"
        "    -        -",
        "   2 gpu-box (node-3f9a1c0b5e2d7a41) online     12ms      3 -               -   -  -"
        "    -        -",
        "   1 spare (node-77aa01bc22cd33ef)   offline       -      0 -               -   -  -"
        "    -        -",
        "",
        "totals: - (no routing stats from this gateway)"]


def test_node_in_one_answer_only() -> None:
    """A disabled node is in routing-stats (every configured node) but not in
    distributed-status (enabled nodes only); a node only distributed-status lists has no
    name and no counters. No registry answer here."""
    pool = {
        "nodes": None,
        "distributedStatus": {"enabled": True, "strategy": "priority", "totalNodes": 1,
                              "onlineNodes": 1, "models": [],
                              "endpoints": [health("node-b", "online", 4, 1, 3)]},
        "routingStats": routing_stats(stats("node-a", "off-box", (0, 2, 0, 0), 10.0,
                                            enabled=False)),
    }
    assert show_pool(SUMMARY, pool).splitlines()[2:] == [
        "PRIO NODE             STATUS   LATENCY MODELS CIRCUIT IN-FLIGHT REQ OK FAIL AVG-TTFB",
        "   - local            -              -      - -               0  40 39    0    3.2ms",
        "   - off-box (node-a) disabled       -      - closed          0   2  2    0   10.0ms",
        "   3 node-b           online       4ms      1 -               -   -  -    -        -",
        "",
        "totals: requests 42, successes 41, failures 0, aborted 1, failovers 0"]


def test_long_names_are_cut_to_fit() -> None:
    """The table stays within 100 columns: a long name is cut first (the fingerprint
    kept whole while the name keeps 8 columns), then the fingerprint."""
    pool = two_nodes()
    pool["nodes"][1]["name"] = "spare-box-2"
    pool["nodes"][0]["name"] = "the old laptop in the cupboard under the stairs"
    lines = show_pool(SUMMARY, pool, local_models=2).splitlines()
    assert max(len(line) for line in lines) == 100
    assert lines[4].startswith("   2 the old… (node-3f9a1c0b5e2d7a…) online ")
    assert lines[5].startswith("   1 spare-b… (node-77aa01bc22cd33…) offline ")
    pool["distributedStatus"]["endpoints"][1]["status"] = "warming"
    pool["routingStats"]["nodes"][1].update(circuitState="closed", consecutiveFailures=0,
                                            avgLatencyMs=15.5)
    lines = show_pool(SUMMARY, pool, local_models=2).splitlines()
    assert max(len(line) for line in lines) == 100  # more room: the fingerprints fit
    assert lines[4].startswith("   2 the old… (node-3f9a1c0b5e2d7a41) online ")
    assert lines[5].startswith("   1 spare-b… (node-77aa01bc22cd33ef) warming ")
    # Wide characters (e.g. Hangul) take two columns each.
    pool["nodes"][0]["name"] = "거실 컴퓨터의 그래픽 카드가 있는 노드"
    lines = show_pool(SUMMARY, pool, local_models=2).splitlines()
    assert lines[4].startswith("   2 거실 컴… (node-3f9a1c0b5e2d7a41) online ")


def test_untrusted_text_cannot_drive_the_terminal() -> None:
    pool = two_nodes()
    pool["nodes"][1]["name"] = "ev\x1b[2J"
    text = show_pool(SUMMARY, pool)
    assert "\x1b" not in text
    assert "ev?[2J (node-77aa01bc22cd33ef)" in text


def test_show_puts_the_pool_after_the_gateway_lines() -> None:
    status = {"socketPath": "/run/sluice.sock", "routerPort": 39080, "models": ["m"],
              "loadedModels": 1, "backends": [], "managedModels": [],
              "distributed": SUMMARY, "pool": two_nodes(),
              "notifications": [{"level": "warning", "message": "note"}]}
    lines = show(status).splitlines()
    assert lines[:3] == [
        "gateway: running; local socket /run/sluice.sock; TCP port 39080", "models: m",
        "load balancing: on, strategy priority, 1 of 2 nodes online, 3 remote models"]
    assert lines[6].startswith("   2 gpu-box (node-3f9a1c0b5e2d7a41) online")
    assert lines[-1] == "warning: note"


def test_show_names_the_identity_and_node_port() -> None:
    """SPEC §16: ``sluice status`` shows the certificate's pin (and the node port)."""
    pin = "sha256:" + "9f" * 32
    base = {"socketPath": "/run/sluice.sock", "routerPort": 39080, "models": ["m"],
            "backends": [], "managedModels": []}
    lines = show({**base, "identity": pin, "nodePort": 39443}).splitlines()
    assert lines[1] == f"identity: {pin} (node port 39443, TLS 1.3)"
    assert show({**base, "identity": pin, "nodePort": None}).splitlines()[1] == \
        f"identity: {pin} (no node port)"
    assert not any(line.startswith("identity") for line in show(base).splitlines())


# ------------------------------------------------------------------------- a real gateway


