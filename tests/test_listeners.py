"""Listeners (SPEC §4): the socket folder candidates and their checks, stale and live
sockets, the loopback TCP fallback with its notification, and the API server's bind
addresses (read from /proc/net/tcp*: no traffic ever goes to a non-loopback address)."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from proxy import listeners
from proxy.datadir import STATE_FILE
from proxy.listeners import (
    SOCKET_NAME,
    ListenerError,
    choose_socket_dir,
    socket_dir_candidates,
)
from proxy.server import Gateway
from tests.client import Client
from tests.conftest import free_port, gateway_config, open_settings
from tests.waits import settled

_LISTEN = "0A"


class Places:
    """The candidate folders of one test, all under a short temporary folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.configured = root / "c"
        self.runtime = root / "run"  # $XDG_RUNTIME_DIR
        self.xdg = self.runtime / "sluice"
        self.tmp = root / "tmp"  # stands in for /tmp
        self.tmp_dir = self.tmp / f"sluice-{os.getuid()}"
        self.data = root / "data"
        self.data_sockets = self.data / "sockets"


@pytest.fixture
def places(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Places:
    p = Places(short_tmp)
    for folder in (p.runtime, p.tmp, p.data):
        folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(p.runtime))
    monkeypatch.setattr(listeners, "TMP_DIR", p.tmp)
    return p


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


