"""``scripts/bench --keyed``: what an access key's limits cost (issue 24, SPEC §13).

Two access keys are made on the main gateway (target ``sluice``) with ``sluice keys
create``: one without limits and one with a ``models`` pattern that matches every bench
model (``bench*``) and an rpm far above any load here (:data:`LIMITED`). Target ``keyed``
is that same process sent the unlimited key (``Authorization: Bearer``), target
``limited`` sent the limited one: both pay the key's look-up (the sluice prefix, the hash
compared with every stored one) and its grant; ``limited`` adds the model check and one
take from the key's token bucket per request. A key is honoured on every listener, so the
loopback TCP listener and the Unix socket both check it.

Both run in every round, interleaved (every other round in the other order, ABBA), so the
figure is paired: for each scenario and transport, the gateway CPU per request of
``limited`` over ``keyed``, as the median of the per-round ratios and as the ratio of the
medians, beside the latency p50 of each over direct's. Issue 24's target: within +3%.

Before the rounds, :func:`check` makes sure the limits are in force: the limited key is
refused a model outside its pattern (403 ``model_not_allowed``), and both keys are served.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

LIMITED = ("--models", "bench*", "--rpm", "1000000")
TARGET_RATIO = 1.03
TARGET_TEXT = "limited-key CPU/req ≤ 1.03x unlimited key (paired rounds)"

Call = Callable[..., tuple[int, dict[str, str], bytes]]


def headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def check(call: Call, gateway: dict[str, Any], keys: dict[str, str],
          transports: list[str]) -> list[str]:
    """The limited key refused another model and both keys served (``call`` is
    bench.run.http_call); the problems found."""
    problems = []
    for tr in transports:
        for target, key in keys.items():
            for model, want in ((f"bench-{tr}", 200), ("not-a-bench-model", 403)):
                if target != "limited" and want == 403:
                    continue
                body = json.dumps({"model": model, "messages": [
                    {"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
                status, _, answer = call({tr: gateway[tr]}, "POST", "/v1/chat/completions",
                                         body, timeout=10.0, headers=headers(key))
                if status != want:
                    problems.append(f"{target} {tr} {model}: {status}, not {want}: "
                                    f"{answer[:200]!r}")
    return problems


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summary(runs: list[dict[str, Any]], scenarios: list[str], transports: list[str],
            per_request: Callable[[dict[str, Any]], float | None],
            latency: Callable[[dict[str, Any]], float | None]) -> dict[str, Any]:
    """For each scenario and transport: the CPU per request (ms) of ``sluice`` (no key),
    ``keyed`` and ``limited`` (medians over rounds), the paired ratio limited/keyed (median
    of the per-round ratios, and of the medians), the latency p50 medians, and whether the
    median ratio is within :data:`TARGET_RATIO`."""
    out: dict[str, Any] = {}
    names = ("sluice", "keyed", "limited", "direct")
    for sc in scenarios:
        for tr in transports:
            rounds: dict[int, dict[str, tuple[float, float | None]]] = {}
            for r in runs:
                if (r["scenario"], r["transport"]) == (sc, tr) and r["target"] in names:
                    cpu = per_request(r) if r["target"] != "direct" else 0.0
                    if cpu is not None:
                        rounds.setdefault(r["round"], {})[r["target"]] = (cpu, latency(r))
            paired = [v for v in rounds.values() if "keyed" in v and "limited" in v]
            if not paired:
                continue
            cpu = {n: _median([v[n][0] for v in paired if n in v]) for n in names[:3]}
            lat = {n: _median([v[n][1] for v in paired if n in v and v[n][1] is not None])
                   for n in names}
            ratios = [round(v["limited"][0] / v["keyed"][0], 4) for v in paired
                      if v["keyed"][0]]
            median_ratio = _median(ratios)
            out[f"{sc}/{tr}"] = {
                "cpu_ms_per_req": cpu, "lat_p50_ms": lat,
                "ratio_of_medians": (round(cpu["limited"] / cpu["keyed"], 4)
                                     if cpu["keyed"] and cpu["limited"] else None),
                "paired_ratios": ratios, "median_ratio": median_ratio,
                "met": median_ratio is not None and median_ratio <= TARGET_RATIO,
                "rounds": len(paired)}
    return out


def table(result: dict[str, Any], smoke: bool) -> str:
    head = ["Keyed", "Transport", "CPU/req no key", "CPU/req unlimited key",
            "CPU/req limited key", "ratio (median of paired)", "ratio of medians",
            "p50 direct / unlimited / limited", "rounds", "Target", "Met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, e in result.items():
        sc, tr = key.split("/")
        cpu, lat = e["cpu_ms_per_req"], e["lat_p50_ms"]
        met = "—" if smoke else ("met" if e["met"] else "not met")
        cells = [sc, tr, f"{cpu['sluice']} ms", f"{cpu['keyed']} ms", f"{cpu['limited']} ms",
                 str(e["median_ratio"]), str(e["ratio_of_medians"]),
                 f"{lat['direct']} / {lat['keyed']} / {lat['limited']} ms", str(e["rounds"]),
                 TARGET_TEXT, met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- in process: the checks' own cost, without the noise of a whole gateway ------------------


def in_process(number: int = 100_000) -> dict[str, float]:
    """Microseconds per call, best of 5, on a context with 3 stored keys: what a keyless
    request pays (the ``is None`` test of ``Exchange.to_model``),
    :func:`proxy.access.auth.authorize` for a keyless loopback request, for one carrying a
    dummy token and for one carrying an unlimited and a limited key (look-up, hash, grant),
    and :meth:`KeyGrants.admit` for the limited key (model pattern, token bucket).
    Run from the tree: ``python -m bench.keys``."""
    import timeit
    from types import SimpleNamespace

    import trio

    from protocol.access import hash_key, new_access_key
    from proxy.access import auth
    from proxy.access.key_grants import KeyGrants
    from proxy.access.key_store import AccessKey, KeyStore
    from proxy.api.routes import access_level
    from proxy.link.listener import TCP, Peer

    made = [new_access_key() for _ in range(3)]
    entries = [{"id": key_id, "name": "", "hash": hash_key(key), "created_at": "x",
                "last_used_at": None} for key_id, key in made]
    entries[1].update(models=["bench*"], rpm=1_000_000)
    grants = KeyGrants()
    async def unsaved(keys: tuple[AccessKey, ...]) -> None:  # the store never writes here
        pass

    keys = KeyStore(entries, writer=trio.Lock(), save=unsaved)
    settings = SimpleNamespace(secrets=SimpleNamespace(admin_token="t"), keys=keys)
    ctx: Any = SimpleNamespace(settings=settings, key_grants=grants,
                               config=SimpleNamespace(api=SimpleNamespace(require_auth=False)))
    base = [(b"host", b"localhost"), (b"content-type", b"application/json")]

    def with_token(token: str) -> list[tuple[bytes, bytes]]:
        return [*base, (b"authorization", f"Bearer {token}".encode())]

    def authorize(headers: list[tuple[bytes, bytes]]) -> Any:
        level = access_level(b"POST", "/v1/chat/completions")  # as the exchange asks
        return auth.authorize(ctx, Peer(TCP), level, headers)

    def once(call: Callable[[], Any]) -> float:
        return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6

    unlimited, limited = with_token(made[0][1]), with_token(made[1][1])
    grant = authorize(limited)
    assert grant is not None
    assert grant.limits.rpm == 1_000_000
    figures: dict[str, float] = {}

    async def measure() -> None:  # the bucket reads the trio clock
        figures["admit_limited_us"] = once(lambda: grants.admit(grant, "bench-tcp",
                                                                "bench-tcp"))

    trio.run(measure)
    nothing = None
    return {
        "keyless_check_us": round(once(lambda: nothing is not None), 4),
        "authorize_keyless_us": round(once(lambda: authorize(base)), 4),
        "authorize_dummy_token_us": round(once(lambda: authorize(with_token("unused"))), 4),
        "authorize_unlimited_key_us": round(once(lambda: authorize(unlimited)), 4),
        "authorize_limited_key_us": round(once(lambda: authorize(limited)), 4),
        "admit_limited_us": round(figures["admit_limited_us"], 4),
    }


if __name__ == "__main__":
    print(json.dumps(in_process(), indent=1))
