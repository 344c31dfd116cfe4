"""The access keys (SPEC §5, §13): their one owner, the ``access_keys`` part of secrets.yaml.

Each key is an :class:`AccessKey`, an immutable record of its entry as secrets.yaml stores
it (its hash, never the key). A change makes a new record and a new tuple of them, which
replaces the old one: whoever holds a record or the tuple (the auth path, an API answer)
keeps what it read, and nothing a reader holds is ever changed under it.

:class:`KeyStore` makes every change, under the writer that :class:`proxy.settings.store.Settings`
shares with it (one write of secrets.yaml at a time, each computed from the keys as they
are then, so concurrent changes never undo each other), and has the file written through
the settings (the rest of secrets.yaml is theirs). A failed write raises ``OSError`` and
changes nothing, except a key's last use, which is shown even when it cannot be saved.
"""

from __future__ import annotations

import base64
import binascii
import copy
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import trio

from protocol.access import hash_key, key_matches, new_access_key
from protocol.key_limits import KeyLimits, stored_limits
from protocol.lan.pinning import fingerprint_of
from proxy.timestamps import now_iso

__all__ = ["AccessKey", "KeyStore", "peer_of"]

log = logging.getLogger("sluice.settings")

LIMIT_FIELDS = ("models", "rpm", "expires_at", "priority")  # an access key's limits in secrets.yaml


@attrs.frozen(eq=False, repr=False)
class AccessKey(Mapping[str, Any]):
    """One access key as secrets.yaml stores it (``id``, ``name``, ``hash``, ``created_at``,
    ``last_used_at`` and its limits, in the file's order), read like that entry. Immutable:
    its entry is a private copy (``models`` a tuple) that nothing changes; a change is a
    new record (:meth:`changed`). ``repr()`` never shows the hash."""

    _entry: dict[str, Any]
    id: str  # the entry's id ("" when a hand edit made it no string)
    limits: KeyLimits  # parsed once, for every request that presents the key

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> AccessKey:
        """The record of a stored entry (already checked: :func:`protocol.key_limits.
        check_stored`); ``entry`` is copied, never kept."""
        own = {name: (tuple(value) if name == "models" and value is not None
                      else copy.deepcopy(value)) for name, value in entry.items()}
        key_id = own.get("id")
        return cls(own, key_id if isinstance(key_id, str) else "", stored_limits(own))

    def __getitem__(self, name: str) -> Any:
        return self._entry[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entry)

    def __len__(self) -> int:
        return len(self._entry)

    def __repr__(self) -> str:
        return f"AccessKey(id={self.id!r}, name={self._entry.get('name')!r}, {self.limits!r})"

    def stored(self) -> dict[str, Any]:
        """The entry as secrets.yaml writes it: a fresh dict (``models`` a list)."""
        return {name: (list(value) if name == "models" and value is not None
                       else copy.deepcopy(value)) for name, value in self._entry.items()}

    def changed(self, **fields: Any) -> AccessKey:
        """A new record with these fields set (a new one goes last); this one is kept."""
        return AccessKey.of({**self._entry, **fields})


SaveKeys = Callable[[tuple[AccessKey, ...]], Awaitable[None]]
"""Writes secrets.yaml with these access keys (the caller holds the writer)."""

PEER_FIELDS = ("pin", "certificate")  # a paired computer's key: its certificate (SPEC §16)


def peer_of(key: AccessKey) -> tuple[str, bytes] | None:
    """``(pin, certificate DER)`` of a key made by pairing (SPEC §16), else None (a key
    made by hand, or a hand edit that left the fields unusable)."""
    pin, text = key.get("pin"), key.get("certificate")
    if not isinstance(pin, str) or not isinstance(text, str):
        return None
    try:
        der = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return (pin, der) if der and fingerprint_of(der) == pin else None


