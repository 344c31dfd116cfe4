"""``scripts/bench --aliased``: what a model alias costs (issue 23, SPEC §12).

The main gateway (target ``sluice``) is started with :data:`CONFIG`: one exact alias per
mock model (``alias-bench-tcp`` -> ``bench-tcp``, ``alias-bench-unix`` -> ``bench-unix``).
Target ``aliased`` is that same process asked for the alias instead of the model: its
requests take the alias path (the table lookup, the existence checks, the ``model`` splice,
a new Content-Length) and reach the mock as ``bench-<transport>``, so the answers (and S6's
digests) are the same. Target ``sluice`` asks for the model itself, which exists, so it is
never aliased: its requests pay the one lookup a configured table costs a request it does
not apply to. Both run in every round, interleaved (every other round in the other order,
ABBA, so neither gains from its place), so the figure is paired: for each
scenario and transport, the gateway CPU per request of ``aliased`` over ``sluice``, as the
median of the per-round ratios and as the ratio of the medians. Issue 23's target: within
+5% (S1's shape).

Before the rounds, :func:`check` asks the gateway once for each alias and reads the request
log: ``servedModel`` must be the target and ``model`` the alias.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

PREFIX = "alias-bench"  # the alias of bench-<transport> is alias-bench-<transport>
CONFIG = ("aliases:\n  alias-bench-tcp: bench-tcp\n  alias-bench-unix: bench-unix\n")
TARGET_RATIO = 1.05
TARGET_TEXT = "aliased CPU/req ≤ 1.05x unaliased (paired rounds)"

Call = Callable[..., tuple[int, dict[str, str], bytes]]


def check(call: Call, gateway: dict[str, Any], transports: list[str]) -> list[str]:
    """One request per alias through ``call`` (bench.run.http_call); the problems found."""
    problems = []
    for tr in transports:
        alias, model = f"{PREFIX}-{tr}", f"bench-{tr}"
        body = json.dumps({"model": alias, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4}).encode()
        status, _, answer = call({tr: gateway[tr]}, "POST", "/v1/chat/completions", body,
                                 timeout=10.0)
        if status != 200:
            problems.append(f"aliased {tr}: {status} {answer[:200]!r}")
            continue
        _, _, log = call({"unix": gateway["unix"]}, "GET",
                         f"/api/v1/requests?model={alias}&limit=1")
        entries = json.loads(log).get("requests") or [{}]
        got = (entries[0].get("model"), entries[0].get("servedModel"))
        if got != (alias, model):
            problems.append(f"aliased {tr}: the request log says {got}, not {(alias, model)}")
    return problems


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summary(runs: list[dict[str, Any]], scenarios: list[str], transports: list[str],
            per_request: Callable[[dict[str, Any]], float | None]) -> dict[str, Any]:
    """For each scenario and transport: the CPU per request (ms) of ``sluice`` and
    ``aliased`` (medians over rounds), the ratio of the medians, the per-round ratios and
    their median, and whether that median is within :data:`TARGET_RATIO`."""
    out: dict[str, Any] = {}
    for sc in scenarios:
        for tr in transports:
            rounds: dict[int, dict[str, float]] = {}
            for r in runs:
                if (r["scenario"], r["transport"]) == (sc, tr) and r["target"] in (
                        "sluice", "aliased"):
                    cpu = per_request(r)
                    if cpu is not None:
                        rounds.setdefault(r["round"], {})[r["target"]] = cpu
            paired = [v for v in rounds.values() if len(v) == 2]
            if not paired:
                continue
            plain = _median([v["sluice"] for v in paired])
            aliased = _median([v["aliased"] for v in paired])
            ratios = [round(v["aliased"] / v["sluice"], 4) for v in paired if v["sluice"]]
            median_ratio = _median(ratios)
            out[f"{sc}/{tr}"] = {
                "cpu_ms_per_req": {"sluice": plain, "aliased": aliased},
                "ratio_of_medians": round(aliased / plain, 4) if plain and aliased else None,
                "paired_ratios": ratios, "median_ratio": median_ratio,
                "met": median_ratio is not None and median_ratio <= TARGET_RATIO,
                "rounds": len(paired)}
    return out


def table(result: dict[str, Any], smoke: bool) -> str:
    head = ["Aliased", "Transport", "CPU/req unaliased", "CPU/req aliased",
            "ratio (median of paired)", "ratio of medians", "rounds", "Target", "Met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, e in result.items():
        sc, tr = key.split("/")
        cpu = e["cpu_ms_per_req"]
        met = "—" if smoke else ("met" if e["met"] else "not met")
        cells = [sc, tr, f"{cpu['sluice']} ms", f"{cpu['aliased']} ms", str(e["median_ratio"]),
                 str(e["ratio_of_medians"]), str(e["rounds"]), TARGET_TEXT, met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- in process: the alias path's own cost, without the noise of a whole gateway ------------

S1_BODY = json.dumps({"model": f"{PREFIX}-tcp", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short greeting for the benchmark."}],
    "max_tokens": 64}).encode()  # the body bench/load.js sends in S1


def in_process(number: int = 200_000) -> dict[str, float]:
    """Microseconds per call, best of 5: the check every request makes (``ctx.config.aliases``
    with no alias, and with one that does not apply), :func:`proxy.aliasing.apply` for S1's
    aliased body (lookup, existence checks, splice, the new RequestInfo), and the splice
    alone. Needs the gateway's packages (run from the tree: ``python -m bench.aliases``)."""
    import timeit
    from types import SimpleNamespace

    import trio

    from protocol.aliases import AliasTable
    from protocol.json_model import replace_model
    from protocol.request_info import parse_request_body
    from proxy import aliasing

    table = AliasTable([(f"{PREFIX}-tcp", "bench-tcp")])
    holders = {"bench-tcp": object()}
    nodes = SimpleNamespace(endpoints=[])
    config = SimpleNamespace(aliases=table, load_balancing=SimpleNamespace(enabled=False))
    ready = SimpleNamespace(is_set=lambda: True)
    backends = SimpleNamespace(holder_of=holders.get, ready=ready)
    ctx: Any = SimpleNamespace(config=config, backends=backends, ondemand=None, nodes=nodes)
    empty: Any = SimpleNamespace(config=SimpleNamespace(aliases=AliasTable()))
    info = parse_request_body("/v1/chat/completions", S1_BODY)
    plain = parse_request_body("/v1/chat/completions", S1_BODY.replace(b"alias-", b""))
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]

    def once(call: Callable[[], Any]) -> float:
        return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6

    def apply_sync(which: Any) -> Any:  # the coroutine never suspends: run it by hand
        coro = aliasing.apply(ctx, which, headers, S1_BODY)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        raise RuntimeError("aliasing.apply waited")

    assert apply_sync(info)[0].model == "bench-tcp"
    del trio  # (imported so that the figures include nothing of a first import)
    return {
        "check_no_aliases_us": round(once(lambda: bool(empty.config.aliases)), 4),
        "apply_not_aliased_us": round(once(lambda: apply_sync(plain)), 4),
        "apply_aliased_us": round(once(lambda: apply_sync(info)), 4),
        "splice_us": round(once(lambda: replace_model(S1_BODY, "bench-tcp", checked=True)), 4),
        "splice_walked_us": round(once(lambda: replace_model(S1_BODY, "bench-tcp")), 4),
        "body_bytes": len(S1_BODY),
    }


if __name__ == "__main__":
    print(json.dumps(in_process(), indent=1))
