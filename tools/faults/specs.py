"""Naming a fault: ``name[;param=value...]`` in an ``x-fault`` header or a ``fault:<name>``
model (``fault:reset-after-3`` sets the behaviour's main parameter), the model ids the kit
lists, and ``--list``."""

from __future__ import annotations

import re

from tools.faults.behaviours import ROWS, TABLE, FaultSpec

_NUMBERED = re.compile(r"(.+)-([0-9]+(?:\.[0-9]+)?)")


def parse_spec(text: str) -> FaultSpec:
    """``name[;param=value...]``; ValueError names what is wrong."""
    name, *pairs = (part.strip() for part in text.split(";"))
    params: dict[str, float] = {}
    if name not in TABLE and (m := _NUMBERED.fullmatch(name)) and m[1] in TABLE:
        main = TABLE[m[1]].main
        if main is None:
            raise ValueError(f"fault {m[1]!r} takes no number")
        name, params[main] = m[1], float(m[2])
    if name not in TABLE:
        raise ValueError(f"unknown fault {name!r} (python -m tools.faults --list)")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in TABLE[name].defaults:
            raise ValueError(f"fault {name!r} has no parameter {key!r}")
        try:
            params[key] = float(value)
        except ValueError:
            raise ValueError(f"fault {name!r}: {key} must be a number") from None
    return FaultSpec(name, params)


def spec_from_model(model: str) -> FaultSpec | None:
    """The fault a ``fault:<spec>`` model names, or None for any other model."""
    if not model.startswith("fault:"):
        return None
    return parse_spec(model[len("fault:"):])


# The numbered model ids /v1/models lists besides ``fault:<name>``, so that a gateway's model
# index routes them (any other number works by header, or by model on a direct request).
_EXAMPLES: dict[str, tuple[int, ...]] = {
    "stall-head": (1, 5, 30), "silent-after-head": (1, 5, 30), "stall-after": (1, 2, 3),
    "reset-after": (1, 2, 3), "close-after": (1, 2, 3), "status": (500, 502, 503),
    "rate-limit": (1, 5, 30), "bad-chunk-size": (1, 2), "chunk-overrun": (1, 2),
    "refuse": (1, 2, 3),
}


def fault_models() -> list[str]:
    """``fault:<name>`` for every behaviour, and the numbered examples."""
    out = []
    for b in ROWS:
        out.append(f"fault:{b.name}")
        out += [f"fault:{b.name}-{n}" for n in _EXAMPLES.get(b.name, ())]
    return out


def listing() -> str:
    """One line per behaviour (``--list``)."""
    width = max(len(b.name) for b in ROWS)
    return "\n".join(f"{b.name:<{width}}  {b.doc}" for b in ROWS)
