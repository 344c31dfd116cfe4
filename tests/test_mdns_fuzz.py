"""Any bytes at all: decode gives a Message or a MalformedPacket, sightings and answer never
raise. Random bytes, and cuts and mutations of real packets (ours and python-zeroconf's),
which get past the first checks and into the records."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zeroconf import DNSNsec, DNSOutgoing, DNSPointer, DNSQuestion, ServiceInfo

from protocol.lan import dnssd, mdns
from protocol.lan.dnssd import SERVICE, Announcement

OURS = Announcement("Studio Mac", "studio.local.", 8600, "f1ng3r", "0.4.1",
                    ("192.168.0.7", "fe80::7"))
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _zeroconf_packets() -> list[bytes]:
    info = ServiceInfo(SERVICE, f"Living Room.{SERVICE}", port=8700,
                       properties={"fp": "abc", "v": "0.3"}, server="living.local.",
                       parsed_addresses=["192.168.0.9", "fe80::9"])
    broadcast = DNSOutgoing(0x8400)
    for record in [info.dns_pointer(), info.dns_service(), info.dns_text(),
                   *info.get_address_and_nsec_records()]:
        broadcast.add_answer_at_time(record, 0)
    nsec = DNSOutgoing(0x8400)
    nsec.add_answer_at_time(info.dns_service(), 0)
    nsec.add_additional_answer(DNSNsec("living.local.", 47, 0x8001, 120, "living.local.", [1, 28]))
    query = DNSOutgoing(0)
    query.add_question(DNSQuestion(SERVICE, 12, 1))
    query.add_answer_at_time(DNSPointer(SERVICE, 12, 1, 4500, f"Other.{SERVICE}"), 0)
    return [out.packets()[0] for out in (broadcast, nsec, query)]


QUERY = dnssd.query_packet([("Another._sluice._tcp.local.", 100)])
PACKETS = [
    dnssd.announce_packet(OURS),
    dnssd.announce_packet(OURS, goodbye=True),
    QUERY,
    dnssd.answer(dnssd.query_packet(), OURS) or b"",
    *_zeroconf_packets(),
]
packets = st.sampled_from(PACKETS)


def check(data: bytes) -> None:
    """The three entry points on ``data``: only the allowed outcomes."""
    try:
        msg = mdns.decode(data)
    except mdns.MalformedPacket:
        pass
    else:
        assert isinstance(msg, mdns.Message)
    # the checks themselves are complete, not only decode's safety net
    try:
        mdns._decode(data)
    except mdns.MalformedPacket:
        pass
    found = dnssd.sightings(data)
    assert all(isinstance(s, dnssd.Sighting) for s in found)
    reply = dnssd.answer(data, OURS)
    assert reply is None or mdns.decode(reply).is_response
    legacy = dnssd.answer(data, OURS, legacy_id=7)
    assert legacy is None or mdns.decode(legacy).id == 7


def test_the_seed_packets_are_what_they_seem() -> None:
    assert all(PACKETS)
    assert dnssd.sightings(PACKETS[0])
    assert dnssd.sightings(PACKETS[4])
    assert dnssd.answer(QUERY, OURS) is not None
    assert dnssd.answer(PACKETS[6], OURS) is not None


def test_every_cut_of_every_packet() -> None:
    for packet in PACKETS:
        for cut in range(len(packet)):
            check(packet[:cut])


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(data: bytes) -> None:
    check(data)


@FUZZ
@given(st.tuples(*[st.integers(0, 3)] * 4), st.binary(max_size=400))
def test_random_bytes_after_a_plausible_header(counts: tuple[int, ...], body: bytes) -> None:
    head = bytes((0, 0, 0x84, 0)) + b"".join(c.to_bytes(2, "big") for c in counts)
    check(head + body)
    check(bytes(4) + head[4:] + body)


@pytest.mark.slow
@FUZZ
@given(packets, st.data())
def test_one_byte_changed(packet: bytes, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(packet) - 1))
    value = data.draw(st.integers(0, 255))
    check(packet[:at] + bytes((value,)) + packet[at + 1 :])


@pytest.mark.slow
@FUZZ
@given(packets, st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                         min_size=2, max_size=6))
def test_several_bytes_changed(packet: bytes, changes: list[tuple[int, int]]) -> None:
    mutable = bytearray(packet)
    for at, value in changes:
        mutable[at % len(mutable)] = value
    check(bytes(mutable))


@FUZZ
@given(packets, st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8))
def test_bytes_inserted_or_removed(packet: bytes, at: int, chunk: bytes) -> None:
    at %= len(packet)
    check(packet[:at] + chunk + packet[at:])
    check(packet[:at] + packet[at + len(chunk) :])


# ---------------------------------------------------------------- random messages round trip

_label = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20).filter(
    lambda s: len(s.encode()) <= mdns.MAX_LABEL)
_name = st.lists(_label, min_size=0, max_size=5).map(lambda parts: mdns.join(tuple(parts)))
_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(str)
_rdata = st.one_of(
    st.builds(mdns.Ptr, _name),
    st.builds(mdns.Srv, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF),
              st.integers(0, 0xFFFF), _name),
    st.builds(mdns.Txt, st.lists(st.binary(max_size=40), max_size=4).map(tuple).filter(
        lambda entries: entries != (b"",))),
    st.builds(mdns.A, _ipv4),
    st.builds(mdns.AAAA, _ipv6),
    st.builds(mdns.Opaque, st.just(47), st.binary(max_size=30)),
)
_types = {mdns.Ptr: mdns.PTR, mdns.Srv: mdns.SRV, mdns.Txt: mdns.TXT, mdns.A: mdns.TYPE_A,
          mdns.AAAA: mdns.TYPE_AAAA, mdns.Opaque: mdns.NSEC}
_record = st.builds(
    lambda name, ttl, data, flush: mdns.Record(name, _types[type(data)], ttl, data, flush),
    _name, st.integers(0, 0xFFFFFFFF), _rdata, st.booleans())
_message = st.builds(
    mdns.Message, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF),
    st.lists(st.builds(mdns.Question, _name, st.integers(0, 0xFFFF), st.booleans()),
             max_size=2).map(tuple),
    *[st.lists(_record, max_size=3).map(tuple)] * 3)


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(_message)
def test_random_messages_round_trip(msg: mdns.Message) -> None:
    try:
        wire = mdns.encode(msg)
    except ValueError:
        return  # a name over 255 bytes: refused, as it should be
    decoded = mdns.decode(wire)
    assert decoded == msg
    assert all(mdns.same_name(a.name, mdns.fold(b.name)) for a, b in
               zip(decoded.answers, msg.answers, strict=True))
    check(wire)
