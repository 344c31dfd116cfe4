"""The CLI's text (pure: answers in, lines out): the status, the node pool table, the node
list and the access-key list. Text from the API is shown as one printable line each."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

__all__ = ["POOL_WIDTH", "clean", "pool_rows", "show", "show_keys", "show_nodes", "show_pool"]


def show(status: dict[str, Any]) -> str:
    where = status.get("socketPath") or f"127.0.0.1:{status.get('localTcp')}"
    if status.get("localTcp"):
        where = f"(none; loopback TCP {status['localTcp']})"
    lines = [f"gateway: running; local socket {where}; "
             f"TCP port {status.get('routerPort') or 'off'}",
             f"models: {', '.join(status.get('models', [])) or '(none available)'}"]
    if status.get("identity"):  # SPEC §16: the certificate's pin, and the node port
        port = status.get("nodePort")
        lines.insert(1, f"identity: {status['identity']}"
                        + (f" (node port {port}, TLS 1.3)" if port else " (no node port)"))
    if "llamaBackends" in status:  # SPEC §11.1: what the bundled llama.cpp can run on
        lines.append(f"llama.cpp: {llama_backends(status['llamaBackends'])}")
    for backend in status.get("backends", []):
        state = "online" if backend["online"] else f"offline ({backend['lastError']})"
        lines.append(f"  backend {backend['name']}: {state}")
    for model in status.get("managedModels", []):
        lines.append(f"  model server {model['name']}: {model['state']}, pid {model['pid']}, "
                     f"{model['address'] or 'no address'}, restarts {model['restarts']}"
                     + (f", last error: {model['lastError']}" if model["lastError"] else ""))
    lines = [clean(line) for line in lines]  # names and errors from the API: one line each
    if "pool" in status:
        lines.append(show_pool(status.get("distributed"), status["pool"],
                               local_models=status.get("loadedModels")))
    for note in status.get("notifications", []):
        lines.append(clean(f"{note.get('level', 'warning')}: {note.get('message')}"))
    return "\n".join(lines)


def llama_backends(names: object) -> str:
    """``llamaBackends`` (a list of names, or null) as the status line says it."""
    if not isinstance(names, list):
        return "not installed (or it cannot tell its backends: see the gateway's log)"
    return ", ".join(map(str, names)) or "no backend"


# ------------------------------------------------------------------------ the pool table

POOL_WIDTH = 100  # the table fits in this many columns (long node names are cut)
MIN_NODE_WIDTH = 12  # below this the table may be wider than POOL_WIDTH
NAME_KEPT = 8  # columns of a node's name kept before its fingerprint is cut
MISSING = "-"
_HEADERS = ("PRIO", "NODE", "STATUS", "LATENCY", "MODELS", "CIRCUIT", "IN-FLIGHT", "REQ",
            "OK", "FAIL", "AVG-TTFB")
_LEFT = frozenset({"NODE", "STATUS", "CIRCUIT"})  # the others are numbers, right-aligned
_NODE = _HEADERS.index("NODE")


def _cols(text: str) -> int:
    """Terminal columns ``text`` takes: wide (e.g. Hangul) characters two, combining none."""
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, ending in "…" when shortened."""
    if _cols(text) <= width:
        return text
    out, used = "", 0
    for ch in text:
        size = _cols(ch)
        if used + size > width - 1:
            break
        out, used = out + ch, used + size
    return out + "…"


def _pad(text: str, width: int, left: bool) -> str:
    fill = " " * max(width - _cols(text), 0)
    return text + fill if left else fill + text


