"""The paired peers the node listener trusts (SPEC §16): each peer's certificate, by its pin,
with the id of the access key bound to it at pairing. In memory; its one writer (pairing,
at start and on every change of the keys) replaces the whole set with :meth:`NodePeers.set`;
the node listener reads it per handshake and per request, and follows its changes: a new
set makes new handshakes use it, and a peer removed has its open connections closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from protocol.lan.pinning import fingerprint_of, normalize_pin
from proxy.access.key_store import AccessKey, peer_of

__all__ = ["NodePeers", "PeerEntry", "peers_of"]

PeerEntry = tuple[bytes, str]  # (the certificate's DER, the id of the access key bound to it)
Removed = Callable[[frozenset[str]], None]  # told the pins that left, after each change


class NodePeers:
    """Paired peers by pin (see the module). ``version`` counts the changes."""

    __slots__ = ("_peers", "_subscribers", "version")

    def __init__(self, peers: Mapping[str, PeerEntry] | None = None) -> None:
        self._peers: dict[str, PeerEntry] = {}
        self._subscribers: list[Removed] = []
        self.version = 0
        if peers:
            self.set(peers)

    def __repr__(self) -> str:
        return f"NodePeers({len(self._peers)} peers, version={self.version})"

    def __len__(self) -> int:
        return len(self._peers)

    def set(self, peers: Mapping[str, PeerEntry]) -> None:
        """Replace the set. Each pin must be its certificate's (in any case): ValueError
        otherwise, and nothing changes. An equal set is no change."""
        new: dict[str, PeerEntry] = {}
        for pin, (der, key_id) in peers.items():
            wanted = normalize_pin(pin)
            if wanted is None or fingerprint_of(der) != wanted:
                raise ValueError(f"{pin!r} is not the pin of the certificate given with it")
            if not key_id:
                raise ValueError(f"the peer {wanted} has no access key id")
            new[wanted] = (bytes(der), key_id)
        if new == self._peers:
            return
        removed = frozenset(self._peers.keys() - new.keys())
        self._peers = new
        self.version += 1
        for callback in list(self._subscribers):
            callback(removed)

    def subscribe(self, callback: Removed) -> None:
        """``callback(removed pins)`` after every change (synchronously: it must not block)."""
        self._subscribers.append(callback)

    def key_id_for(self, pin: str | None) -> str | None:
        """The id of the access key bound to the peer with this pin; None for no peer."""
        entry = self._peers.get(pin) if pin is not None else None
        return None if entry is None else entry[1]

    def certificates(self) -> list[bytes]:
        """The peers' certificates (DER), the node listener's trust anchors."""
        return [der for der, _ in self._peers.values()]

    def pins(self) -> frozenset[str]:
        return frozenset(self._peers)


def peers_of(keys: Iterable[AccessKey]) -> dict[str, PeerEntry]:
    """The paired peers the access keys name: each key made by pairing (its ``pin`` and
    ``certificate``, :func:`~proxy.access.key_store.peer_of`) is its peer's."""
    out: dict[str, PeerEntry] = {}
    for key in keys:
        peer = peer_of(key)
        if peer is not None:
            out[peer[0]] = (peer[1], key.id)
    return out
