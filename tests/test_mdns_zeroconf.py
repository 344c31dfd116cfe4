"""protocol/lan/mdns.py and protocol/lan/dnssd.py against python-zeroconf's own packets.

Only zeroconf's packet classes are used (DNSOutgoing, DNSIncoming, the record classes and
ServiceInfo's record makers): no Zeroconf instance, no socket. zeroconf is a test dependency
(setup.cfg), so these tests run wherever the tests do.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from zeroconf import (
    DNSAddress,
    DNSIncoming,
    DNSOutgoing,
    DNSPointer,
    DNSQuestion,
    DNSRecord,
    DNSService,
    DNSText,
    ServiceInfo,
)

from protocol.lan import dnssd, mdns
from protocol.lan.dnssd import SERVICE, SERVICES_META, Announcement, Sighting

IN, UNIQUE = 1, 0x8000
PTR, TXT, SRV, A, AAAA, ANY = 12, 16, 33, 1, 28, 255
QUERY, RESPONSE = 0x0000, 0x8400
OURS = Announcement("Studio Mac", "studio.local.", 8600, "f1ng3r", "0.4.1",
                    ("192.168.0.7", "fe80::7"))
FULL = "Studio Mac._sluice._tcp.local."


def zc_info(instance: str = "Living Room", type_: str = SERVICE,
            properties: dict[str, Any] | None = None) -> ServiceInfo:
    props = {"fp": "abc", "v": "0.3"} if properties is None else properties
    return ServiceInfo(type_, f"{instance}.{type_}", port=8700, properties=props,
                       server="living.local.", parsed_addresses=["192.168.0.9", "fe80::9"])


def zc_broadcast(info: ServiceInfo, ttl: int | None = None) -> bytes:
    """What Zeroconf.register_service sends (its _add_broadcast_answer), made offline."""
    out = DNSOutgoing(RESPONSE)
    out.add_answer_at_time(info.dns_pointer(override_ttl=ttl), 0)
    out.add_answer_at_time(info.dns_service(override_ttl=ttl), 0)
    out.add_answer_at_time(info.dns_text(override_ttl=ttl), 0)
    for record in info.get_address_and_nsec_records(override_ttl=ttl):
        out.add_answer_at_time(record, 0)
    [packet] = out.packets()
    return packet


def zc_query(*questions: DNSQuestion, known: tuple[DNSRecord, ...] = (), id_: int = 0) -> bytes:
    out = DNSOutgoing(QUERY, True, id_)
    for q in questions:
        out.add_question(q)
    for record in known:
        out.add_answer_at_time(record, 0)
    [packet] = out.packets()
    return packet


def zc_parse(packet: bytes) -> DNSIncoming:
    incoming = DNSIncoming(packet)
    assert incoming.valid
    return incoming


def zc_view(r: DNSRecord) -> tuple[object, ...]:
    detail: object = None
    if isinstance(r, DNSPointer):
        detail = r.alias
    elif isinstance(r, DNSService):
        detail = (r.priority, r.weight, r.port, r.server)
    elif isinstance(r, DNSText):
        detail = r.text
    elif isinstance(r, DNSAddress):
        detail = str(ipaddress.ip_address(r.address))
    return (r.name, r.type, r.class_, r.unique, r.ttl, detail)


def our_view(r: mdns.Record) -> tuple[object, ...]:
    d = r.data
    detail: object = None
    if isinstance(d, mdns.Ptr):
        detail = d.target
    elif isinstance(d, mdns.Srv):
        detail = (d.priority, d.weight, d.port, d.target)
    elif isinstance(d, mdns.Txt):
        detail = b"".join(bytes((len(e),)) + e for e in d.entries) or b"\x00"
    elif isinstance(d, mdns.A | mdns.AAAA):
        detail = d.address
    return (r.name, r.rtype, IN, r.cache_flush, r.ttl, detail)


def our_records(ttl_ptr: int = 4500, ttl_host: int = 120) -> list[tuple[object, ...]]:
    return [
        (SERVICE, PTR, IN, False, ttl_ptr, FULL),
        (FULL, SRV, IN, True, ttl_host, (0, 0, 8600, "studio.local.")),
        (FULL, TXT, IN, True, ttl_ptr, b"\x09fp=f1ng3r\x07v=0.4.1"),
        ("studio.local.", A, IN, True, ttl_host, "192.168.0.7"),
        ("studio.local.", AAAA, IN, True, ttl_host, "fe80::7"),
        (SERVICES_META, PTR, IN, False, ttl_ptr, SERVICE),
    ]


# ---------------------------------------------------------------- zeroconf's packets, read by us


def test_sightings_reads_a_zeroconf_announcement() -> None:
    packet = zc_broadcast(zc_info(properties={"fp": "abc", "v": "0.3", "other": "x", "flag": None}))
    [seen] = dnssd.sightings(packet)
    addresses = [zc_view(r)[5] for r in zc_parse(packet).answers() if r.type in (A, AAAA)]
    assert seen == Sighting(
        "Living Room", "abc", "0.3", "living.local.", 8700, tuple(addresses), 4500)
    assert sorted(addresses) == ["192.168.0.9", "fe80::9"]


def test_our_decoder_agrees_with_zeroconfs() -> None:
    packet = zc_broadcast(zc_info())
    msg = mdns.decode(packet)
    assert msg.is_response
    ours = [our_view(r) for r in msg.answers + msg.additionals]
    theirs = [zc_view(r) for r in zc_parse(packet).answers()]
    assert ours == theirs
    assert sorted(r.rtype for r in msg.answers) == [A, PTR, TXT, AAAA, SRV]


def test_zeroconf_packets_survive_our_decode_and_encode() -> None:
    packet = zc_broadcast(zc_info())
    again = mdns.encode(mdns.decode(packet))
    assert [zc_view(r) for r in zc_parse(again).answers()] == \
        [zc_view(r) for r in zc_parse(packet).answers()]


def test_txt_keys_are_read_without_case() -> None:
    packet = zc_broadcast(zc_info(properties={"FP": "ABC", "V": "1.0", "fp": "ignored"}))
    [seen] = dnssd.sightings(packet)
    assert (seen.fingerprint, seen.version) == ("ABC", "1.0")


def test_a_zeroconf_service_without_fp_is_not_a_sighting() -> None:
    assert dnssd.sightings(zc_broadcast(zc_info(properties={"v": "0.3"}))) == []
    assert dnssd.sightings(zc_broadcast(zc_info(properties={}))) == []


def test_a_zeroconf_goodbye_is_a_sighting_with_ttl_zero() -> None:
    [gone] = dnssd.sightings(zc_broadcast(zc_info(), ttl=0))
    assert (gone.instance, gone.fingerprint, gone.ttl) == ("Living Room", "abc", 0)


def test_a_lone_goodbye_pointer_is_a_sighting_without_fingerprint() -> None:
    out = DNSOutgoing(RESPONSE)
    out.add_answer_at_time(zc_info().dns_pointer(override_ttl=0), 0)
    [gone] = dnssd.sightings(out.packets()[0])
    assert gone == Sighting("Living Room", "", "", "", 0, (), 0)


def test_a_zeroconf_answer_with_additionals_is_read() -> None:
    info = zc_info()
    out = DNSOutgoing(RESPONSE)
    out.add_answer_at_time(info.dns_pointer(), 0)
    for record in [info.dns_service(), info.dns_text(), *info.dns_addresses()]:
        out.add_additional_answer(record)
    [seen] = dnssd.sightings(out.packets()[0])
    assert (seen.host, seen.port, sorted(seen.addresses)) == ("living.local.", 8700,
                                                              ["192.168.0.9", "fe80::9"])


def test_other_services_are_ignored() -> None:
    http = zc_info(type_="_http._tcp.local.")
    assert dnssd.sightings(zc_broadcast(http)) == []
    query = zc_query(DNSQuestion("_http._tcp.local.", PTR, IN))
    assert dnssd.answer(query, OURS) is None
    assert dnssd.sightings(query) == []


def test_a_zeroconf_query_is_not_a_sighting() -> None:
    assert dnssd.sightings(zc_query(DNSQuestion(SERVICE, PTR, IN))) == []


# ---------------------------------------------------------------- our packets, read by zeroconf


def test_zeroconf_reads_our_announcement() -> None:
    incoming = zc_parse(dnssd.announce_packet(OURS))
    assert incoming.is_response()
    assert (incoming.flags, incoming.id) == (RESPONSE, 0)
    assert [zc_view(r) for r in incoming.answers()] == our_records()
    assert incoming.num_answers == 6


def test_zeroconf_reads_our_goodbye() -> None:
    incoming = zc_parse(dnssd.announce_packet(OURS, goodbye=True))
    assert [zc_view(r) for r in incoming.answers()] == our_records(0, 0)


def test_zeroconf_reads_our_query() -> None:
    known = [("a._sluice._tcp.local.", 4000), ("B b._sluice._tcp.local.", 10)]
    incoming = zc_parse(dnssd.query_packet(known))
    assert incoming.is_query()
    assert (incoming.flags, incoming.id) == (0, 0)
    assert incoming.questions == [DNSQuestion(SERVICE, PTR, IN)]
    assert not incoming.questions[0].unicast
    assert [zc_view(r) for r in incoming.answers()] == [
        (SERVICE, PTR, IN, False, ttl, name) for name, ttl in known]
    assert zc_parse(dnssd.query_packet(unicast=True)).questions[0].unicast


def test_zeroconf_query_for_our_service_is_answered() -> None:
    reply = dnssd.answer(zc_query(DNSQuestion(SERVICE, PTR, IN)), OURS)
    assert reply is not None
    incoming = zc_parse(reply)
    assert (incoming.flags, incoming.id) == (RESPONSE, 0)
    assert (incoming.num_answers, incoming.num_additionals) == (1, 4)
    assert [zc_view(r) for r in incoming.answers()] == our_records()[:5]
    # zeroconf's browser would take it as a service: the sighting reads back too
    [seen] = dnssd.sightings(reply)
    assert (seen.instance, seen.fingerprint, seen.port) == ("Studio Mac", "f1ng3r", 8600)


def test_zeroconf_qu_questions_for_each_of_our_names_are_answered() -> None:
    expected = {
        (FULL, SRV): ([1], [3, 4]), (FULL, TXT): ([2], []), (FULL, ANY): ([1, 2], [3, 4]),
        ("studio.local.", A): ([3], [4]), ("studio.local.", AAAA): ([4], [3]),
        ("STUDIO.local.", ANY): ([3, 4], []), (SERVICES_META, PTR): ([5], []),
        ("_SLUICE._tcp.local.", ANY): ([0], [1, 2, 3, 4]),
    }
    records = our_records()
    for (name, rtype), (answers, extra) in expected.items():
        question = DNSQuestion(name, rtype, IN | UNIQUE)
        reply = dnssd.answer(zc_query(question), OURS)
        assert reply is not None, (name, rtype)
        incoming = zc_parse(reply)
        assert incoming.num_answers == len(answers), (name, rtype)
        assert [zc_view(r) for r in incoming.answers()] == [records[i] for i in answers + extra]


def test_known_answers_from_zeroconf_suppress_ours() -> None:
    question = DNSQuestion(SERVICE, PTR, IN)
    fresh = DNSPointer(SERVICE, PTR, IN, 2300, FULL)  # over half of 4500 left
    assert dnssd.answer(zc_query(question, known=(fresh,)), OURS) is None
    stale = DNSPointer(SERVICE, PTR, IN, 2000, FULL)
    assert dnssd.answer(zc_query(question, known=(stale,)), OURS) is not None
    other = DNSPointer(SERVICE, PTR, IN, 4500, "Another._sluice._tcp.local.")
    assert dnssd.answer(zc_query(question, known=(other,)), OURS) is not None


def test_known_additionals_are_left_out() -> None:
    srv = DNSService(FULL, SRV, IN | UNIQUE, 120, 0, 0, 8600, "studio.local.")
    reply = dnssd.answer(zc_query(DNSQuestion(SERVICE, PTR, IN), known=(srv,)), OURS)
    assert reply is not None
    assert [zc_view(r)[1] for r in zc_parse(reply).answers()] == [PTR, TXT, A, AAAA]


def test_a_zeroconf_registration_query_is_answered() -> None:
    # Zeroconf.generate_service_query: a QU question for the type, the new PTR as authority
    for instance in ("Living Room", "Studio Mac"):
        out = DNSOutgoing(QUERY)
        out.add_question(DNSQuestion(SERVICE, PTR, IN | UNIQUE))
        out.add_authorative_answer(zc_info(instance).dns_pointer())
        reply = dnssd.answer(out.packets()[0], OURS)
        assert reply is not None
        assert zc_view(zc_parse(reply).answers()[0]) == our_records()[0]


def test_a_legacy_query_gets_its_id_questions_and_short_ttls() -> None:
    question = DNSQuestion(SERVICE, PTR, IN)
    reply = dnssd.answer(zc_query(question, id_=0x4242), OURS, legacy_id=0x4242)
    assert reply is not None
    incoming = zc_parse(reply)
    assert incoming.id == 0x4242
    assert incoming.questions == [question]
    views = [zc_view(r) for r in incoming.answers()]
    assert all(v[4] == 10 and v[3] is False for v in views)


def test_responses_and_junk_get_no_answer() -> None:
    assert dnssd.answer(dnssd.announce_packet(OURS), OURS) is None
    assert dnssd.answer(zc_broadcast(zc_info()), OURS) is None
    assert dnssd.answer(b"", OURS) is None
    assert dnssd.answer(b"\x00" * 12 + b"\x07_sluice", OURS) is None
