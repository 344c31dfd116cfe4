"""The figures the reliability suites measure, written to ``figures.json`` at the end of a
pytest run (``scripts/figures`` prints them as a table; the README quotes them).

Tests record through the ``figures`` fixture (tests/conftest.py), never a module global:

- ``figures.count("bad_inputs_tried", 37)`` — a counter, summed over the run;
- ``figures.sample("abort_to_upstream_close_ms", 3.2)`` — a sample; the file keeps n,
  p50, p99 and max;
- ``figures.peak("attempts_per_request_max", 2)`` — the largest value seen;
- ``figures.note("lan_slow_link", {"runs": 3, "delivered": 3, "byte_exact": 3})`` — a
  value as it is (the last one wins).

Under pytest-xdist each worker records its own and the controller merges them before
writing (tests/workers.py). A run merges into the file that is there (by name), so the
default run and ``scripts/soak`` each keep their figures; ``figures.json`` records when
each figure was last measured.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES_FILE = Path(os.environ.get("SLUICE_FIGURES", ROOT / "figures.json"))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)) - 1, 0)
    return ordered[min(rank, len(ordered) - 1)]


class Figures:
    """What one pytest run measured (see the module docstring)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.samples: dict[str, list[float]] = {}
        self.peaks: dict[str, float] = {}
        self.notes: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (f"Figures(counters={len(self.counters)}, samples={len(self.samples)}, "
                f"peaks={len(self.peaks)}, notes={len(self.notes)})")

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def sample(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(float(value))

    def peak(self, name: str, value: float) -> None:
        self.peaks[name] = max(self.peaks.get(name, value), value)

    def note(self, name: str, value: Any) -> None:
        self.notes[name] = value

    def __bool__(self) -> bool:
        return bool(self.counters or self.samples or self.peaks or self.notes)

    def raw(self) -> dict[str, Any]:
        """Everything recorded, samples whole (for :meth:`merge` in another process)."""
        return {"counters": self.counters, "samples": self.samples, "peaks": self.peaks,
                "notes": self.notes}

    def merge(self, raw: dict[str, Any]) -> None:
        """Take in another process's :meth:`raw` figures (a pytest-xdist worker's): its
        counters added, its samples pooled, its peaks compared, its notes kept."""
        for name, n in raw.get("counters", {}).items():
            self.count(name, n)
        for name, values in raw.get("samples", {}).items():
            self.samples.setdefault(name, []).extend(float(v) for v in values)
        for name, value in raw.get("peaks", {}).items():
            self.peak(name, value)
        self.notes.update(raw.get("notes", {}))

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every figure as ``{name: {"kind": ..., "value": ...}}``."""
        out: dict[str, dict[str, Any]] = {}
        for name, n in self.counters.items():
            out[name] = {"kind": "count", "value": n}
        for name, values in self.samples.items():
            out[name] = {"kind": "sample", "value": {
                "n": len(values), "p50": round(percentile(values, 0.5), 3),
                "p99": round(percentile(values, 0.99), 3), "max": round(max(values), 3)}}
        for name, value in self.peaks.items():
            out[name] = {"kind": "peak", "value": value}
        for name, value in self.notes.items():
            out[name] = {"kind": "note", "value": value}
        return out

    def write(self, path: Path = FIGURES_FILE) -> None:
        """Merge this run's figures into ``path`` (atomically)."""
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("figures"), dict):
                doc = {"figures": {}}
        except (OSError, ValueError):
            doc = {"figures": {}}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name, entry in self.entries().items():
            doc["figures"][name] = {**entry, "measured": stamp}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
