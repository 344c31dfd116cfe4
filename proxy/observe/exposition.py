"""The Prometheus text exposition format, version 0.0.4, written directly.

Label sets are escaped once, when a series is first seen (:func:`label_set`), so that a
scrape is string joins only: about 0.5 µs a line, where building prometheus_client's
``Metric`` objects and rendering them with ``generate_latest`` takes 12 µs a line or more
(``bench/metrics_cost.py``; a histogram is 20 lines a series). The output is read back by
prometheus_client's own parser in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Exposition", "bucket_labels", "label_set"]


def _escape(value: str) -> str:
    """A label value as the format quotes it: backslash, double quote and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def label_set(*pairs: tuple[str, str]) -> str:
    """``name="value",...`` (without braces), in the order given."""
    return ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)


def bucket_labels(bounds: Sequence[float]) -> tuple[str, ...]:
    """The ``le`` label of each bucket of a histogram, +Inf last, each ending in a comma
    (the series' own labels follow)."""
    return (*(f'le="{bound!r}",' for bound in bounds), 'le="+Inf",')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Exposition:
    """One scrape's text, built family by family."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def __repr__(self) -> str:
        return f"Exposition({len(self._parts)} parts)"

    def family(self, name: str, kind: str, help_text: str) -> None:
        """The ``# HELP`` and ``# TYPE`` lines that open a family (``help_text`` is ours:
        one line, no backslash)."""
        self._parts.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")

    def sample(self, name: str, labels: str, value: float) -> None:
        """One line; ``labels`` from :func:`label_set` (empty for none)."""
        if labels:
            self._parts.append(f"{name}{{{labels}}} {_number(value)}\n")
        else:
            self._parts.append(f"{name} {_number(value)}\n")

    def histogram(self, name: str, labels: str, les: tuple[str, ...], counts: Sequence[int],
                  total: float) -> None:
        """One histogram series: cumulative ``_bucket`` lines from per-bucket ``counts``
        (``les`` from :func:`bucket_labels`), then ``_count`` and ``_sum``."""
        add = self._parts.append
        running = 0
        for le, count in zip(les, counts, strict=True):
            running += count
            add(f"{name}_bucket{{{le}{labels}}} {running}\n")
        add(f"{name}_count{{{labels}}} {running}\n{name}_sum{{{labels}}} {_number(total)}\n")

    def raw(self, text: bytes) -> None:
        """Lines already in the format (prometheus_client's process figures)."""
        self._parts.append(text.decode("utf-8"))

    def text(self) -> bytes:
        return "".join(self._parts).encode("utf-8")
