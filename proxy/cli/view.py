"""What ``sluice status --watch`` shows, kept up to date from the live feed (SPEC §9.3).
Pure: frames in, the status document and its text out (no sockets, no clock).

The document has the shape :func:`proxy.cli.admin.fetch_status` returns, so the text is
:func:`proxy.cli.render.show`'s, the same as ``sluice status``. ``hello`` gives the whole
of it. An event that names exactly what changed is applied in place: ``node`` (its
endpoint entry and the online count), ``circuit`` (its node's routing-stats entry),
``stats`` (the routing-stats body) and ``notification``. The others (``settings``,
``model``, and ``node`` for the model count it may change) and ``resync`` ask the caller
to fetch the status again; the frames applied while a fetch runs are kept and applied
again on top of its answer, which may be older than they are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs

from proxy.cli.render import show

__all__ = ["CLEAR", "REFETCH_KINDS", "Change", "WatchView", "screen"]

REFETCH_KINDS = frozenset({"node", "settings", "model", "resync"})
PATCH_KINDS = frozenset({"node", "circuit", "stats", "notification"})
MAX_KEPT = 1024  # frames kept while a fetch runs; beyond it the fetch is done again
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen (ANSI)


@attrs.frozen
class Change:
    """What a frame asks of the caller: draw again, fetch the status again."""

    redraw: bool = False
    refetch: bool = False


NOTHING = Change()


def _dict(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _entries(doc: object, key: str) -> list[Any] | None:
    items = doc.get(key) if isinstance(doc, dict) else None
    return items if isinstance(items, list) else None


def _replace_entry(items: list[Any], entry: Mapping[str, Any], key: str) -> bool:
    """Put ``entry`` in place of the item with the same ``key``; False when none has it."""
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and item.get(key) == entry.get(key):
            items[i] = copy.deepcopy(dict(entry))
            return True
    return False


class WatchView:
    """The status being watched (None until ``hello``) and the fetch bookkeeping."""

    __slots__ = ("_fetching", "_kept", "_stale", "note", "status")

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.note: str | None = None  # why the last fetch failed, shown under the table
        self._fetching = False
        self._kept: list[Mapping[str, Any]] = []
        self._stale = False  # a fetch is needed after the one running

    def __repr__(self) -> str:
        return (f"WatchView(ready={self.status is not None}, fetching={self._fetching}, "
                f"kept={len(self._kept)})")

    # --------------------------------------------------------------------------- frames

    def apply(self, frame: Mapping[str, Any]) -> Change:
        """Take one frame of the feed; what the caller should do next."""
        kind = frame.get("type")
        data = frame.get("data")
        if kind == "hello":
            self.status = self._from_hello(data if isinstance(data, Mapping) else {})
            return Change(redraw=True)
        if self.status is None or not isinstance(kind, str):
            return NOTHING
        redraw = False
        if kind in PATCH_KINDS and isinstance(data, Mapping):
            redraw = self._patch(kind, data)
            if self._fetching:
                if len(self._kept) < MAX_KEPT:
                    self._kept.append(frame)
                else:
                    self._stale = True
        refetch = kind in REFETCH_KINDS
        if refetch and self._fetching:
            self._stale = True
        return Change(redraw=redraw, refetch=refetch)

    @staticmethod
    def _from_hello(data: Mapping[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)  # patched in place from now on
        status = _dict(data.get("status")) or {}
        notes = data.get("notifications")
        status["notifications"] = list(notes) if isinstance(notes, list) else []
        status["pool"] = {"distributedStatus": _dict(data.get("pool")),
                          "routingStats": _dict(data.get("stats")), "nodes": None}
        return status

    def _patch(self, kind: str, data: Mapping[str, Any]) -> bool:
        """Apply one event in place; True when the document changed."""
        assert self.status is not None
        pool = self.status.setdefault("pool", {})
        if kind == "stats":
            pool["routingStats"] = copy.deepcopy(dict(data))
            return True
        if kind == "notification":
            return self._notification(data)
        if not isinstance(data.get("fingerprint"), str):
            return False
        if kind == "node":
            return self._node(pool, data)
        return self._circuit(pool, data)

    def _node(self, pool: dict[str, Any], data: Mapping[str, Any]) -> bool:
        health = _dict(pool.get("distributedStatus"))
        endpoints = _entries(health, "endpoints")
        if health is None or endpoints is None or not _replace_entry(
                endpoints, data, "fingerprint"):
            return False  # a node it does not list: the fetch that follows will show it
        online = sum(1 for e in endpoints if isinstance(e, Mapping) and e.get("status") ==
                     "online")
        health["onlineNodes"] = online
        summary = _dict(self.status.get("distributed")) if self.status else None
        if summary is not None:
            summary["onlineNodes"] = online
        return True

    @staticmethod
    def _circuit(pool: dict[str, Any], data: Mapping[str, Any]) -> bool:
        for entry in _entries(pool.get("routingStats"), "nodes") or []:
            if isinstance(entry, dict) and entry.get("fingerprint") == data["fingerprint"]:
                state = data.get("state")
                entry["circuitState"] = state
                entry["circuitOpen"] = state == "open"
                if "consecutiveFailures" in data:
                    entry["consecutiveFailures"] = data["consecutiveFailures"]
                return True
        return False

    def _notification(self, data: Mapping[str, Any]) -> bool:
        """One notification raised (replacing the one with its code) or cleared."""
        assert self.status is not None
        notes = [n for n in self.status.get("notifications") or [] if isinstance(n, Mapping)]
        code = data.get("code")
        if data.get("cleared"):
            kept = [n for n in notes if n.get("code") != code]
        else:
            entry = copy.deepcopy(dict(data))
            kept = [entry if code is not None and n.get("code") == code else n for n in notes]
            if entry not in kept:
                kept.append(entry)
        changed = kept != notes
        self.status["notifications"] = kept
        return changed

    # ---------------------------------------------------------------------------- fetches

    def fetch_started(self) -> None:
        """A fetch of the whole status begins: keep the frames applied from now on."""
        self._fetching, self._kept, self._stale = True, [], False

    def fetch_done(self, status: dict[str, Any] | None, error: str | None = None) -> bool:
        """The fetch's answer (None when it failed, with ``error``): it replaces the
        document and the frames kept since it started are applied again. True when another
        fetch is needed (something that asks for one came while this one ran)."""
        kept, stale = self._kept, self._stale
        self._fetching, self._kept, self._stale = False, [], False
        self.note = error
        if status is not None and self.status is not None:
            self.status = status
            for frame in kept:
                self.apply(frame)
        return stale

    # ------------------------------------------------------------------------------- text

    def text(self) -> str:
        """The status as ``sluice status`` prints it (empty before ``hello``)."""
        if self.status is None:
            return ""
        text = show(self.status)
        return text + (f"\n(not refreshed: {self.note})" if self.note else "")


def screen(text: str, shown: str | None, *, tty: bool, footer: str = "") -> str | None:
    """What to write to draw ``text`` when ``shown`` is on the screen already: None when
    nothing changed; on a terminal the screen cleared and the text (with ``footer`` under
    it), elsewhere the text after a blank line (the first one without)."""
    if not text or text == shown:
        return None
    if tty:
        return CLEAR + text + (f"\n\n{footer}" if footer else "") + "\n"
    return ("" if shown is None else "\n") + text + "\n"
