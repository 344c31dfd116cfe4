"""LAN discovery's timing and bookkeeping (SPEC §14) on trio's MockClock, through a fake
link (:class:`FakeLink`: what is sent is recorded with the clock's time, packets come in
through a channel), so nothing here reaches a network: the announce schedule and the
goodbyes, answers to queries, the query schedule, the registry (2 minutes unseen
forgets, a goodbye removes at once, itself never listed, ``added``), the ``discovered``
events, interfaces that come and go, and packets from off the link."""

from __future__ import annotations

import dataclasses
import itertools
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from protocol.lan.discovered import FORGET_AFTER, Discovered
from protocol.lan.dnssd import MDNS_GROUP, Announcement, announce_packet, query_packet, sightings
from proxy.lan.discovery.announcer import ANSWER_DELAY
from proxy.lan.discovery.link import GROUP, Source
from proxy.lan.discovery.service import RELIST, Discovery, Me
from proxy.lan.interfaces import Interface
from proxy.lan.own_host import OwnHost

ETH0 = Interface("eth0", 2, socket.AF_INET, "10.1.0.2", 24, True, False, True)
WLAN = Interface("wlan0", 3, socket.AF_INET, "10.2.0.2", 24, True, False, True)
LOOP = Interface("lo", 1, socket.AF_INET, "127.0.0.1", 8, True, True, False)
V6 = Interface("eth0", 2, socket.AF_INET6, "fe80::2", 64, True, False, True)
ME = Me("here", "node-here", "1.2.3", 39080)
PEER = Announcement(instance="studio", host="studio.local.", port=39081,
                    fingerprint="node-studio", version="9.9", addresses=("10.1.0.7",))
PEER_AT: Source = ("10.1.0.7", 5353)


@attrs.define
class Sent:
    at: float
    data: bytes
    interface: str  # its address
    to: Source


class FakeLink:
    """A :class:`proxy.lan.discovery.link.Link` that sends nowhere."""

    def __init__(self, interfaces: list[Interface]) -> None:
        self.all = interfaces
        self.joined: list[str] = []
        self.left: list[str] = []
        self.sent: list[Sent] = []
        self.inbox_send, self.inbox = trio.open_memory_channel[tuple[bytes, Source]](100)
        self.closed = False

    def interfaces(self) -> list[Interface]:
        return list(self.all)

    def join(self, interface: Interface) -> None:
        self.joined.append(interface.address)

    def leave(self, interface: Interface) -> None:
        self.left.append(interface.address)

    async def send(self, data: bytes, interface: Interface, to: Source = GROUP) -> None:
        self.sent.append(Sent(trio.current_time(), data, interface.address, to))

    async def receive(self) -> tuple[bytes, Source]:
        return await self.inbox.receive()

    def close(self) -> None:
        self.closed = True

    def deliver(self, data: bytes, source: Source) -> None:
        self.inbox_send.send_nowait((data, source))

    def queries(self) -> list[Sent]:
        return [s for s in self.sent if not sightings(s.data)]

    def announcements(self) -> list[Sent]:
        return [s for s in self.sent if sightings(s.data)]


@attrs.define
class Running:
    link: FakeLink
    service: Discovery
    scope: trio.CancelScope
    events: list[list[dict[str, Any]]]
    configured: set[str]
    own_host: OwnHost


@pytest.fixture
async def running(nursery: trio.Nursery) -> AsyncIterator[Any]:
    """``start(announce, browse, interfaces)``: a service on a fake link, in a scope the test
    may cancel."""
    started: list[Running] = []

    async def start(announce: bool, browse: bool,
                    interfaces: list[Interface] | None = None) -> Running:
        link = FakeLink([ETH0, LOOP, V6] if interfaces is None else interfaces)
        events: list[list[dict[str, Any]]] = []
        configured: set[str] = set()
        own_host = OwnHost()
        service = Discovery(link, ME, publish=events.append, configured=lambda: configured,
                            own_host=own_host, rng=random.Random(7))
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await service.run(task_status=task_status)

        await nursery.start(run)
        service.set_modes(announce, browse)
        await trio.testing.wait_all_tasks_blocked()
        run_ = Running(link, service, scope, events, configured, own_host)
        started.append(run_)
        return run_

    yield start
    for run_ in started:
        run_.scope.cancel()


def since(sent: list[Sent], t0: float) -> list[float]:
    return [round(s.at - t0, 3) for s in sent]


# ------------------------------------------------------------------------------ announcing


