"""Where the gateway listens: the local Unix socket (in a private per-user folder, or a
loopback TCP port when no folder works) and the TCP API port (SPEC §4). Binding happens
here; serving happens in :mod:`proxy.server`."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

import trio

from proxy.datadir import read_state

log = logging.getLogger("sluice.listeners")

SOCKET_NAME = "sluice.sock"
MAX_SOCKET_PATH = 103  # bytes: sun_path is 108 on Linux, 104 on macOS (with the NUL)
BACKLOG = 4096  # connections the kernel queues before we accept them (it caps this at somaxconn)
TMP_DIR = Path("/tmp")  # parent of the /tmp/sluice-<uid> candidate (tests point it elsewhere)
LIVE_CHECK_TIMEOUT = 1.0  # seconds a connect to an existing socket may take
_V6_UNAVAILABLE = {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT}
_PORT_RETRIES = 5  # any-port binds retried when the IPv6 twin of the IPv4 port is taken


class ListenerError(Exception):
    """A listener cannot be opened; the message says why (exit code 2)."""


class SocketDirChoice:
    """The outcome of trying the socket folder candidates in order."""

    def __init__(self, candidates: list[Path], folder: Path | None,
                 skipped: list[tuple[Path, str]]) -> None:
        self.candidates = candidates
        self.folder = folder  # None: no candidate works (the local TCP fallback)
        self.skipped = skipped  # (folder, reason) for each candidate that failed

    def __repr__(self) -> str:
        return f"SocketDirChoice(folder={self.folder}, skipped={len(self.skipped)})"

    def reasons(self) -> str:
        return "; ".join(f"{folder}: {reason}" for folder, reason in self.skipped)


def socket_dir_candidates(configured: str | None, data_dir: Path) -> list[Path]:
    """The folders tried for the local socket, in order, without duplicates (SPEC §4)."""
    out: list[Path] = []
    if configured:
        path = Path(configured).expanduser()
        out.append(path if path.is_absolute() else data_dir / path)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        out.append(Path(runtime) / "sluice")
    out.append(TMP_DIR / f"sluice-{os.getuid()}")
    out.append(data_dir / "sockets")
    unique: list[Path] = []
    for folder in out:
        if folder not in unique:
            unique.append(folder)
    return unique


def probe_bind(folder: Path) -> None:
    """Bind (then remove) a uniquely named socket in ``folder``; raises OSError if it fails."""
    probe = folder / f".probe-{secrets.token_hex(4)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(probe))
    finally:
        sock.close()
    probe.unlink(missing_ok=True)  # only reached when our bind made it


def check_socket_dir(folder: Path, *, make_parents: bool = False) -> str | None:
    """Create ``folder`` 0700 if missing and check it is private and usable; the reason
    if not. An existing folder is never changed (no chmod into shape)."""
    length = len(os.fsencode(folder / SOCKET_NAME))
    if length > MAX_SOCKET_PATH:
        return f"the socket path would be {length} bytes, over the limit of {MAX_SOCKET_PATH}"
    try:
        if make_parents:
            folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(folder, 0o700)  # the umask can only narrow 0700
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create it: {exc.strerror}"
    try:
        # The checks look at the opened folder, so nothing can swap the path in between.
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            return "it is a symbolic link"
        if exc.errno == errno.ENOTDIR:
            return "it is not a folder"
        return f"cannot open it: {exc.strerror}"
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not by us ({os.getuid()})"
    if info.st_mode & 0o077:
        return (f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in "
                "(0700 needed; it is left as it is)")
    try:
        probe_bind(folder)
    except OSError as exc:
        return f"a test socket cannot be bound there: {exc.strerror or exc}"
    return None


def choose_socket_dir(configured: str | None, data_dir: Path) -> SocketDirChoice:
    """Try each candidate in order; each failure is logged with its folder and reason."""
    candidates = socket_dir_candidates(configured, data_dir)
    skipped: list[tuple[Path, str]] = []
    for i, folder in enumerate(candidates):
        reason = check_socket_dir(folder, make_parents=bool(configured) and i == 0)
        if reason is None:
            return SocketDirChoice(candidates, folder, skipped)
        log.warning("socket folder %s skipped: %s", folder, reason)
        skipped.append((folder, reason))
    return SocketDirChoice(candidates, None, skipped)


async def socket_is_live(path: Path) -> bool:
    """Whether something answers on the Unix socket ``path``. A connect that neither
    succeeds nor is refused in time counts as live (a busy gateway)."""
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(LIVE_CHECK_TIMEOUT):
            await probe.connect(os.fspath(path))
        return True
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise
    finally:
        probe.close()


async def remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody answers on; refuse a live one or a non-socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ListenerError(f"{path} exists and is not a socket; it is left alone: "
                            "remove or move it yourself")
    try:
        live = await socket_is_live(path)
    except OSError as exc:
        raise ListenerError(f"cannot check the socket {path}: {exc.strerror}") from None
    if live:
        raise ListenerError(f"another gateway is already running: it answers on {path}")
    _unlink(path)
    log.info("removed stale socket %s", path)


async def remove_stale_sockets(folders: Iterable[Path]) -> list[Path]:
    """Remove the gateway socket files nobody answers on in ``folders`` (where other
    candidates or older installs left them); the paths removed. Only sockets in our own
    real folders are touched, and never a live one."""
    removed: list[Path] = []
    for folder in folders:
        path = folder / SOCKET_NAME
        try:
            folder_info = os.lstat(folder)
            info = os.lstat(path)
        except OSError:
            continue
        if (not stat.S_ISDIR(folder_info.st_mode) or folder_info.st_uid != os.getuid()
                or not stat.S_ISSOCK(info.st_mode)
                or len(os.fsencode(path)) > MAX_SOCKET_PATH):
            continue
        try:
            live = await socket_is_live(path)
        except OSError as exc:
            log.info("left %s alone: cannot check it (%s)", path, exc.strerror)
            continue
        if live:
            log.info("left %s alone: another gateway answers there", path)
            continue
        _unlink(path)
        log.info("removed stale socket %s left by an earlier run", path)
        removed.append(path)
    return removed


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def open_unix_listener(path: Path) -> trio.SocketListener:
    """Listen on ``path`` (mode 0600) after removing a stale socket file there."""
    await remove_stale_socket(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(os.fspath(path))
        os.chmod(path, 0o600)  # the folder is 0700: nobody else could reach it meanwhile
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenerError(f"cannot listen on {path}: {exc.strerror}") from None
    return trio.SocketListener(sock)


async def _bind_tcp(family: socket.AddressFamily, host: str, port: int) -> trio.SocketListener:
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # Only IPv6: the IPv4 twin is its own socket on the same port.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        await sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def open_tcp_listener(host: str, port: int) -> trio.SocketListener:
    """One IPv4 listener on ``host`` (port 0: any free one)."""
    try:
        return await _bind_tcp(socket.AF_INET, host, port)
    except OSError as exc:
        raise ListenerError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


async def open_api_listeners(port: int, *, external: bool) -> list[trio.SocketListener]:
    """The API server's listeners: 127.0.0.1 only, or with ``external`` 0.0.0.0 and ``::``
    on the same port (IPv4 only, logged, when this host has no IPv6)."""
    if not external:
        return [await open_tcp_listener("127.0.0.1", port)]
    for attempt in range(_PORT_RETRIES):
        v4 = await open_tcp_listener("0.0.0.0", port)
        v4_port = bound_port(v4)
        try:
            v6 = await _bind_tcp(socket.AF_INET6, "::", v4_port)
        except OSError as exc:
            if exc.errno in _V6_UNAVAILABLE:
                log.warning("IPv6 is unavailable (%s): external access on IPv4 only",
                            exc.strerror)
                return [v4]
            v4.socket.close()
            if port == 0 and exc.errno == errno.EADDRINUSE and attempt + 1 < _PORT_RETRIES:
                continue  # that port is taken on IPv6 only: take another free one
            raise ListenerError(f"cannot listen on [::]:{v4_port}: {exc.strerror}") from None
        return [v4, v6]
    raise AssertionError("unreachable")  # pragma: no cover


def bound_port(listener: trio.SocketListener) -> int:
    port: int = listener.socket.getsockname()[1]
    return port


async def tcp_port_is_live(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    probe = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(LIVE_CHECK_TIMEOUT):
            await probe.connect(("127.0.0.1", port))
            return True
        return False
    except OSError:
        return False
    finally:
        probe.close()


async def refuse_if_running(data_dir: Path) -> None:
    """Another gateway on this data dir (its state file names a live process whose local
    listener answers) means we must not start: ListenerError saying so (exit 2)."""
    state = read_state(data_dir)
    if state is None or state.pid <= 0:
        return
    pid = state.pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    except PermissionError:
        pass
    path, port = state.socket_path, state.local_tcp_port
    where = None
    if path is not None:
        try:
            if await socket_is_live(Path(path)):
                where = path
        except OSError:
            pass
    if port is not None and 0 < port < 65536 and await tcp_port_is_live(port):
        where = f"127.0.0.1:{port}"
    if where is not None:
        raise ListenerError(f"another gateway (pid {pid}) is already running for "
                            f"{data_dir}: it answers on {where}")
