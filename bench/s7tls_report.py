"""S7TLS's figures (bench/s7tls.py measures): per load and transport, medians over rounds of
each link and pinned/plain ratios and differences paired per round; the checks that make a
run count (delivered whole, bodies alike, every answer served by B, the pinned link really
on B's node listener); and the Markdown tables."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

LINKS = ("plain", "pinned")
MAX_RATIO = 1.3
TARGET_TEXT = "pinned/plain A+B CPU per request on a reused connection ≤ 1.3x"
KEYS = ("cpu_us", "a_cpu_us", "b_cpu_us", "cpu_us_per_chunk", "lat_p50", "lat_p99",
        "ttfb_p50", "ttfb_p99", "b_accepted", "wall_s",
        "node_port_bytes", "api_port_bytes")
MIN_BYTES = 100  # a request's body alone is larger: what B's port must receive per request


def median(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 4) if vals else None


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: CPU µs per request (A+B, A, B) and per chunk, times in ms."""
    load = run["load"]
    per = max(load["completed"], 1)
    chunks = run["params"].get("chunks") if load["stream"] else None
    cpu = (run["a_cpu_s"] + run["b_cpu_s"]) * 1e6 / per
    lat, ttfb = load.get("latency_ms") or {}, load.get("ttfb_ms") or {}
    return {"cpu_us": cpu, "a_cpu_us": run["a_cpu_s"] * 1e6 / per,
            "b_cpu_us": run["b_cpu_s"] * 1e6 / per,
            "cpu_us_per_chunk": cpu / chunks if chunks else None,
            "lat_p50": lat.get("p50"), "lat_p99": lat.get("p99"),
            "ttfb_p50": ttfb.get("p50"), "ttfb_p99": ttfb.get("p99"),
            "b_accepted": run["b_accepted"], "wall_s": run["wall_s"],
            "node_port_bytes": run["b_bytes_in"]["node_port"] / per,
            "api_port_bytes": run["b_bytes_in"]["api_port"] / per}


def went_through(run: dict[str, Any]) -> bool:
    """B received this run's requests on the port of its link: the node port (TLS) for
    ``pinned``, the API port for ``plain``."""
    port = "node_port" if run["link"] == "pinned" else "api_port"
    return bool(run["b_bytes_in"][port] >= MIN_BYTES * run["load"]["completed"])


def _ratio(x: Any, y: Any) -> float | None:
    return x / y if x is not None and y else None


def _diff(x: Any, y: Any) -> float | None:
    return x - y if x is not None and y is not None else None


def summary(runs: list[dict[str, Any]], shapes: list[str], transports: list[str],
            fingerprint: str) -> dict[str, Any]:
    """``{"by_load": {"S1/tcp": entry, ...}, "target_met": bool, "problems": []}``."""
    by_load: dict[str, Any] = {}
    for shape in shapes:
        for tr in transports:
            mine = [r for r in runs if r["shape"] == shape and r["transport"] == tr]
            if not mine:
                continue
            figs = {link: {r["round"]: figures(r) for r in mine if r["link"] == link}
                    for link in LINKS}
            both = sorted(set(figs["plain"]) & set(figs["pinned"]))

            def paired(key: str, op: Callable[[Any, Any], float | None],
                       figs: dict[str, dict[int, Any]] = figs, both: list[int] = both
                       ) -> Any:
                return median([op(figs["pinned"][n][key], figs["plain"][n][key])
                               for n in both])

            digests = {d for r in mine for d in r["load"]["digests"]}
            entry: dict[str, Any] = {
                "median": {link: {k: median([f[k] for f in rounds.values()]) for k in KEYS}
                           for link, rounds in figs.items()},
                "cpu_ratio": paired("cpu_us", _ratio),
                "cpu_ratio_a": paired("a_cpu_us", _ratio),
                "cpu_ratio_b": paired("b_cpu_us", _ratio),
                "cpu_added_us": paired("cpu_us", _diff),
                "added_ms": {k: paired(k, _diff)
                             for k in ("lat_p50", "ttfb_p50", "lat_p99", "ttfb_p99")},
                "complete": all(r["load"]["completed"] == r["load"]["started"] > 0 and
                                not r["load"]["missing_streams"] for r in mine),
                "bodies_equal": len(digests) == 1 and
                all(len(r["load"]["digests"]) == 1 for r in mine),
                "served_by_b": all(r["load"]["served_by"] ==
                                   {f"node:{fingerprint}": r["load"]["completed"]}
                                   for r in mine),
                "through_link_port": all(went_through(r) for r in mine),
                "rounds": len(both),
            }
            entry["met"] = entry["cpu_ratio"] is not None and entry["cpu_ratio"] <= MAX_RATIO
            by_load[f"{shape}/{tr}"] = entry
    on_reused = [e["met"] for key, e in by_load.items() if key.startswith("S1/")]
    return {"by_load": by_load, "target": TARGET_TEXT, "max_ratio": MAX_RATIO,
            "target_met": bool(on_reused) and all(on_reused), "problems": []}