async def test_announces_three_times_a_second_apart_then_rests_and_says_goodbye(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    t0 = trio.current_time()
    r = await running(True, False)
    assert r.link.joined == [ETH0.address]  # IPv4, up, multicast, not loopback
    await trio.sleep(300)
    announced = r.link.announcements()
    assert since(announced, t0) == [0.0, 1.0, 2.0]
    assert {(s.interface, s.to) for s in announced} == {(ETH0.address, (MDNS_GROUP, 5353))}
    (me,) = sightings(announced[0].data)
    assert (me.instance, me.fingerprint, me.version, me.port, me.addresses, me.host) == (
        "here", "node-here", "1.2.3", 39080, (ETH0.address,), "here.local.")
    assert me.ttl > 0
    assert r.link.queries() == []  # not browsing: no query
    r.service.set_modes(False, False)  # switched off
    await trio.testing.wait_all_tasks_blocked()
    last = r.link.sent[-1]
    (bye,) = sightings(last.data)
    assert (bye.fingerprint, bye.ttl, last.at) == ("node-here", 0, trio.current_time())
    count = len(r.link.sent)
    await trio.sleep(100)
    assert len(r.link.sent) == count  # nothing after the goodbye


async def test_cancelled_service_says_goodbye_and_withdraw_comes_first(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(True, True)
    await trio.sleep(10)
    await r.service.withdraw()  # the gateway drains
    assert sightings(r.link.sent[-1].data)[0].ttl == 0
    goodbyes = len(r.link.sent)
    r.scope.cancel()
    await trio.testing.wait_all_tasks_blocked()
    assert len([s for s in r.link.sent if any(x.ttl == 0 for x in sightings(s.data))]) == 1
    assert len(r.link.sent) == goodbyes  # once

    other = await running(True, False)
    await trio.sleep(1.5)
    other.scope.cancel()  # cancelled from outside (the gateway stops at once)
    await trio.testing.wait_all_tasks_blocked()
    assert sightings(other.link.sent[-1].data)[0].ttl == 0


async def test_answers_queries_about_it_after_a_short_random_delay(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(True, False)
    await trio.sleep(10)
    before = len(r.link.sent)
    t = trio.current_time()
    r.link.deliver(query_packet(), ("10.1.0.9", 5353))
    await trio.sleep(1)
    (reply,) = r.link.sent[before:]
    assert ANSWER_DELAY[0] <= reply.at - t <= ANSWER_DELAY[1]
    assert (reply.to, reply.interface) == (GROUP, ETH0.address)
    assert sightings(reply.data)[0].fingerprint == "node-here"
    # An asker that knows us already (known answer, more than half the TTL left): silence.
    (full,) = [s for s in sightings(reply.data)]
    r.link.deliver(query_packet([("here._sluice._tcp.local.", 4500)]), ("10.1.0.9", 5353))
    await trio.sleep(1)
    assert len(r.link.sent) == before + 1
    # A legacy resolver (not port 5353) is answered on its own port, at once.
    r.link.deliver(query_packet(), ("10.1.0.9", 40000))
    await trio.sleep(1)
    assert r.link.sent[-1].to == ("10.1.0.9", 40000)
    # A flood of queries: one answer waiting per interface.
    count = len(r.link.sent)
    for _ in range(20):
        r.link.deliver(query_packet(), ("10.1.0.9", 5353))
    await trio.sleep(1)
    assert len(r.link.sent) == count + 1
    assert full.port == 39080


async def test_packets_from_off_the_link_are_ignored(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(True, True)
    await trio.sleep(10)
    before = len(r.link.sent)
    r.link.deliver(query_packet(), ("192.168.77.5", 5353))
    r.link.deliver(announce_packet(PEER), ("192.168.77.5", 5353))
    await trio.sleep(1)
    assert len(r.link.sent) == before
    assert r.service.computers() == []


# ------------------------------------------------------------------------------ browsing


async def test_query_schedule_doubles_from_one_second_up_to_sixty(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    t0 = trio.current_time()
    r = await running(False, True)
    await trio.sleep(300)
    times = since(r.link.queries(), t0)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    assert times[0] == 0.0
    assert gaps == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0][:len(gaps)]
    assert len(gaps) >= 9
    assert r.link.announcements() == []  # browsing only: never announces


async def test_a_computer_is_listed_then_forgotten_after_two_minutes(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(False, True)
    r.link.deliver(announce_packet(PEER), PEER_AT)
    await trio.testing.wait_all_tasks_blocked()
    seen = trio.current_time()
    entry = {"fingerprint": "node-studio", "name": "studio",
             "baseUrl": "http://10.1.0.7:39081", "version": "9.9", "added": False}
    assert r.service.computers() == [entry]
    assert r.events == [[entry]]
    # Known and fresh: the next queries carry it as a known answer.
    await trio.sleep(1.5)
    assert b"studio" in r.link.queries()[-1].data
    await trio.sleep_until(seen + FORGET_AFTER - 0.5)
    assert r.service.computers() == [entry]
    await trio.sleep_until(seen + FORGET_AFTER + 0.01)
    assert r.service.computers() == []
    assert r.events == [[entry], []]
    # Seen again: listed again; ``added`` follows the config's nodes.
    r.configured.add("node-studio")
    r.link.deliver(announce_packet(PEER), PEER_AT)
    await trio.testing.wait_all_tasks_blocked()
    assert r.service.computers() == [{**entry, "added": True}]
    assert r.events[-1] == [{**entry, "added": True}]


async def test_a_goodbye_removes_at_once_and_itself_is_never_listed(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(True, True)
    r.link.deliver(announce_packet(PEER), PEER_AT)
    mine = Announcement(instance="here", host="here.local.", port=39080,
                        fingerprint="node-here", version="1.2.3", addresses=("10.1.0.2",))
    r.link.deliver(announce_packet(mine), ("10.1.0.2", 5353))  # our own, looped back
    await trio.testing.wait_all_tasks_blocked()
    assert [c["fingerprint"] for c in r.service.computers()] == ["node-studio"]
    await trio.sleep(5)
    r.link.deliver(announce_packet(PEER, goodbye=True), PEER_AT)
    await trio.testing.wait_all_tasks_blocked()
    assert r.service.computers() == []
    assert r.events[-1] == []
    r.service.set_modes(True, False)  # browsing off: the list is empty, and stays so
    r.link.deliver(announce_packet(PEER), PEER_AT)
    await trio.testing.wait_all_tasks_blocked()
    assert r.service.computers() == []


async def test_browsing_off_empties_the_list(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(False, True)
    r.link.deliver(announce_packet(PEER), PEER_AT)
    await trio.testing.wait_all_tasks_blocked()
    assert len(r.service.computers()) == 1
    r.service.set_modes(False, False)
    await trio.testing.wait_all_tasks_blocked()
    assert r.service.computers() == []
    assert r.events[-1] == []


# ------------------------------------------------------------------------------ interfaces


async def test_interfaces_that_come_and_go_are_followed(
        autojump_clock: trio.testing.MockClock, running: Any) -> None:
    r = await running(True, True)
    t0 = trio.current_time()
    assert r.own_host.allows(b"10.1.0.2:39080")  # the listing fed the Host guard too
    assert not r.own_host.allows(b"10.2.0.2")
    r.link.all.append(WLAN)
    await trio.sleep(RELIST + 0.5)
    assert r.link.joined == [ETH0.address, WLAN.address]
    assert r.own_host.allows(b"10.2.0.2")
    on_wlan = [s for s in r.link.sent if s.interface == WLAN.address]
    assert len([s for s in on_wlan if sightings(s.data)]) == 1  # first of its three
    assert any(not sightings(s.data) for s in on_wlan)  # a query there at once
    await trio.sleep(3)
    assert len([s for s in r.link.sent if s.interface == WLAN.address
                and sightings(s.data)]) == 3
    r.link.all.remove(ETH0)
    await trio.sleep(RELIST)
    assert r.link.left == [ETH0.address]
    count = len([s for s in r.link.sent if s.interface == ETH0.address])
    await trio.sleep(200)
    assert len([s for s in r.link.sent if s.interface == ETH0.address]) == count
    assert trio.current_time() - t0 > 200


def test_registry_rules_without_a_clock() -> None:
    reg = Discovered("node-here")
    peer = sightings(announce_packet(PEER))[0]
    assert reg.seen(peer, "10.1.0.7", 0.0)
    assert not reg.seen(peer, "10.1.0.7", 1.0)  # the same again: no change
    assert reg.next_expiry() == 1.0 + FORGET_AFTER
    # Relayed by somebody else: the address it lists wins over the packet's source.
    assert reg.entries(())[0]["baseUrl"] == "http://10.1.0.7:39081"
    moved = dataclasses.replace(peer, addresses=("10.1.0.8",))
    assert reg.seen(moved, "10.1.0.99", 2.0)
    assert reg.entries(())[0]["baseUrl"] == "http://10.1.0.8:39081"
    assert reg.known_answers(3.0) == [("studio", peer.ttl - 1)]
    assert reg.known_answers(30.0) == []  # not fresh: it must answer again
    assert not reg.seen(dataclasses.replace(peer, fingerprint="bad fp!"), "10.1.0.7", 3.0)
    assert not reg.seen(dataclasses.replace(peer, fingerprint="node-here"), "10.1.0.7", 3.0)
    assert not reg.expire(2.0 + FORGET_AFTER - 0.1)
    assert reg.expire(2.0 + FORGET_AFTER)
    assert len(reg) == 0
    # A goodbye without a fingerprint: that instance at that address.
    reg.seen(peer, "10.1.0.7", 0.0)
    assert not reg.seen(dataclasses.replace(peer, fingerprint="", ttl=0), "10.1.0.50", 1.0)
    assert reg.seen(dataclasses.replace(peer, fingerprint="", ttl=0), "10.1.0.7", 1.0)
    assert len(reg) == 0