def stale_socket(path: Path) -> None:
    """A socket file nobody listens on (what a crashed gateway leaves)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.close()


def live_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.listen(8)
    return sock


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(os.fspath(path))
        except OSError:
            return False
        return True


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc stores the address as 32-bit words in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listening(port: int) -> set[str]:
    """The local addresses listening on ``port``, from /proc/net/tcp and tcp6."""
    out: set[str] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            addr, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == _LISTEN:
                out.add(_address(addr))
    return out


def settings_for(places: Places, *, socket_dir: Path | None = None, fallback_port: int = 0,
                 **api: Any) -> Any:
    port = api.pop("port", 0)
    cfg = gateway_config([], socket_dir=socket_dir or places.configured, **api)
    cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=port),
                       local=attrs.evolve(cfg.local, fallback_port=fallback_port))
    return open_settings(places.data, cfg)


def break_every_candidate(places: Places) -> None:
    """Each candidate fails a different check."""
    places.xdg.symlink_to(private_dir(places.root / "elsewhere"))
    places.tmp_dir.mkdir(mode=0o700)
    os.chmod(places.tmp_dir, 0o755)
    places.data_sockets.write_text("not a folder")


# -- folder checks ---------------------------------------------------------------------------

def test_candidates_in_order_with_and_without_xdg(places: Places,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert socket_dir_candidates(str(places.configured), places.data) == [
        places.configured, places.xdg, places.tmp_dir, places.data_sockets]
    assert socket_dir_candidates(None, places.data) == [
        places.xdg, places.tmp_dir, places.data_sockets]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert socket_dir_candidates(None, places.data) == [places.tmp_dir, places.data_sockets]
    choice = choose_socket_dir(None, places.data)
    assert choice.folder == places.tmp_dir
    assert not choice.skipped


def test_missing_folder_created_0700_and_probe_leaves_nothing(places: Places) -> None:
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.configured
    assert mode(places.configured) == 0o700
    assert os.listdir(places.configured) == []  # the probe socket is gone
    assert not places.xdg.exists()  # later candidates are not even created


def test_xdg_used_when_nothing_is_configured(places: Places) -> None:
    choice = choose_socket_dir(None, places.data)
    assert choice.folder == places.xdg
    assert mode(places.xdg) == 0o700


def assert_skipped(caplog: pytest.LogCaptureFixture, folder: Path, reason: str) -> None:
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(folder) in m and reason in m for m in warnings), warnings


def test_mode_0755_skipped_and_never_chmodded(places: Places,
                                              caplog: pytest.LogCaptureFixture) -> None:
    places.configured.mkdir()
    os.chmod(places.configured, 0o755)
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.xdg
    assert mode(places.configured) == 0o755
    assert_skipped(caplog, places.configured, "mode 0755")


def test_symlink_to_a_good_folder_skipped(places: Places,
                                          caplog: pytest.LogCaptureFixture) -> None:
    places.configured.symlink_to(private_dir(places.root / "good"))
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.xdg
    assert_skipped(caplog, places.configured, "symbolic link")


def test_folder_of_another_uid_skipped(places: Places, caplog: pytest.LogCaptureFixture) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    private_dir(places.configured)
    os.chown(places.configured, 12345, -1)
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.xdg
    assert os.stat(places.configured).st_uid == 12345
    assert_skipped(caplog, places.configured, "owned by uid 12345")


def test_over_long_socket_path_skipped(places: Places, caplog: pytest.LogCaptureFixture) -> None:
    long_dir = places.root / ("x" * (listeners.MAX_SOCKET_PATH - len(str(places.root))))
    choice = choose_socket_dir(str(long_dir), places.data)
    assert choice.folder == places.xdg
    assert not long_dir.exists()  # not even created
    assert_skipped(caplog, long_dir, "over the limit of 103")


def test_not_a_folder_skipped(places: Places, caplog: pytest.LogCaptureFixture) -> None:
    places.configured.write_text("x")
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.xdg
    assert places.configured.read_text() == "x"
    assert_skipped(caplog, places.configured, "not a folder")


def test_probe_bind_failure_skipped(places: Places, caplog: pytest.LogCaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real_probe = listeners.probe_bind

    def probe(folder: Path) -> None:
        if folder == places.configured:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        real_probe(folder)

    monkeypatch.setattr(listeners, "probe_bind", probe)
    choice = choose_socket_dir(str(places.configured), places.data)
    assert choice.folder == places.xdg
    assert_skipped(caplog, places.configured, "test socket cannot be bound")


def test_real_probe_bind_failure_is_a_reason(places: Places) -> None:
    private_dir(places.configured)
    (places.configured / "sub").write_text("")
    with pytest.raises(NotADirectoryError):  # a path through a regular file: no bind
        listeners.probe_bind(places.configured / "sub")


def test_every_candidate_failing_gives_each_reason(places: Places) -> None:
    break_every_candidate(places)
    choice = choose_socket_dir(None, places.data)
    assert choice.folder is None
    assert [f for f, _ in choice.skipped] == [places.xdg, places.tmp_dir, places.data_sockets]
    text = choice.reasons()
    assert "symbolic link" in text
    assert "mode 0755" in text
    assert "not a folder" in text


# -- stale and live sockets ---------------------------------------------------------------

async def test_socket_is_0600_in_a_0700_folder(places: Places, nursery: trio.Nursery) -> None:
    gateway = Gateway(settings_for(places))
    await nursery.start(gateway.run)
    path = places.configured / SOCKET_NAME
    assert gateway.ctx.socket_path == os.fspath(path)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert mode(path) == 0o600
    assert mode(places.configured) == 0o700
    state = json.loads((places.data / STATE_FILE).read_text())
    assert state["socketPath"] == os.fspath(path)
    assert state["localTcpPort"] is None
    assert mode(places.data / STATE_FILE) == 0o600


async def test_stale_socket_replaced(places: Places, nursery: trio.Nursery) -> None:
    private_dir(places.configured)
    path = places.configured / SOCKET_NAME
    stale_socket(path)
    os.chmod(path, 0o755)  # to tell the old file from its replacement (inodes get reused)
    assert not answers(path)
    gateway = Gateway(settings_for(places))
    await nursery.start(gateway.run)
    assert mode(path) == 0o600
    client = await Client.open(f"unix:{path}")
    reply = await client.request("GET", "/health")
    assert reply.status == 200
    await client.aclose()


async def test_live_socket_means_exit_2_and_is_left_alone(places: Places) -> None:
    private_dir(places.configured)
    path = places.configured / SOCKET_NAME
    with live_socket(path):
        with pytest.raises(ListenerError, match="another gateway is already running"):
            await Gateway(settings_for(places)).run()
        assert answers(path)
    assert not (places.data / STATE_FILE).exists()


async def test_regular_file_at_socket_path_is_kept(places: Places) -> None:
    private_dir(places.configured)
    path = places.configured / SOCKET_NAME
    path.write_text("precious")
    with pytest.raises(ListenerError, match=str(path)):
        await Gateway(settings_for(places)).run()
    assert path.read_text() == "precious"


async def test_stale_sockets_at_other_candidates_removed_once(places: Places,
                                                              nursery: trio.Nursery) -> None:
    for folder in (places.xdg, places.data_sockets, places.tmp_dir):
        private_dir(folder)
    stale_socket(places.xdg / SOCKET_NAME)
    stale_socket(places.data_sockets / SOCKET_NAME)
    (places.data_sockets / "notes.txt").write_text("kept")
    with live_socket(places.tmp_dir / SOCKET_NAME):
        gateway = Gateway(settings_for(places))
        await nursery.start(gateway.run)
        assert gateway.ctx.socket_path == os.fspath(places.configured / SOCKET_NAME)
        assert not (places.xdg / SOCKET_NAME).exists()
        assert not (places.data_sockets / SOCKET_NAME).exists()
        assert (places.data_sockets / "notes.txt").read_text() == "kept"
        assert answers(places.tmp_dir / SOCKET_NAME)  # someone else's live gateway


async def test_stop_leaves_a_socket_that_replaced_ours(places: Places) -> None:
    gateway = Gateway(settings_for(places))
    path = places.configured / SOCKET_NAME
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        path.unlink()
        with live_socket(path):
            gateway.shutdown()
            await settled(lambda: not (places.data / STATE_FILE).exists(), "run() finished")
        nursery.cancel_scope.cancel()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


# -- the loopback TCP fallback ------------------------------------------------------------


async def test_fallback_any_free_port(places: Places, nursery: trio.Nursery) -> None:
    break_every_candidate(places)
    gateway = Gateway(settings_for(places, socket_dir=places.xdg))
    await nursery.start(gateway.run)
    port = gateway.ctx.local_tcp_port
    assert port
    assert listening(port) == {"127.0.0.1"}


async def test_second_gateway_on_the_same_data_dir_refused(places: Places,
                                                           nursery: trio.Nursery) -> None:
    break_every_candidate(places)
    first = Gateway(settings_for(places, socket_dir=places.xdg))
    await nursery.start(first.run)
    with pytest.raises(ListenerError, match="already running"):
        await Gateway(settings_for(places, socket_dir=places.xdg)).run()
    state = json.loads((places.data / STATE_FILE).read_text())
    assert state["localTcpPort"] == first.ctx.local_tcp_port


# -- the API server -----------------------------------------------------------------------

async def test_api_loopback_only_by_default(places: Places, nursery: trio.Nursery) -> None:
    gateway = Gateway(settings_for(places))
    await nursery.start(gateway.run)
    port = gateway.ctx.tcp_port
    assert port
    assert listening(port) == {"127.0.0.1"}
    assert not gateway.ctx.notifications.all()


async def test_api_disabled_means_no_tcp_listener(places: Places, nursery: trio.Nursery) -> None:
    port = free_port()
    gateway = Gateway(settings_for(places, enabled=False, port=port))
    await nursery.start(gateway.run)
    assert gateway.ctx.tcp_port is None
    assert listening(port) == set()
    assert gateway.ctx.socket_path is not None


async def test_api_configured_port(places: Places, nursery: trio.Nursery) -> None:
    port = free_port()
    gateway = Gateway(settings_for(places, port=port))
    await nursery.start(gateway.run)
    assert gateway.ctx.tcp_port == port
    assert listening(port) == {"127.0.0.1"}


def ipv6_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


async def test_external_access_binds_wildcards_and_warns_without_keys(
        places: Places, nursery: trio.Nursery) -> None:
    gateway = Gateway(settings_for(places, allow_external_access=True))
    await nursery.start(gateway.run)
    port = gateway.ctx.tcp_port
    assert port
    expected = {"0.0.0.0", "::"} if ipv6_works() else {"0.0.0.0"}
    assert listening(port) == expected
    [note] = gateway.ctx.notifications.all()
    assert note["code"] == "external_access_without_keys"
    assert "sluice keys create" in note["message"]
    # The loopback API is still reachable on the IPv4 wildcard socket.
    client = await Client.open(f"127.0.0.1:{port}")
    assert (await client.request("GET", "/health")).status == 200
    await client.aclose()


async def test_external_access_with_a_key_raises_no_notification(
        places: Places, nursery: trio.Nursery) -> None:
    settings = settings_for(places, allow_external_access=True)
    settings.keys.load([{"id": "k1", "name": "tablet", "hash": "0" * 64}])
    gateway = Gateway(settings)
    await nursery.start(gateway.run)
    assert not gateway.ctx.notifications.all()


async def test_api_port_taken_is_exit_2_and_socket_cleaned(places: Places) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ListenerError, match=f"127.0.0.1:{port}"):
            await Gateway(settings_for(places, port=port)).run()
    assert not (places.configured / SOCKET_NAME).exists()
