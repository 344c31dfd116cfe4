"""Who is at the other end of a client's socket (SPEC §5): a TCP peer's address counts as
this machine or not, a Unix-socket peer runs as our uid or root (SO_PEERCRED). Asked by
each :class:`~proxy.link.listener.Listener` as it takes a connection."""

from __future__ import annotations

import logging
import os
import socket
import struct

import trio

from protocol.rebinding import is_loopback_ip

log = logging.getLogger("sluice.auth")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_is_loopback(host: str) -> bool:
    """Whether a TCP peer address counts as this machine (the seam tests replace to play a
    remote client without sending traffic off the machine)."""
    return is_loopback_ip(host)


def uid_allowed(uid: int, our_uid: int) -> bool:
    return uid in (our_uid, 0)


def unix_peer(sock: trio.socket.SocketType) -> tuple[int, int] | None:
    """(pid, uid) of a Unix-socket peer; None where SO_PEERCRED does not exist."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux; the 0700 folder still guards
        return None
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option,
                                                      _PEERCRED.size))
    return pid, uid


def unix_peer_allowed(sock: trio.socket.SocketType) -> bool:
    """The SO_PEERCRED check; a refusal is logged at INFO (uid and pid only)."""
    peer = unix_peer(sock)
    if peer is None:  # pragma: no cover - see unix_peer
        return True
    pid, uid = peer
    if uid_allowed(uid, os.getuid()):
        return True
    log.info("refused a Unix-socket client: pid %d runs as uid %d, neither ours (%d) nor root",
             pid, uid, os.getuid())
    return False
