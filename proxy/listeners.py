"""Where the gateway listens: the local Unix socket (in a private per-user folder) and the
TCP API port. Binding happens here; serving happens in :mod:`proxy.server`."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from pathlib import Path

import trio

log = logging.getLogger("sluice.listeners")

SOCKET_NAME = "sluice.sock"
MAX_SOCKET_PATH = 103  # bytes: sun_path is 108 on Linux, 104 on macOS (with the NUL)
BACKLOG = 1024


class ListenerError(Exception):
    """A listener cannot be opened; the message says why (exit code 2)."""


def socket_dir_candidates(configured: str | None, data_dir: Path) -> list[Path]:
    """The folders tried for the local socket, in order (SPEC §4)."""
    out: list[Path] = []
    if configured:
        out.append(Path(configured).expanduser())
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        out.append(Path(runtime) / "sluice")
    out.append(Path(f"/tmp/sluice-{os.getuid()}"))
    out.append(data_dir / "sockets")
    return out


def check_socket_dir(folder: Path) -> str | None:
    """Create ``folder`` 0700 if missing and check it is private; the reason if not."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"cannot create or open it: {exc.strerror}"
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not {os.getuid()}"
    if info.st_mode & 0o077:
        return f"mode {stat.S_IMODE(info.st_mode):04o} lets others in (0700 needed)"
    if len(os.fsencode(folder / SOCKET_NAME)) > MAX_SOCKET_PATH:
        return f"the socket path would be longer than {MAX_SOCKET_PATH} bytes"
    return None


def choose_socket_dir(configured: str | None, data_dir: Path) -> Path | None:
    for folder in socket_dir_candidates(configured, data_dir):
        reason = check_socket_dir(folder)
        if reason is None:
            return folder
        log.warning("socket folder %s skipped: %s", folder, reason)
    return None


async def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody answers on; refuse a live one or a non-socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ListenerError(f"{path} exists and is not a socket; remove it yourself")
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(1):
            await probe.connect(os.fspath(path))
            raise ListenerError(f"another gateway is already listening on {path}")
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ListenerError(f"cannot check {path}: {exc.strerror}") from None
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    log.info("removed stale socket %s", path)


async def open_unix_listener(path: Path) -> trio.SocketListener:
    await _remove_stale_socket(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(os.fspath(path))
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenerError(f"cannot listen on {path}: {exc.strerror}") from None
    return trio.SocketListener(sock)


async def open_tcp_listener(host: str, port: int) -> trio.SocketListener:
    try:
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=BACKLOG)
    except OSError as exc:
        raise ListenerError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return listeners[0]


def bound_port(listener: trio.SocketListener) -> int:
    port: int = listener.socket.getsockname()[1]
    return port