class KeyStore:
    """The access keys of one data dir: made, limited, revoked and marked used here only.
    :attr:`all` is the current tuple of records; each change replaces it."""

    __slots__ = ("_noting", "_save", "_watchers", "_writer", "all")

    def __init__(self, entries: Iterable[Mapping[str, Any]], *, writer: trio.Lock,
                 save: SaveKeys) -> None:
        self.all: tuple[AccessKey, ...] = ()
        self._writer = writer  # the settings' one writer of secrets.yaml and config.yaml
        self._save = save
        self._noting: dict[str, str] = {}  # key id -> the minute of a use being recorded
        self._watchers: list[Callable[[tuple[AccessKey, ...]], None]] = []
        self.load(entries)

    def watch(self, watcher: Callable[[tuple[AccessKey, ...]], None]) -> None:
        """Call ``watcher(keys)`` now and whenever the set of keys changes (made, changed,
        revoked, reloaded; not a last use): the node listener's paired peers follow it."""
        self._watchers.append(watcher)
        watcher(self.all)

    def _changed(self) -> None:
        for watcher in self._watchers:
            watcher(self.all)

    def __repr__(self) -> str:
        return f"KeyStore(keys={len(self.all)})"

    def load(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Hold these stored entries (as secrets.yaml has them) as the keys, in memory
        only: what the settings read at start (a test plants its keys the same way)."""
        self.all = tuple(AccessKey.of(entry) for entry in entries)
        self._changed()

    def stored(self) -> list[dict[str, Any]]:
        """The ``access_keys`` part of secrets.yaml as written."""
        return [key.stored() for key in self.all]

    def find(self, presented: str) -> AccessKey | None:
        """The key ``presented`` is, compared in constant time against every stored hash."""
        return key_matches(presented, self.all)

    def get(self, key_id: str) -> AccessKey | None:
        return next((key for key in self.all if key.id == key_id), None)

    async def add(self, name: str, limits: Mapping[str, Any] | None = None, *,
                  peer: tuple[str, bytes] | None = None) -> tuple[AccessKey, str]:
        """Make an access key and save its hash: ``(the stored record, the key)``. The key
        itself is returned this once and kept nowhere. ``limits``: ``models``, ``rpm``,
        ``expires_at`` as stored (checked by the caller; None or absent = no limit).
        ``peer``: ``(pin, certificate DER)`` of the computer that paired (SPEC §16): the key
        is bound to that certificate, and an earlier key bound to it goes in the same write
        (pairing again replaces the key). A failed write raises OSError and adds nothing."""
        async with self._writer:
            taken = {key.get("id") for key in self.all}
            key_id, key = new_access_key()
            while key_id in taken:  # pragma: no cover - 48 random bits
                key_id, key = new_access_key()
            bound = {} if peer is None else {
                "pin": peer[0], "certificate": base64.b64encode(peer[1]).decode()}
            made = AccessKey.of({"id": key_id, "name": name, "hash": hash_key(key),
                                 "created_at": now_iso(), "last_used_at": None,
                                 **limit_fields(limits or {}), **bound})
            kept = self.all if peer is None else tuple(
                k for k in self.all if k.get("pin") != peer[0])
            await self._replace((*kept, made))
        return made, key

    async def update(self, key_id: str, changes: Mapping[str, Any]) -> AccessKey | None:
        """Change an access key's ``name`` and limits (``models``, ``rpm``, ``expires_at``
        as stored, checked by the caller; None clears a limit); the record after, or None
        when there is no key with that id. Requests authorized from then on see the new
        limits. A failed write raises OSError and changes nothing."""
        async with self._writer:
            i = self._index(key_id)
            if i is None:
                return None
            entry = self.all[i].stored()
            if "name" in changes:
                entry["name"] = changes["name"]
            for field in LIMIT_FIELDS:  # a limit given moves to the end, in their order
                if field in changes:
                    entry.pop(field, None)
            entry.update(limit_fields(changes))
            changed = AccessKey.of(entry)
            await self._replace((*self.all[:i], changed, *self.all[i + 1:]))
        return changed

    async def revoke(self, key_id: str) -> bool:
        """Forget an access key; False when there is none with that id. A failed write
        raises OSError and keeps the key."""
        async with self._writer:
            kept = tuple(key for key in self.all if key.get("id") != key_id)
            if len(kept) == len(self.all):
                return False
            await self._replace(kept)
        return True

    async def used(self, key_id: str) -> None:
        """Record that an access key was used now. secrets.yaml is written on the key's first
        use in each minute only, under the one writer (the change is made from the key as
        it is then: a concurrent update keeps it, and it keeps the update); a failed write
        is logged, never the request's problem, and the use is still shown."""
        now = now_iso()
        minute = now[:16]
        key = self.get(key_id)
        if key is None or _same_minute(key.get("last_used_at"), minute) or \
                self._noting.get(key_id) == minute:  # this minute's use is being saved
            return
        self._noting[key_id] = minute
        try:
            async with self._writer:
                i = self._index(key_id)
                if i is None or _same_minute(self.all[i].get("last_used_at"), minute):
                    return
                self.all = (*self.all[:i], self.all[i].changed(last_used_at=now),
                            *self.all[i + 1:])
                try:
                    await self._save(self.all)
                except OSError as exc:
                    log.warning("cannot record an access key's use in secrets.yaml: %s",
                                exc.strerror)
        finally:
            if self._noting.get(key_id) == minute:
                del self._noting[key_id]

    def _index(self, key_id: str) -> int | None:
        return next((n for n, key in enumerate(self.all) if key.get("id") == key_id), None)

    async def _replace(self, keys: tuple[AccessKey, ...]) -> None:
        """Save ``keys`` (the caller holds the writer), then hold them."""
        await self._save(keys)
        self.all = keys
        self._changed()


def limit_fields(limits: Mapping[str, Any]) -> dict[str, Any]:
    """The limits that are set, in their stored order (an unset one is not written)."""
    return {f: (list(limits[f]) if f == "models" else limits[f])
            for f in LIMIT_FIELDS if limits.get(f) is not None}


def _same_minute(stamp: object, minute: str) -> bool:
    return isinstance(stamp, str) and stamp[:16] == minute
