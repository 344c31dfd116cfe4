"""SPEC §16's warnings about node links.

A node whose certificate is not the one pinned at pairing (:class:`IdentityChanges`):
its checks found it (``lastError: node_identity_changed``, offline); one warning names
every such node, said once for each, and is cleared when none is left (paired again,
removed, or back to its pinned certificate). Nothing is ever re-trusted without a pairing.

A plain link (:class:`PlainLinks`): a node reached over plain HTTP at an address
outside 127.0.0.0/8 (added by URL and key, or a gateway without §16) carries prompts,
answers and its key in clear on the network. One ``plain_node_link`` warning names every
such node; it is raised once per node that becomes one (not again for the same nodes) and
cleared when none is left (each paired, removed, disabled, or moved to this machine) or
load balancing is off (then nothing goes to the nodes)."""

from __future__ import annotations

from collections.abc import Iterable

from protocol.config import Config, NodeConfig
from protocol.lan.pinning import NODE_IDENTITY_CHANGED
from protocol.rebinding import is_loopback_ip
from protocol.upstream_url import parse_upstream_url
from proxy.notifications import Notifications
from proxy.registry.nodes import NodeEndpoint

__all__ = ["PLAIN_NODE_LINK", "IdentityChanges", "PlainLinks", "plain_remote_nodes"]

PLAIN_NODE_LINK = "plain_node_link"


def _remote(base_url: str) -> bool:
    try:
        host = parse_upstream_url(base_url).host or ""
    except ValueError:
        return False  # never reached at all: its checks say why
    return host != "localhost" and not is_loopback_ip(host)


def plain_remote_nodes(nodes: Iterable[NodeConfig]) -> list[NodeConfig]:
    """The enabled nodes without a pin whose ``base_url`` is not this machine."""
    return [n for n in nodes if n.enabled and n.pin is None and _remote(n.base_url)]


class PlainLinks:
    """Follows the config (a settings subscriber) and keeps the one warning true."""

    __slots__ = ("_notifications", "_warned")

    def __init__(self, notifications: Notifications, cfg: Config) -> None:
        self._notifications = notifications
        self._warned: frozenset[str] = frozenset()
        self(cfg)

    def __call__(self, cfg: Config) -> None:
        plain = plain_remote_nodes(cfg.nodes) if cfg.load_balancing.enabled else []
        now = frozenset(n.fingerprint for n in plain)
        if not plain:
            self._notifications.clear(PLAIN_NODE_LINK)
        elif not now <= self._warned:  # a node that was not plain before
            names = ", ".join(f"{n.name} ({n.base_url})" for n in plain)
            self._notifications.raise_(PLAIN_NODE_LINK, (
                f"plain HTTP on the network to {names}: anyone on that network can read the "
                "prompts, the answers and the node's key. Pair with the other computer's code "
                "(sluice nodes add URL --code CODE) to link over pinned TLS 1.3."))
        self._warned = now


class IdentityChanges:
    """Follows the node index's changes (a subscriber of ``NodeIndex.changes``) and keeps
    the ``node_identity_changed`` warning true."""

    __slots__ = ("_notifications", "_seen")

    def __init__(self, notifications: Notifications) -> None:
        self._notifications = notifications
        self._seen: dict[str, str] = {}  # fingerprint -> the line naming it

    def __call__(self, endpoint: NodeEndpoint) -> None:
        fingerprint = endpoint.fingerprint
        if endpoint.presented is None:
            if self._seen.pop(fingerprint, None) is not None and not self._seen:
                self._notifications.clear(NODE_IDENTITY_CHANGED)
            return
        line = (f"{endpoint.cfg.name} ({endpoint.cfg.base_url}) presented the certificate "
                f"{endpoint.presented}, not {endpoint.cfg.pin} pinned at pairing")
        if self._seen.get(fingerprint) == line:
            return
        self._seen[fingerprint] = line
        self._notifications.raise_(NODE_IDENTITY_CHANGED, (
            "; ".join(self._seen.values()) + ". It is refused: no request goes to it until "
            "you pair with it again (on it: sluice pair; here: sluice nodes add URL --code "
            "CODE). If you did not reinstall it or reset its data folder, someone may be "
            "in between."))
