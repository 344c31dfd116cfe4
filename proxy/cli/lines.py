"""``sluice events``' text: one line per frame of the live feed (SPEC §9.3). Pure: a frame
(the decoded JSON object) in, a line out; the clock is the frame's own ``at``, shown in the
given time zone (the local one by default).

Every value from the gateway goes through :func:`~proxy.cli.render.clean` (no terminal
control characters, no line breaks), and settings values are shown with anything named
like a key, token or secret blanked out: the gateway never sends one, and this text would
not show it if it did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from protocol.access import KEY_PREFIX
from protocol.request_record import token_counts
from proxy.cli.args import EVENT_TYPES, FEED_TYPES
from proxy.cli.render import clean

__all__ = ["EVENT_TYPES", "FEED_TYPES", "MAX_LINE", "duration_text", "frame_line", "wall_clock"]

# The event types of SPEC §9.3 (the gateway's proxy.observe.hub.TYPES, which the CLI does
# not import) and the two frames about the feed itself.
KIND_WIDTH = max(len(k) for k in EVENT_TYPES + FEED_TYPES)  # the type column
MAX_LINE = 400  # characters of one line after the clock and type (longer ones end in "…")
NO_TIME = "--:--:--"
MISSING = "-"
REDACTED = "(hidden)"
_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")
_NOT_SECRET = frozenset({"hasApiKey"})  # a yes/no, never the key


def wall_clock(at: object, tz: tzinfo | None = None) -> str:
    """``HH:MM:SS`` of an ISO 8601 time in ``tz`` (None: the local zone); ``--:--:--`` when
    it is not one."""
    if not isinstance(at, str):
        return NO_TIME
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        return NO_TIME
    if when.tzinfo is None:  # the feed speaks UTC; a bare time is taken as such
        when = when.replace(tzinfo=UTC)
    return when.astimezone(tz).strftime("%H:%M:%S")


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def duration_text(ms: object) -> str:
    """Milliseconds as people read them: ``3.2ms``, ``120ms``, ``2.3s``, ``1m05s``."""
    value = _number(ms)
    if value is None or value < 0:
        return MISSING
    if value < 10:
        return f"{value:.1f}ms"
    if value < 1000:
        return f"{value:.0f}ms"
    if value < 60_000:
        return f"{value / 1000:.1f}s"
    minutes, seconds = divmod(round(value / 1000), 60)
    return f"{minutes}m{seconds:02d}s"


def _rate(tokens: int, seconds: float) -> str:
    per_second = tokens / seconds
    return f"{per_second:.0f} tok/s" if per_second >= 10 else f"{per_second:.1f} tok/s"


def _text(value: object) -> str:
    return MISSING if value is None or value == "" else clean(value)


def _plural(count: object, word: str) -> str:
    return f"{_text(count)} {word}{'' if count == 1 else 's'}"


# ------------------------------------------------------------------------------ the kinds


def _request(data: Mapping[str, Any]) -> str:
    """``POST /v1/chat/completions smollm2-135m 200 local:llama ttfb 120ms 2.3s 45 events
    30 tok (25 tok/s)``, then what went wrong and the request id; ``ttft`` after ``ttfb``
    when a stream's first event with data came later than its first byte (keep-alive
    comments while a long prompt was read)."""
    parts = [_text(data.get("method")), _text(data.get("path")), _text(data.get("model")),
             _text(data.get("status")), _text(data.get("servedBy"))]
    outcome = data.get("outcome")
    if outcome is not None and outcome != "success":
        parts.append(_text(outcome))
    if data.get("error"):
        parts.append(f"({_text(data['error'])})")
    if data.get("failover"):
        parts.append(f"after {_text(data['failover'])} failed")
    ttfb, duration = _number(data.get("ttfbMs")), _number(data.get("durationMs"))
    if ttfb is not None:
        parts.append(f"ttfb {duration_text(ttfb)}")
    ttft = _number(data.get("ttftMs"))
    if ttft is not None and ttft != ttfb:
        parts.append(f"ttft {duration_text(ttft)}")
    parts.append(duration_text(duration))
    if isinstance(data.get("events"), int):
        parts.append(_plural(data["events"], "event"))
    usage = data.get("usage")
    counts = token_counts(usage) if isinstance(usage, dict) else None
    if counts is not None:
        completion = counts[1]
        # Generation speed: a stream's tokens come after its first event with data (the
        # prompt is read before it, perhaps behind keep-alive comments); a whole answer's
        # first byte comes when all of it is made.
        first = ttft if ttft is not None else ttfb
        streamed = data.get("stream") is True and first is not None
        span = duration - first if streamed and duration is not None and first else duration
        rate = f" ({_rate(completion, span / 1000)})" if span and span > 0 and completion else ""
        parts.append(f"{completion} tok{rate}")
    if data.get("id"):
        parts.append(f"[{_text(data['id'])}]")
    return " ".join(parts)


def _node(data: Mapping[str, Any]) -> str:
    parts = [_text(data.get("fingerprint"))]
    if data.get("baseUrl"):
        parts.append(f"({_text(data['baseUrl'])})")
    parts.append(_text(data.get("status")))
    details = []
    if _number(data.get("latencyMs")) is not None:
        details.append(duration_text(data["latencyMs"]))
    if isinstance(data.get("loadedModelCount"), int):
        details.append(_plural(data["loadedModelCount"], "model"))
    if isinstance(data.get("priority"), int):
        details.append(f"priority {data['priority']}")
    line = " ".join(parts) + (f", {', '.join(details)}" if details else "")
    return line + (f": {_text(data['lastError'])}" if data.get("lastError") else "")


def _circuit(data: Mapping[str, Any]) -> str:
    line = f"{_text(data.get('fingerprint'))} {_text(data.get('state')).replace('_', '-')}"
    failures = data.get("consecutiveFailures")
    if isinstance(failures, int) and failures > 0:
        line += f" ({failures} consecutive {'failure' if failures == 1 else 'failures'})"
    return line


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return name not in _NOT_SECRET and any(word in lowered for word in _SECRET_WORDS)


def _flat(value: object, path: str, out: list[str]) -> None:
    """``path value`` pairs of a settings tree, depth first (lists as compact JSON)."""
    if isinstance(value, Mapping):
        for name, item in value.items():
            key = f"{path}.{name}" if path else str(name)
            if _secret_name(str(name)) and item not in (None, "", False, True):
                out.append(f"{key} {REDACTED}")
            else:
                _flat(item, key, out)
        return
    if isinstance(value, list):
        text = json.dumps(_hidden(value), separators=(",", ":"), ensure_ascii=False)
    elif isinstance(value, str):
        text = REDACTED if value.startswith(KEY_PREFIX) else value
    else:
        text = json.dumps(value)
    out.append(f"{path} {text}" if path else text)


def _hidden(value: object) -> object:
    """A copy of ``value`` with secret-named fields and access keys blanked out."""
    if isinstance(value, Mapping):
        return {k: REDACTED if _secret_name(str(k)) and v not in (None, "", False, True)
                else _hidden(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(v) for v in value]
    if isinstance(value, str) and value.startswith(KEY_PREFIX):
        return REDACTED
    return value


def _settings(data: Mapping[str, Any]) -> str:
    fields: list[str] = []
    _flat(data.get("value"), "", fields)
    return f"{_text(data.get('section'))}: {clean(', '.join(fields)) or MISSING}"


def _notification(data: Mapping[str, Any]) -> str:
    if data.get("cleared"):
        return f"cleared {_text(data.get('code'))}"
    line = f"{_text(data.get('level') or 'warning')}: {_text(data.get('message'))}"
    return line + (f" ({_text(data['code'])})" if data.get("code") else "")


def _pairing(data: Mapping[str, Any]) -> str:
    state = _text(data.get("state"))
    if data.get("active"):
        return (f"code active until {_text(data.get('expiresAt'))}, "
                f"{_text(data.get('triesLeft'))} tries left")
    if data.get("name"):
        return f"{state} by {_text(data.get('name'))}"
    return f"code {state}"


def _stats(data: Mapping[str, Any]) -> str:
    said = [f"{word} {_text(data.get(key))}" for key, word in (
        ("totalRequests", "requests"), ("totalSuccesses", "successes"),
        ("totalFailures", "failures"), ("totalAborted", "aborted"), ("failovers", "failovers"))
        if key in data]
    nodes = [n for n in data.get("nodes") or [] if isinstance(n, Mapping)]
    local = data.get("local")
    parts = [p for p in (*nodes, local) if isinstance(p, Mapping)]
    active = [p["activeRequests"] for p in parts if isinstance(p.get("activeRequests"), int)]
    if parts and len(active) == len(parts):
        said.append(f"in flight {sum(active)}")
    opened = [_text(n.get("fingerprint")) for n in nodes
              if n.get("circuitState", "open" if n.get("circuitOpen") else None)
              in ("open", "half_open")]
    if opened:
        said.append(f"circuit not closed: {' '.join(opened)}")
    return ", ".join(said) or MISSING


_SOURCES = {"backend": "backend ", "managed": "model server "}  # as ``sluice status`` says


def _model(data: Mapping[str, Any]) -> str:
    """A local backend (``source`` backend) or a managed model server (``managed``)."""
    source = data.get("source")
    name = _SOURCES.get(source if isinstance(source, str) else "", "") + _text(
        data.get("name") or data.get("id"))
    state = data.get("state")
    if state is None and isinstance(data.get("online"), bool):
        state = "online" if data["online"] else "offline"
    details = []
    if isinstance(data.get("models"), list):
        details.append(_plural(len(data["models"]), "model"))
    if isinstance(data.get("pid"), int):
        details.append(f"pid {data['pid']}")
    if data.get("address"):
        details.append(_text(data["address"]))
    if isinstance(data.get("restarts"), int) and data["restarts"]:
        details.append(_plural(data["restarts"], "restart"))
    line = f"{name}: {_text(state)}" + (f", {', '.join(details)}" if details else "")
    return line + (f": {_text(data['lastError'])}" if data.get("lastError") else "")


def _hello(data: Mapping[str, Any]) -> str:
    line = f"connected to {_text(data.get('fingerprint'))}"
    if data.get("version"):
        line += f" (sluice {_text(data['version'])})"
    said = []
    status = data.get("status")
    if isinstance(status, Mapping):
        models = status.get("models")
        if isinstance(models, list):
            said.append(_plural(len(models), "local model"))
        summary = status.get("distributed")
        if isinstance(summary, Mapping):
            said.append(f"{_text(summary.get('onlineNodes'))} of "
                        f"{_text(summary.get('totalNodes'))} nodes online")
        else:
            said.append("load balancing off")
    notes = data.get("notifications")
    if isinstance(notes, list) and notes:
        said.append(_plural(len(notes), "notification"))
    return line + (f": {', '.join(said)}" if said else "")


def _resync(data: Mapping[str, Any]) -> str:
    return "fell behind: the gateway dropped events for this feed (what follows is current)"


def _discovered(data: Mapping[str, Any]) -> str:
    """``2 computers: studio http://10.0.0.5:39080, attic http://10.0.0.7:39080 (added)``."""
    computers = data.get("computers")
    if not isinstance(computers, list):
        return MISSING
    names = [f"{_text(c.get('name'))} {_text(c.get('baseUrl'))}"
             + (" (added)" if c.get("added") else "")
             for c in computers if isinstance(c, Mapping)]
    return clean(f"{_plural(len(names), 'computer')}" + (": " + ", ".join(names) if names else ""))


def _other(data: Mapping[str, Any]) -> str:
    return clean(json.dumps(_hidden(dict(data)), separators=(",", ":"), ensure_ascii=False))


_KINDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "request": _request, "node": _node, "circuit": _circuit, "settings": _settings,
    "notification": _notification, "stats": _stats, "model": _model, "hello": _hello,
    "resync": _resync, "pairing": _pairing, "discovered": _discovered}


def frame_line(frame: Mapping[str, Any], tz: tzinfo | None = None) -> str:
    """One frame as ``HH:MM:SS type text`` (the type in a column of its own)."""
    kind = frame.get("type")
    data = frame.get("data")
    text = _KINDS.get(kind if isinstance(kind, str) else "", _other)(
        data if isinstance(data, Mapping) else {})
    if len(text) > MAX_LINE:
        text = text[:MAX_LINE - 1] + "…"
    return f"{wall_clock(frame.get('at'), tz)} {_text(kind):<{KIND_WIDTH}} {text}".rstrip()