def problems(result: dict[str, Any]) -> list[str]:
    """What makes a run not count."""
    out = []
    for key, e in result["by_load"].items():
        for check in ("complete", "bodies_equal", "served_by_b", "through_link_port"):
            if not e[check]:
                out.append(f"S7TLS {key}: not {check}")
    for link, nodes in result["nodes_a"].items():
        if [(n["fingerprint"], n["link"]) for n in nodes] != [(result["node_b"], link)]:
            out.append(f"S7TLS: A ({link}) lists its nodes as {nodes}")
    return out


def _f(v: Any, digits: int = 3, sign: str = "") -> str:
    if v is None:
        return "—"
    return f"{v:{sign}.{digits}g}" if abs(v) < 1000 else f"{v:{sign},.0f}"


def tables(result: dict[str, Any], smoke: bool) -> str:
    head = ["Load", "Transport", "A+B CPU/request plain → pinned", "pinned/plain A+B",
            "A", "B", "CPU/chunk plain → pinned", "added latency p50", "added TTFB p50",
            "new TCP conns in B's netns/run plain, pinned",
            "bytes/request into B's API, node port: plain; pinned", "Delivered, bodies, by B",
            "Issue target", "Met"]
    rows = []
    for key, e in result["by_load"].items():
        shape, tr = key.split("/")
        med, add = e["median"], e["added_ms"]
        plain, pinned = med["plain"], med["pinned"]
        chunk = "—" if plain["cpu_us_per_chunk"] is None else \
            f"{_f(plain['cpu_us_per_chunk'])} → {_f(pinned['cpu_us_per_chunk'])} µs"
        ok = e["complete"] and e["bodies_equal"] and e["served_by_b"]
        rows.append([
            shape, tr, f"{_f(plain['cpu_us'])} → {_f(pinned['cpu_us'])} µs",
            f"x{_f(e['cpu_ratio'])}", f"x{_f(e['cpu_ratio_a'])}", f"x{_f(e['cpu_ratio_b'])}",
            chunk, f"{_f(add['lat_p50'], 2, '+')} ms",
            f"{_f(add['ttfb_p50'], 2, '+')} ms",
            f"{_f(plain['b_accepted'])}, {_f(pinned['b_accepted'])}",
            f"{_f(plain['api_port_bytes'])}, {_f(plain['node_port_bytes'])}; "
            f"{_f(pinned['api_port_bytes'])}, {_f(pinned['node_port_bytes'])}",
            "all, alike, yes" if ok else "NO", TARGET_TEXT if shape == "S1" else "",
            "—" if smoke else ("met" if e["met"] else "not met")])
    hs = result["handshake"]
    cpu, wall = hs["cpu_us"], hs["wall_us"]
    hs_rows = [
        ["fresh connection, CPU µs/request", _f(cpu["plain fresh"]), _f(cpu["pinned fresh"]),
         f"{_f(hs['handshake_cpu_us'], 4, '+')} µs"],
        ["fresh connection, wall ms/request", _f(wall["plain fresh"] / 1000),
         _f(wall["pinned fresh"] / 1000), f"{_f(hs['handshake_wall_ms'], 3, '+')} ms"],
        ["reused connection, CPU µs/request", _f(cpu["plain"]), _f(cpu["pinned"]),
         f"x{_f(hs['reused_cpu_ratio'])}"],
    ]
    return (_markdown(head, rows) + "\n\n" +
            _markdown([f"bench/tls_link.py (one process: both ends and a fake model server; "
                       f"median of {hs['rounds']})", "plain", "pinned", "pinned - plain"],
                      hs_rows))


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
