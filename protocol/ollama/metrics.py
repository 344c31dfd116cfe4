"""The figures of Ollama's last line: ``done_reason``, token counts and durations (ns).

Counts come from the OpenAI ``usage`` (``prompt_tokens``, ``completion_tokens``), else from
llama.cpp's ``timings`` (``prompt_n``, ``predicted_n``), else the prompt is 0 and the
answer the number of pieces it came in (one per token from llama.cpp).

Durations: ``total_duration`` and ``load_duration`` are the endpoint's clock (a
:class:`Timing`; this layer reads no clock). ``prompt_eval_duration`` and
``eval_duration`` are llama.cpp's own ``timings`` (``prompt_ms``, ``predicted_ms``) when
the answer has them, else estimates from the clock: the prompt took until the model
server's first event with data (not a keep-alive comment), the answer the rest.

``done_reason``: OpenAI's ``finish_reason`` as Ollama names it: ``stop`` and ``length`` as
they are; ``tool_calls`` (and the old ``function_call``) is ``stop``, as Ollama ends an
answer that called tools; another reason is passed on as it came; none is ``stop``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Timing", "Usage", "done_reason"]

_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "function_call": "stop"}


def done_reason(finish_reason: object) -> str:
    """Ollama's ``done_reason`` for an OpenAI ``finish_reason`` (see the module)."""
    if not isinstance(finish_reason, str) or not finish_reason:
        return "stop"
    return _REASONS.get(finish_reason, finish_reason)


@dataclass(frozen=True, slots=True)
class Timing:
    """What the endpoint's clock says about one request, in nanoseconds."""

    total_ns: int  # from the request's arrival to the answer's end
    load_ns: int = 0  # of that, waiting for the model to load (0: it was loaded)
    prompt_ns: int | None = None  # after the load, to the model server's first data event


class Usage:
    """The counts and llama.cpp timings seen in an answer (whole, or chunk by chunk: a
    later value replaces an earlier one)."""

    __slots__ = ("completion_tokens", "predicted_ms", "predicted_n", "prompt_ms", "prompt_n",
                 "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.prompt_n: int | None = None
        self.predicted_n: int | None = None
        self.prompt_ms: float | None = None
        self.predicted_ms: float | None = None

    def __repr__(self) -> str:
        return f"Usage(prompt={self.prompt_tokens}, completion={self.completion_tokens})"

    def see(self, doc: dict[str, Any]) -> None:
        """Read ``usage`` and ``timings`` of one chunk or answer, when it has them."""
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _count(usage.get("prompt_tokens"), self.prompt_tokens)
            self.completion_tokens = _count(usage.get("completion_tokens"),
                                            self.completion_tokens)
        timings = doc.get("timings")
        if isinstance(timings, dict):
            self.prompt_n = _count(timings.get("prompt_n"), self.prompt_n)
            self.predicted_n = _count(timings.get("predicted_n"), self.predicted_n)
            self.prompt_ms = _millis(timings.get("prompt_ms"), self.prompt_ms)
            self.predicted_ms = _millis(timings.get("predicted_ms"), self.predicted_ms)

    def fields(self, timing: Timing, pieces: int = 0) -> dict[str, int]:
        """The counts and durations of Ollama's last line (``pieces``: how many pieces of
        text the answer came in, the last resort for ``eval_count``)."""
        prompt_count = _first(self.prompt_tokens, self.prompt_n, 0)
        eval_count = _first(self.completion_tokens, self.predicted_n, pieces)
        total = max(0, timing.total_ns)
        load = min(max(0, timing.load_ns), total)
        if self.prompt_ms is not None:
            prompt = round(self.prompt_ms * 1e6)
        else:
            prompt = min(max(0, timing.prompt_ns or 0), total - load)
        if self.predicted_ms is not None:
            generating = round(self.predicted_ms * 1e6)
        else:
            generating = max(0, total - load - prompt)
        return {
            "total_duration": total,
            "load_duration": load,
            "prompt_eval_count": prompt_count,
            "prompt_eval_duration": prompt,
            "eval_count": eval_count,
            "eval_duration": generating,
        }


def _first(*values: int | None) -> int:
    for value in values:
        if value is not None:
            return value
    return 0  # pragma: no cover - the last value is always an int


def _count(value: object, old: int | None) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return old


_MAX_MS = 1e12  # ~31 years: more is not a duration a server measured


def _millis(value: object, old: float | None) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value) and 0 <= value <= _MAX_MS:
        return float(value)
    return old