def clean(value: object) -> str:
    """Text from the API as one printable line (no terminal control characters)."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def _count(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return MISSING


def _ms(value: object, decimals: int) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    if value >= 1000:
        return f"{value / 1000:.2f}s"
    return f"{value:.{decimals}f}ms"


def _node_cell(name: str, fingerprint: str, width: int) -> str:
    """``name (fingerprint)`` in ``width`` columns: the name is cut first, down to
    NAME_KEPT columns, then the fingerprint (``sluice nodes list`` shows it whole)."""
    if not name or name == fingerprint:
        return _cut(fingerprint, width)
    if _cols(name) + _cols(fingerprint) + 3 <= width:
        return f"{name} ({fingerprint})"
    kept = min(_cols(name), NAME_KEPT)
    if width - _cols(fingerprint) - 3 >= kept:
        return f"{_cut(name, width - _cols(fingerprint) - 3)} ({fingerprint})"
    room = width - kept - 3
    if room >= NAME_KEPT:
        return f"{_cut(name, kept)} ({_cut(fingerprint, room)})"
    return _cut(f"{name} ({fingerprint})", width)


def _circuit(stats: Mapping[str, Any] | None) -> str:
    if stats is None:
        return MISSING
    state = stats.get("circuitState")
    if not isinstance(state, str):
        opened = stats.get("circuitOpen")
        state = MISSING if not isinstance(opened, bool) else "open" if opened else "closed"
    state = clean(state).replace("_", "-")
    failures = stats.get("consecutiveFailures")
    if isinstance(failures, int) and not isinstance(failures, bool) and failures > 0:
        state += f" ({failures})"
    return state


def _counters(stats: Mapping[str, Any] | None) -> list[str]:
    """IN-FLIGHT, REQ, OK, FAIL and AVG-TTFB from one routing-stats entry."""
    stats = stats or {}
    return [_count(stats.get("activeRequests")), _count(stats.get("totalRequests")),
            _count(stats.get("successCount")), _count(stats.get("failureCount")),
            _ms(stats.get("avgLatencyMs"), 1)]


def _listed(doc: object, key: str | None = None) -> list[Any] | None:
    """The list an answer is (``key`` None) or holds under ``key``; None when it has none."""
    items = doc.get(key) if key is not None and isinstance(doc, Mapping) else doc
    return items if isinstance(items, list) else None


def _entries(doc: object, key: str | None = None) -> list[Mapping[str, Any]]:
    """The node entries (dicts with a fingerprint) of one answer; [] when it has none."""
    return [e for e in _listed(doc, key) or []
            if isinstance(e, Mapping) and isinstance(e.get("fingerprint"), str)]


def pool_rows(pool: Mapping[str, Any]) -> list[tuple[str, dict[str, Mapping[str, Any]]]]:
    """The nodes of the three answers merged by fingerprint, top priority first: each
    fingerprint with its entry from ``nodes`` (the registry), ``stats`` (routing-stats) and
    ``health`` (distributed-status ``endpoints``), where that answer lists it."""
    sources = (("nodes", _entries(pool.get("nodes"))),
               ("stats", _entries(pool.get("routingStats"), "nodes")),
               ("health", _entries(pool.get("distributedStatus"), "endpoints")))
    rows: dict[str, dict[str, Mapping[str, Any]]] = {}
    for source, entries in sources:
        for entry in entries:  # each answer is in priority order: first seen keeps its place
            rows.setdefault(entry["fingerprint"], {}).setdefault(source, entry)
    known = {fp: _priority(parts) for fp, parts in rows.items()}
    order = list(rows)
    if all(p is not None for p in known.values()):
        order.sort(key=lambda fp: -(known[fp] or 0))
    return [(fp, rows[fp]) for fp in order]


def _priority(parts: Mapping[str, Mapping[str, Any]]) -> int | None:
    for source in ("nodes", "health"):
        value = parts.get(source, {}).get("priority")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _node_status(parts: Mapping[str, Mapping[str, Any]]) -> str:
    health = parts.get("health")
    if health is not None and isinstance(health.get("status"), str):
        return clean(health["status"])
    for source in ("nodes", "stats"):  # distributed-status lists enabled nodes only
        if parts.get(source, {}).get("enabled") is False:
            return "disabled"
    return MISSING


def _registered(pool: Mapping[str, Any]) -> int | None:
    """How many nodes are configured: the registry's count, else routing-stats' (which
    lists every configured node too); None when neither answered."""
    for items in (_listed(pool.get("nodes")), _listed(pool.get("routingStats"), "nodes")):
        if items is not None:
            return len(items)
    return None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _totals(stats: object) -> str:
    if not isinstance(stats, Mapping):
        return "totals: - (no routing stats from this gateway)"
    said = [f"{word} {_count(stats.get(key))}" for key, word in (
        ("totalRequests", "requests"), ("totalSuccesses", "successes"),
        ("totalFailures", "failures"), ("totalAborted", "aborted"), ("failovers", "failovers"))]
    return "totals: " + ", ".join(said)


def show_pool(summary: Mapping[str, Any] | None, pool: Mapping[str, Any], *,
              local_models: object = None, width: int = POOL_WIDTH) -> str:
    """The node pool as text: with load balancing off (no ``distributed`` block in the
    status) one line; else a line about the pool, a table with a ``local`` row and one row
    per node in priority order, and the totals. Pure: ``summary`` is the status's
    ``distributed`` block, ``pool`` what :func:`proxy.cli.admin.fetch_pool` returns,
    ``local_models`` the status's ``loadedModels``. Unknown values show as "-"; the table
    fits in ``width`` columns by cutting node names."""
    count = _registered(pool)
    if not isinstance(summary, Mapping):
        known = "" if count is None else \
            f" ({_plural(count, 'node') if count else 'no nodes'} registered)"
        return f"load balancing: off{known}"
    online, total = summary.get("onlineNodes"), summary.get("totalNodes")
    head = [f"load balancing: on, strategy {clean(summary.get('strategy', MISSING))}",
            f"{_count(online)} of {_count(total)} nodes online"]
    remote = summary.get("remoteModels")
    if isinstance(remote, int) and not isinstance(remote, bool):
        head.append(_plural(remote, "remote model"))
    stats = pool.get("routingStats")
    local = stats.get("local") if isinstance(stats, Mapping) else None
    rows: list[list[str]] = [[MISSING, "local", MISSING, MISSING, _count(local_models),
                              MISSING, *_counters(local if isinstance(local, Mapping)
                                                  else None)]]
    names: list[tuple[str, str]] = [("", "local")]
    for fingerprint, parts in pool_rows(pool):
        name = next((p["name"] for p in (parts.get("nodes"), parts.get("stats"))
                     if p is not None and isinstance(p.get("name"), str)), "")
        health = parts.get("health")
        health_cells = [MISSING, MISSING] if health is None else [
            _ms(health.get("latencyMs"), 0), _count(health.get("loadedModelCount"))]
        rows.append([_count(_priority(parts)), "", _node_status(parts), *health_cells,
                     _circuit(parts.get("stats")), *_counters(parts.get("stats"))])
        names.append((clean(name), clean(fingerprint)))
    widths = [max(_cols(h), *(_cols(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]
    natural = max(_cols(_node_cell(n, fp, 10**6)) for n, fp in names)
    room = width - (sum(widths) - widths[_NODE]) - (len(_HEADERS) - 1)
    widths[_NODE] = max(min(natural, room), MIN_NODE_WIDTH)
    for row, (name, fingerprint) in zip(rows, names, strict=True):
        row[_NODE] = _node_cell(name, fingerprint, widths[_NODE])
    lines = [", ".join(head), ""]
    for cells in (list(_HEADERS), *rows):
        lines.append(" ".join(_pad(c, widths[i], _HEADERS[i] in _LEFT)
                              for i, c in enumerate(cells)).rstrip())
    lines.append("")
    lines.append(_totals(stats))
    for fingerprint, parts in pool_rows(pool):
        health = parts.get("health")
        error = health.get("lastError") if health is not None else None
        if isinstance(error, str) and error:
            lines.append(f"{clean(fingerprint)}: {clean(error)}")
    return "\n".join(lines)


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "no nodes (add one with: sluice nodes add http://HOST:39080)"
    lines = [f"{'#':>3} {'FINGERPRINT':<22} {'NAME':<20} {'URL':<32} {'ROUTING':<8} "
             f"{'WEIGHT':>6} {'KEY':<4} LINK"]
    for i, node in enumerate(nodes, 1):
        lines.append(f"{i:>3} {node['fingerprint']:<22} {node['name'] or '-':<20} "
                     f"{node['baseUrl']:<32} {'on' if node['enabled'] else 'off':<8} "
                     f"{node.get('weight', 1):>6} {'yes' if node['hasApiKey'] else 'no':<4} "
                     f"{node.get('link', 'plain')}")
    return "\n".join(lines)


def show_keys(keys: list[dict[str, Any]]) -> str:
    """The access keys (``GET /api/v1/access-keys``) and their limits as a table; never the
    keys themselves."""
    if not keys:
        return "no access keys (make one with: sluice keys create --name NAME)"
    lines = [f"{'ID':<15} {'NAME':<16} {'MODELS':<24} {'RPM':>6}  {'EXPIRES':<20} LAST USED"]
    for key in keys:
        models = key.get("models")
        expires = key.get("expiresAt") or "never"
        if key.get("expired"):
            expires += " (expired)"
        lines.append(clean(f"{key['id']:<15} {_cut(key['name'] or '-', 16):<16} "
                           f"{_cut(','.join(models) if models else 'all', 24):<24} "
                           f"{key.get('rpm') or '-':>6}  {expires:<20} "
                           f"{key['lastUsedAt'] or 'never'}"))
    return "\n".join(lines)
