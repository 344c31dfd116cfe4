"""``sluice ps``, ``sluice load NAME`` and ``sluice unload NAME`` (SPEC §11 "CLI"): the
managed models on demand, through the running gateway's ``/api/v1/models/local``."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from protocol.model_room import format_bytes
from proxy.cli.admin import CliError, call
from proxy.cli.render import MISSING, clean

__all__ = ["load_main", "ps_main", "show_models", "until"]

PATH = "/api/v1/models/local"
LOAD_WAIT = 660.0  # seconds a load may take: timeouts.model_load is at most 10 minutes
UNLOAD_WAIT = 30.0  # the gateway answers within 15 s (SIGKILL after 10)
_HEADERS = ("NAME", "STATE", "SIZE", "CONTEXT", "WAITING", "UNTIL")


def _when(text: object) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _span(seconds: float) -> str:
    """``45 seconds``, ``4 minutes``, ``2 hours`` (rounded down, as people say it)."""
    seconds = max(int(seconds), 0)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def until(model: Mapping[str, Any], now: datetime.datetime) -> str:
    """The UNTIL column: when a loaded model is unloaded if nothing uses it."""
    if model.get("state") != "loaded":
        return MISSING
    if model.get("activeRequests"):
        return "in use"
    at = _when(model.get("unloadsAt"))
    if at is None:
        return "forever" if model.get("keepAlive") is None else MISSING
    left = (at - now).total_seconds()
    return "now" if left < 1 else f"{_span(left)} from now"


def _waiting(model: Mapping[str, Any]) -> str:
    """Its requests waiting in the queue (SPEC §18); "-" from a gateway that does not say."""
    waiting = model.get("waiting")
    return str(waiting) if type(waiting) is int and waiting >= 0 else "-"


def _size(model: Mapping[str, Any]) -> str:
    """Measured memory while loaded, else the estimate (with a ~)."""
    memory, estimate = model.get("memoryBytes"), model.get("estimatedBytes")
    if model.get("state") == "loaded" and isinstance(memory, int) and memory > 0:
        return format_bytes(memory)
    if isinstance(estimate, int) and estimate > 0:
        return "~" + format_bytes(estimate)
    return MISSING


def _context(model: Mapping[str, Any]) -> str:
    """The context one request can use (SPEC §17.2): its server's once loaded, else what
    its configuration will give."""
    context = model.get("contextLength")
    return str(context) if type(context) is int and context > 0 else MISSING


def show_models(doc: Mapping[str, Any], now: datetime.datetime | None = None) -> str:
    """The table of ``sluice ps`` and a line on memory against the budget."""
    now = now or datetime.datetime.now(datetime.UTC)
    rows = [(clean(m.get("name")), clean(m.get("state")), _size(m), _context(m), _waiting(m),
             until(m, now))
            for m in doc.get("models") or () if isinstance(m, Mapping)]
    if not rows:
        lines = ["no managed models (add *.gguf files to a folder of model_loading.dirs, "
                 "or models: entries)"]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]
        lines = ["   ".join(h.ljust(w) for h, w in zip(_HEADERS, widths, strict=True)).rstrip()]
        lines += ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                  for row in rows]
        failed = [m for m in doc["models"] if isinstance(m, Mapping) and m.get("lastError")
                  and m.get("state") in ("failed", "unloaded")]
        lines += [f"{clean(m.get('name'))}: {clean(m.get('lastError'))}" for m in failed]
    budget, in_use = doc.get("memoryBudget"), doc.get("memoryInUse")
    if isinstance(budget, int) and isinstance(in_use, int):
        limit = doc.get("maxLoaded")
        count = f"; at most {limit} loaded" if isinstance(limit, int) and limit > 0 else ""
        lines.append(f"memory: {format_bytes(in_use)} in use of a {format_bytes(budget)} "
                     f"budget{count}")
    return "\n".join(lines)


def ps_main(data_dir: Path, as_json: bool) -> int:
    """``sluice ps [--json]``."""
    try:
        doc = call(data_dir, "GET", PATH)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if as_json else show_models(doc))
    return 0


def load_main(data_dir: Path, action: str, name: str, as_json: bool) -> int:
    """``sluice load NAME`` (waits until it is loaded) and ``sluice unload NAME``."""
    path = f"{PATH}/{quote(name, safe='')}/{action}"
    try:
        entry = call(data_dir, "POST", path, admin=True,
                     timeout=LOAD_WAIT if action == "load" else UNLOAD_WAIT)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(entry, indent=2))
        return 0
    state = clean(entry.get("state"))
    if action == "load":
        where = f", pid {entry['pid']}" if entry.get("pid") else ""
        print(f"{clean(name)}: {state} ({_size(entry)}{where})")
    elif entry.get("activeRequests"):
        print(f"{clean(name)}: unloads when its {entry['activeRequests']} request(s) in "
              f"flight end")
    else:
        print(f"{clean(name)}: {state}")
    return 0
