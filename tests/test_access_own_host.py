"""The Host guard's own-address rule (SPEC §14): with external access, a ``Host`` that is
one of this computer's addresses or ``<its name>.local`` passes like ``localhost``; without
it nothing changes. The pure rule, the cache (refreshed at most every few seconds, on the
MockClock), and a real listener."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from protocol.rebinding import normal_address, own_host
from proxy.lan import own_host as own_host_module
from proxy.lan.interfaces import Interface, list_interfaces
from proxy.lan.own_host import REFRESH, OwnHost, short_hostname
from tests.client import raw, request
from tests.conftest import StartGateway
from tests.test_access import get

OURS = frozenset({"10.0.0.5", "fe80::1", "fd00::5", "127.0.0.1"})


@pytest.mark.parametrize(("host", "ok"), [
    (b"10.0.0.5", True), (b"10.0.0.5:39080", True), (b"[fd00::5]:39080", True),
    (b"[FD00:0::5]", True), (b"[fe80::1%25eth0]:39080", True), (b"[::ffff:10.0.0.5]", True),
    (b"studio.local", True), (b"STUDIO.Local.:39080", True),
    (b"10.0.0.6", False), (b"fd00::5", False), (b"[10.0.0.5]", False),
    (b"studio", False), (b"studio.local.evil.example", False), (b"other.local", False),
    (b"10.0.0.5.nip.io", False), (b"user@10.0.0.5", False), (b"10.0.0.5:x", False),
    (b"", False), (b":39080", False), (b"\xff", False), (b"010.000.000.005", False),
])
def test_own_host_rule(host: bytes, ok: bool) -> None:
    assert own_host(host, OURS, "Studio") is ok


def test_no_host_name_matches_no_name() -> None:
    assert not own_host(b".local", OURS, "")
    assert normal_address("::FFFF:10.0.0.5") == "10.0.0.5"
    assert normal_address("studio") is None


def test_the_listing_reads_real_interfaces() -> None:
    everything = list_interfaces()
    assert any(i.loopback and i.address == "127.0.0.1" for i in everything)
    assert all(i.family in (socket.AF_INET, socket.AF_INET6) for i in everything)
    assert all(0 <= i.prefix <= 128 for i in everything)


async def test_the_cache_lists_at_most_every_few_seconds(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = [Interface("eth0", 2, socket.AF_INET, "10.0.0.5", 24, True, False, True)]
    import proxy.lan.interfaces

    monkeypatch.setattr(proxy.lan.interfaces, "list_interfaces", lambda: list(listing))
    cache = OwnHost()
    assert cache.allows(b"10.0.0.5:39080")
    assert cache.allows(f"{short_hostname()}.local".encode())
    assert not cache.allows(b"10.0.0.9")
    assert cache.lists == 1  # three asks, one listing
    listing.append(Interface("eth1", 3, socket.AF_INET, "10.0.0.9", 24, True, False, True))
    await trio.sleep(REFRESH - 0.1)
    assert not cache.allows(b"10.0.0.9")
    await trio.sleep(0.2)
    assert cache.allows(b"10.0.0.9")
    assert cache.lists == 2
    assert own_host_module.REFRESH == REFRESH


def _lan_address() -> str | None:
    return next((i.address for i in list_interfaces()
                 if i.family == socket.AF_INET and not i.loopback and i.up), None)


@pytest.mark.parametrize("external", [True, False])
async def test_a_real_listener_takes_its_own_address_as_host(
        start_gateway: StartGateway, external: bool) -> None:
    address = _lan_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    gw = await start_gateway([], allow_external_access=external)
    expected = 200 if external else 403
    for host in (f"{address}:{gw.gateway.ctx.tcp_port}", address,
                 f"{short_hostname()}.local"):
        reply = await raw(gw.tcp, get(host.encode()))
        assert reply.status == expected, (host, reply.body)
    assert (await raw(gw.tcp, get(b"evil.example"))).status == 403
    assert (await request(gw.tcp, "GET", "/health")).status == 200  # localhost as before
