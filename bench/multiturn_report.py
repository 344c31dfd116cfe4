"""S12's figures: per strategy (and the oracle) the TTFT of every turn after the first, p50
and p90 (pooled over rounds), their ratios to the oracle's, the share of prompt tokens the
servers reused, the gateway's affinity mix, who served what; the controls'; the issue's
targets judged; Markdown tables. Pure functions over the client's records."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

ORACLE = "oracle"
TARGET_TEXT = ("cache-aware p50 and p90 TTFT within 1.2x the oracle's at 4 users, at or "
               "below the oracle's at 8 users; negative control no worse than least-loaded "
               "by more than 5%; hotspot control keeps every server busy")
NEAR_ORACLE = 1.2  # at 4 users
NEGATIVE_SLACK = 1.05
BUSY_SHARE = 0.5  # hotspot: each server busy (a request in flight) at least half the time
REQUEST_SHARE = 0.25  # ... and given at least a quarter of the requests


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else round(x / y, 3)


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def measure(records: list[dict[str, Any]], later_only: bool = True) -> dict[str, Any]:
    """The figures of one strategy's turns (all rounds): TTFT p50/p90 of the turns after the
    first (all turns when ``later_only`` is False), reused share of their prompt tokens, the
    affinity mix, requests per server; and the counts the smoke test checks."""
    measured = [r for r in records if r["turn"] > 1 or not later_only]
    ok = [r for r in measured if r["status"] == 200 and r["done"] and r["ttft_s"] is not None]
    ttft = [r["ttft_s"] for r in ok]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    return {
        "turns": len(records), "measured": len(measured), "answered": len(ok),
        "failed": [{k: r.get(k) for k in ("user", "turn", "status", "error")}
                   for r in records if not (r["status"] == 200 and r["done"]
                                            and r["ttft_s"] is not None)],
        "ttft_p50_s": _r(percentile(ttft, 0.5)), "ttft_p90_s": _r(percentile(ttft, 0.9)),
        "ttft_mean_s": _r(sum(ttft) / len(ttft)) if ttft else None,
        "prompt_tokens": prompt, "cached_tokens": cached,
        "reused_share": _r(cached / prompt) if prompt else None,
        "affinity": dict(Counter(str(r["affinity"]) for r in measured)),
        "served_by": dict(Counter(str(r["served_by"]) for r in records)),
    }


def strategy_table(users: int, turns: int, figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``figures`` (strategy -> :func:`measure`) with each one's ratios to the oracle."""
    oracle = figures.get(ORACLE) or {}
    out: dict[str, Any] = {"users": users, "turns": turns, "by_strategy": {}}
    for name, f in figures.items():
        out["by_strategy"][name] = {
            **f, "p50_vs_oracle": _ratio(f["ttft_p50_s"], oracle.get("ttft_p50_s")),
            "p90_vs_oracle": _ratio(f["ttft_p90_s"], oracle.get("ttft_p90_s"))}
    return out


def busy(records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Per server: requests, their share, and its busy share of the wall time (the union of
    its requests' intervals, start to end, at the client)."""
    out: dict[str, Any] = {}
    total = len(records) or 1
    for server in sorted({str(r["served_by"]) for r in records}):
        spans = sorted((r["start"], r["end"]) for r in records if r["served_by"] == server)
        covered, until = 0.0, -math.inf
        for start, end in spans:
            if end > until:
                covered += end - max(start, until)
                until = end
        n = len(spans)
        out[server] = {"requests": n, "request_share": round(n / total, 3),
                       "busy_share": round(covered / wall_s, 3) if wall_s > 0 else None}
    return out


def judge(tables: list[dict[str, Any]], controls: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's targets, each met (True), missed (False) or not measured (None)."""
    met: dict[str, Any] = {}
    for t in tables:
        ca = t["by_strategy"].get("cache-aware")
        if ca is None or ORACLE not in t["by_strategy"]:
            continue
        limit = NEAR_ORACLE if t["users"] <= 4 else 1.0
        ratios = (ca["p50_vs_oracle"], ca["p90_vs_oracle"])
        met[f"{t['users']} users"] = (None if None in ratios
                                      else all(r <= limit for r in ratios))
    if controls and controls.get("negative"):
        neg = controls["negative"]["by_strategy"]
        if "cache-aware" in neg and "least-loaded" in neg:
            pairs = [(neg["cache-aware"][k], neg["least-loaded"][k])
                     for k in ("ttft_p50_s", "ttft_p90_s")]
            met["negative"] = (None if any(a is None or b is None for a, b in pairs)
                               else all(a <= b * NEGATIVE_SLACK for a, b in pairs))
    if controls and controls.get("hotspot"):
        servers = controls["hotspot"]["servers"]
        met["hotspot"] = len(servers) >= 2 and all(
            (s["busy_share"] or 0) >= BUSY_SHARE and s["request_share"] >= REQUEST_SHARE
            for s in servers.values())
    return met


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f} s"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:.0f}%"


def _mix(affinity: dict[str, int]) -> str:
    order = ("hit", "session", "spill", "miss", "None")
    parts = [f"{k if k != 'None' else 'none'} {affinity[k]}" for k in order if affinity.get(k)]
    return ", ".join(parts) or "—"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(tables: list[dict[str, Any]], controls: dict[str, Any] | None,
             met: dict[str, Any], rounds: int) -> str:
    lines = [_row(["users x turns", "strategy", "TTFT p50", "TTFT p90", "p50 / oracle",
                   "p90 / oracle", "reused", "affinity (turns 2+)", "turns answered"]),
             _row(["---"] * 9)]
    for t in tables:
        for name, f in t["by_strategy"].items():
            lines.append(_row([f"{t['users']} x {t['turns']}", name, _s(f["ttft_p50_s"]),
                               _s(f["ttft_p90_s"]), _x(f["p50_vs_oracle"]),
                               _x(f["p90_vs_oracle"]), _pct(f["reused_share"]),
                               "oracle: by hand" if name == ORACLE else _mix(f["affinity"]),
                               f"{f['answered']}/{f['measured']}"]))
    out = [f"S12, {rounds} round(s): TTFT of every turn after the first, at the client",
           "", *lines]
    if controls:
        neg, hot = controls.get("negative"), controls.get("hotspot")
        if neg:
            out += ["", f"Negative control ({neg['users']} clients x {neg['requests']} fresh "
                    "conversations, no shared prefix; every request):", "",
                    _row(["strategy", "TTFT p50", "TTFT p90", "reused", "affinity"]),
                    _row(["---"] * 5)]
            out += [_row([name, _s(f["ttft_p50_s"]), _s(f["ttft_p90_s"]),
                          _pct(f["reused_share"]), _mix(f["affinity"])])
                    for name, f in neg["by_strategy"].items()]
        if hot:
            out += ["", f"Hotspot control ({hot['strategy']}: one conversation sends "
                    f"{hot['fan_out']} requests at once every turn, {hot['others']} other(s) "
                    f"one; hot share {_pct(hot['hot_share'])} of {hot['requests']} requests, "
                    f"{hot['wall_s']:.1f} s):", "",
                    _row(["server", "requests", "share", "busy share of the time"]),
                    _row(["---"] * 4)]
            out += [_row([name, str(s["requests"]), _pct(s["request_share"]),
                          _pct(s["busy_share"])]) for name, s in hot["servers"].items()]
    verdict = {True: "met", False: "MISSED", None: "not measured"}
    out += ["", f"Targets ({TARGET_TEXT}): " +
            "; ".join(f"{k}: {verdict[v]}" for k, v in met.items())]
    return "\n".join(out)
