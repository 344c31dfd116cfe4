"""protocol/lan/mdns.py: DNS messages to bytes and back, names, and every way a packet can lie."""

from __future__ import annotations

import struct

import pytest

from protocol.lan import dnssd, mdns
from protocol.lan.mdns import (
    AAAA,
    ANY,
    NSEC,
    PTR,
    SRV,
    TXT,
    TYPE_A,
    TYPE_AAAA,
    A,
    MalformedPacket,
    Message,
    Opaque,
    Ptr,
    Question,
    Record,
    Srv,
    Txt,
)

FULL = "My Mac._sluice._tcp.local."
RECORDS = [
    Record("_sluice._tcp.local.", PTR, 4500, Ptr(FULL)),
    Record(FULL, SRV, 120, Srv(1, 2, 8080, "studio.local."), cache_flush=True),
    Record(FULL, TXT, 4500, Txt((b"fp=abc", b"v=1.2.3", b"flag", b"bin=\x00\xff"))),
    Record(FULL, TXT, 4500, Txt(())),
    Record("studio.local.", TYPE_A, 120, A("192.168.1.20"), cache_flush=True),
    Record("studio.local.", TYPE_AAAA, 120, AAAA("fe80::1:2"), cache_flush=True),
    Record("studio.local.", TYPE_AAAA, 120, AAAA("2001:db8::ff")),
    Record("studio.local.", NSEC, 120, Opaque(NSEC, b"\xc0\x0c\x00\x04@\x00\x00\x08")),
    Record("studio.local.", 99, 7, Opaque(99, b"")),
]


def header(qd: int = 0, an: int = 0, ns: int = 0, ar: int = 0, flags: int = 0x8400) -> bytes:
    return struct.pack("!6H", 0, flags, qd, an, ns, ar)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"type{r.rtype}")
def test_each_record_type_round_trips(record: Record) -> None:
    for section in ("answers", "authorities", "additionals"):
        msg = Message(flags=0x8400, **{section: (record,)})
        assert mdns.decode(mdns.encode(msg)) == msg


def test_a_whole_message_round_trips() -> None:
    msg = Message(
        id=0x1234, flags=0x0100,
        questions=(Question(FULL, ANY), Question("studio.local.", TYPE_A, unicast=True)),
        answers=tuple(RECORDS[:3]), authorities=tuple(RECORDS[3:5]),
        additionals=tuple(RECORDS[5:]),
    )
    out = mdns.decode(mdns.encode(msg))
    assert out == msg
    assert not out.is_response
    assert mdns.decode(mdns.encode(Message(flags=0x8400))).is_response


def test_a_txt_of_one_empty_string_is_no_strings() -> None:
    wire = mdns.encode(Message(answers=(Record("x.local.", TXT, 1, Txt(())),)))
    assert wire.endswith(b"\x00\x01\x00")  # rdlength 1, one zero byte (RFC 6763 §6.1)
    sent = Message(answers=(Record("x.local.", TXT, 1, Txt((b"",))),))
    assert mdns.decode(mdns.encode(sent)).answers[0].data == Txt(())


def test_names_are_compressed() -> None:
    names = [f"host{i}._sluice._tcp.local." for i in range(5)]
    msg = Message(flags=0x8400, answers=tuple(
        Record("_sluice._tcp.local.", PTR, 4500, Ptr(n)) for n in names))
    wire = mdns.encode(msg)
    # Written out, each record's two names would take their whole length.
    plain = 12 + sum(len(mdns.encode(Message(answers=(r,)))) - 12 for r in msg.answers)
    assert len(wire) < plain - 60
    assert wire.count(b"\x07_sluice") == 1
    assert wire.count(b"\x05local") == 1
    assert b"\xc0\x0c" in wire  # a pointer to the first name, just after the header
    assert mdns.decode(wire) == msg


def test_compression_keeps_the_case_of_each_name() -> None:
    msg = Message(answers=(Record("a.Local.", TYPE_A, 1, A("1.2.3.4")),
                           Record("b.local.", TYPE_A, 1, A("1.2.3.5"))))
    assert [r.name for r in mdns.decode(mdns.encode(msg)).answers] == ["a.Local.", "b.local."]


def test_srv_and_ptr_targets_point_at_earlier_names() -> None:
    msg = Message(answers=(Record("studio.local.", TYPE_A, 1, A("1.2.3.4")),
                           Record(FULL, SRV, 1, Srv(0, 0, 1, "studio.local."))))
    wire = mdns.encode(msg)
    assert wire.count(b"\x06studio") == 1
    assert mdns.decode(wire) == msg


def test_labels_and_join_escape_dots_and_backslashes() -> None:
    assert mdns.labels("a\\.b.c\\\\d.local.") == ("a.b", "c\\d", "local")
    assert mdns.join(("a.b", "c\\d", "local")) == "a\\.b.c\\\\d.local."
    assert mdns.labels("studio.local") == mdns.labels("studio.local.") == ("studio", "local")
    assert mdns.labels(".") == mdns.labels("") == ()
    assert mdns.join(()) == "."
    for parts in [("My Mac", "local"), ("x.", "\\", ".", "é ü"), ("\\.",)]:
        assert mdns.labels(mdns.join(parts)) == parts
    for bad in ("a..b.", ".a.", "a\\"):
        with pytest.raises(ValueError, match=r"label|backslash"):
            mdns.labels(bad)


def test_a_dot_inside_a_label_travels_as_one_label() -> None:
    name = "v1\\.2 box._sluice._tcp.local."
    wire = mdns.encode(Message(questions=(Question(name, SRV),)))
    assert b"\x08v1.2 box\x07_sluice" in wire
    assert mdns.decode(wire).questions[0].name == name
    backslash = mdns.encode(Message(questions=(Question("a\\\\b.local.", SRV),)))
    assert b"\x03a\\b\x05local" in backslash
    assert mdns.decode(backslash).questions[0].name == "a\\\\b.local."


def test_utf8_labels_round_trip() -> None:
    name = "Büro Mac 日本._sluice._tcp.local."
    wire = mdns.encode(Message(questions=(Question(name, PTR),)))
    assert "Büro Mac 日本".encode() in wire
    assert mdns.decode(wire).questions[0].name == name


def test_names_compare_without_ascii_case() -> None:
    assert mdns.same_name("Studio._SLUICE._tcp.Local.", "studio._sluice._tcp.local.")
    assert mdns.same_name("studio.local", "STUDIO.local.")
    assert not mdns.same_name("studio.local.", "studio2.local.")
    assert not mdns.same_name("É.local.", "é.local.")  # only ASCII letters fold
    assert not mdns.same_name("a\\.b.local.", "a.b.local.")
    assert not mdns.same_name("a..b", "a.b")
    assert mdns.fold("AbC É") == "abc É"


def test_compressed_names_still_compare_without_case() -> None:
    wire = mdns.encode(Message(answers=(Record("_SLUICE._tcp.LOCAL.", PTR, 1, Ptr(FULL)),)))
    got = mdns.decode(wire).answers[0]
    assert mdns.same_name(got.name, "_sluice._tcp.local.")


@pytest.mark.parametrize(("name", "ok"), [
    ("x" * 63 + ".local.", True),
    ("x" * 64 + ".local.", False),
    (".".join(["y" * 63] * 3) + "." + "z" * 61 + ".", True),  # 255 bytes on the wire
    (".".join(["y" * 63] * 3) + "." + "z" * 62 + ".", False),  # 256
    ("é" * 32 + ".local.", False),  # 64 bytes of UTF-8
])
def test_encode_refuses_labels_and_names_too_long(name: str, ok: bool) -> None:
    msg = Message(questions=(Question(name, PTR),))
    if ok:
        assert mdns.decode(mdns.encode(msg)) == msg
    else:
        with pytest.raises(ValueError, match="longer than"):
            mdns.encode(msg)


@pytest.mark.parametrize("data", [
    A("1.2.3"), A("::1"), AAAA("1.2.3.4"), AAAA("fe80::zz"), Txt((b"x" * 256,)),
])
def test_encode_refuses_rdata_that_cannot_be_sent(data: mdns.RData) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - ipaddress's messages vary
        mdns.encode(Message(answers=(Record("x.local.", TYPE_A, 1, data),)))


def test_an_ipv6_scope_is_not_sent() -> None:
    wire = mdns.encode(Message(answers=(Record("x.local.", TYPE_AAAA, 1, AAAA("fe80::1%eth0")),)))
    assert mdns.decode(wire).answers[0].data == AAAA("fe80::1")


# ---------------------------------------------------------------- malformed packets

def _bad(data: bytes, match: str) -> None:
    with pytest.raises(MalformedPacket, match=match):
        mdns.decode(data)


def test_every_truncation_is_malformed() -> None:
    msg = Message(flags=0x8400, questions=(Question(FULL, ANY),), answers=tuple(RECORDS))
    wire = mdns.encode(msg)
    for cut in range(len(wire)):
        with pytest.raises(MalformedPacket):
            mdns.decode(wire[:cut])


def test_trailing_bytes_are_ignored() -> None:
    msg = Message(answers=(RECORDS[0],))
    assert mdns.decode(mdns.encode(msg) + b"\xff" * 9) == msg


def test_a_pointer_to_itself_is_malformed() -> None:
    _bad(header(qd=1) + b"\xc0\x0c" + b"\x00\x0c\x00\x01", "point back")


def test_a_pointer_loop_through_a_label_is_malformed() -> None:
    _bad(header(qd=1) + b"\x01a\xc0\x0c" + b"\x00\x0c\x00\x01", "point back")


def test_pointer_loops_across_names_are_malformed() -> None:
    # name 2 points at name 1, whose label is followed by a pointer to name 2
    data = header(qd=2) + b"\x01a\xc0\x14\x00\x0c\x00\x01" + b"\xc0\x0c\x00\x0c\x00\x01"
    _bad(data, "point back")


@pytest.mark.parametrize("target", [0x000, 0x00B, 0x0FF, 0x3FFF])
def test_pointers_into_the_header_forward_or_out_of_range_are_malformed(target: int) -> None:
    _bad(header(qd=1) + struct.pack("!H", 0xC000 | target) + b"\x00\x0c\x00\x01" + b"\x00" * 300,
         "point back")


def test_a_pointer_cut_in_half_is_malformed() -> None:
    _bad(header(qd=1) + b"\x01a\xc0", r"counts|cut short|past the end")


def test_a_long_chain_of_pointers_is_malformed() -> None:
    data = bytearray(header(qd=80)) + b"\x00\x00\x0c\x00\x01"  # the root, then pointers to it
    for i in range(1, 80):
        data += struct.pack("!H", 0xC000 | (12 + 5 + (i - 2) * 6 if i > 1 else 12))
        data += b"\x00\x0c\x00\x01"
    _bad(bytes(data), "too many compression pointers")
    short = bytes(data[: 12 + 5 + 9 * 6])
    assert len(mdns.decode(header(qd=10) + short[12:]).questions) == 10


@pytest.mark.parametrize("length", [0x40, 0x7F, 0x80, 0xBF])
def test_label_lengths_over_63_are_malformed(length: int) -> None:
    _bad(header(qd=1) + bytes((length,)) + b"x" * length + b"\x00\x00\x0c\x00\x01", "over 63")


def test_a_name_over_255_bytes_is_malformed() -> None:
    name = (b"\x3f" + b"y" * 63) * 4 + b"\x00"  # 257 bytes
    _bad(header(qd=1) + name + b"\x00\x0c\x00\x01", "longer than 255")


def test_a_name_over_255_bytes_through_pointers_is_malformed() -> None:
    first = (b"\x3f" + b"y" * 63) * 3 + b"\x00"  # 193 bytes
    second = b"\x3f" + b"z" * 63 + b"\xc0\x0c"  # 64 more: 257
    _bad(header(qd=2) + first + b"\x00\x0c\x00\x01" + second + b"\x00\x0c\x00\x01",
         "longer than 255")


@pytest.mark.parametrize("counts", [(2, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 1), (0, 60000, 0, 0),
                                    (65535, 65535, 65535, 65535)])
def test_counts_larger_than_the_data_are_malformed(counts: tuple[int, int, int, int]) -> None:
    _bad(header(*counts) + b"\x00\x00\x0c\x00\x01", "counts larger")


def test_a_short_header_is_malformed() -> None:
    for cut in range(12):
        _bad(header()[:cut], "header")


def _one_record(rtype: int, rdata: bytes, rdlength: int | None = None) -> bytes:
    size = len(rdata) if rdlength is None else rdlength
    return header(an=1) + b"\x01x\x00" + struct.pack("!HHIH", rtype, 1, 1, size) + rdata


def test_rdlength_overrunning_the_packet_is_malformed() -> None:
    _bad(_one_record(TXT, b"\x03abc", rdlength=9), "rdata runs past")


@pytest.mark.parametrize(("rtype", "rdata", "match"), [
    (TYPE_A, b"\x01\x02\x03", "A record of 3"),
    (TYPE_A, b"\x01\x02\x03\x04\x05", "A record of 5"),
    (TYPE_AAAA, b"\x00" * 15, "AAAA record of 15"),
    (SRV, b"\x00\x00\x00\x00\x00\x50", "too short"),
    (SRV, b"\x00" * 6 + b"\x01a\x00\x00", "does not fill"),
    (PTR, b"\x01a\x00\x00", "does not fill"),
    (PTR, b"\x01a", r"past the end|does not fill"),
    (PTR, b"\x05a", "past the end"),
    (TXT, b"\x05abc", "TXT string runs past"),
])
def test_bad_rdata_is_malformed(rtype: int, rdata: bytes, match: str) -> None:
    _bad(_one_record(rtype, rdata), match)


def test_a_ptr_name_may_not_run_past_its_rdata() -> None:
    # rdlength says 2, but the name's labels go on into the next record's bytes
    data = header(an=1) + b"\x01x\x00" + struct.pack("!HHIH", PTR, 1, 1, 2) + b"\x01a\x00"
    _bad(data, "does not fill")


def test_bad_utf8_is_replaced_not_raised() -> None:
    got = mdns.decode(header(qd=1) + b"\x02\xff\xfe\x05local\x00\x00\x0c\x00\x01")
    assert got.questions[0].name == "\ufffd\ufffd.local."


def test_decode_takes_bytearray_and_memoryview() -> None:
    wire = mdns.encode(Message(answers=(RECORDS[1],)))
    assert mdns.decode(bytearray(wire)) == mdns.decode(memoryview(wire)) == mdns.decode(wire)


def test_numbers_out_of_range_are_value_errors() -> None:
    for msg in (Message(id=1 << 16),
                Message(answers=(Record("x.", SRV, 1, Srv(0, 0, 70000, "y.")),)),
                Message(answers=(Record("x.", TYPE_A, -1, A("1.2.3.4")),))):
        with pytest.raises(ValueError, match=r"format requires|argument out of range"):
            mdns.encode(msg)


# ---------------------------------------------------------------- dnssd's own edges

def test_an_announcement_that_cannot_be_sent() -> None:
    for bad in (dnssd.Announcement("x", "x.local.", 70000, "f", "v"),
                dnssd.Announcement("x" * 64, "x.local.", 1, "f", "v"),
                dnssd.Announcement("x", "x.local.", 1, "f", "v", ("300.1.1.1",))):
        with pytest.raises(ValueError):  # noqa: PT011 - struct's, ipaddress's or ours
            dnssd.announce_packet(bad)
        assert dnssd.answer(dnssd.query_packet(), bad) is None


def test_an_instance_name_with_a_dot_is_one_label() -> None:
    ours = dnssd.Announcement("v1.2 box", "box.local.", 1, "f", "v")
    assert dnssd.instance_name("v1.2 box") == "v1\\.2 box._sluice._tcp.local."
    [seen] = dnssd.sightings(dnssd.announce_packet(ours))
    assert seen.instance == "v1.2 box"


def test_the_identity_and_node_port_travel_in_the_txt_record() -> None:
    """SPEC §16: ``id=<pin>`` and ``tls=<node port>`` beside ``fp`` and ``v``; a TXT
    without them, or with a ``tls`` that is no port, reads as none."""
    pin = "sha256:" + "ab" * 32
    ours = dnssd.Announcement("box", "box.local.", 39080, "node-box", "1", ("10.0.0.1",),
                              identity=pin, node_port=39443)
    [seen] = dnssd.sightings(dnssd.announce_packet(ours))
    assert (seen.fingerprint, seen.identity, seen.node_port, seen.port) == (
        "node-box", pin, 39443, 39080)
    [plain] = dnssd.sightings(dnssd.announce_packet(
        dnssd.Announcement("box", "box.local.", 1, "f", "v")))
    assert (plain.identity, plain.node_port) == ("", 0)
    for tls in (b"tls=0", b"tls=70000", b"tls=x", b"tls="):
        packet = _response(
            Record(dnssd.SERVICE, PTR, 4500, Ptr("a._sluice._tcp.local.")),
            Record("a._sluice._tcp.local.", SRV, 120, Srv(0, 0, 9, "a.local.")),
            Record("a._sluice._tcp.local.", TXT, 4500, Txt((b"fp=x", tls))))
        [odd] = dnssd.sightings(packet)
        assert odd.node_port == 0, tls


def _response(*records: Record, flags: int = 0x8400) -> bytes:
    return mdns.encode(Message(flags=flags, answers=records))


def test_one_instance_however_its_names_are_spelled() -> None:
    packet = _response(
        Record(dnssd.SERVICE, PTR, 4500, Ptr("Studio._sluice._tcp.local.")),
        Record("STUDIO._SLUICE._TCP.local.", SRV, 120, Srv(0, 0, 9, "Box.local.")),
        Record("studio._sluice._tcp.LOCAL.", TXT, 4500, Txt((b"Fp=x", b"v=2", b"fp=y"))),
        Record("box.LOCAL.", TYPE_A, 120, A("10.0.0.1")),
        Record("box.local.", TYPE_A, 120, A("10.0.0.1")),
        Record("other.local.", TYPE_A, 120, A("10.0.0.2")),
    )
    assert dnssd.sightings(packet) == [
        dnssd.Sighting("Studio", "x", "2", "Box.local.", 9, ("10.0.0.1",), 4500)]


def test_sightings_skip_what_is_not_a_sluice_to_pair_with() -> None:
    ptr = Record(dnssd.SERVICE, PTR, 4500, Ptr("a._sluice._tcp.local."))
    assert dnssd.sightings(_response(ptr, Record("a._sluice._tcp.local.", TXT, 1, Txt(
        (b"fp=", b"v=1"))))) == []
    assert dnssd.sightings(_response(ptr)) == []  # no TXT: nothing to pair with yet
    nested = Record(dnssd.SERVICE, PTR, 4500, Ptr("a.b._sluice._tcp.local."))
    assert dnssd.sightings(_response(nested, Record("a.b._sluice._tcp.local.", TXT, 1, Txt(
        (b"fp=1",))))) == []
    whole = dnssd.announce_packet(dnssd.Announcement("a", "a.local.", 1, "f", "v"))
    assert dnssd.sightings(whole[:2] + b"\x2c" + whole[3:]) == []  # opcode 5 (UPDATE)
    assert dnssd.sightings(whole[:2] + b"\x04" + whole[3:]) == []  # a query


def test_srv_alone_gives_its_ttl_and_a_goodbye_without_ptr() -> None:
    srv = Record("a._sluice._tcp.local.", SRV, 0, Srv(0, 0, 5, "a.local."))
    assert dnssd.sightings(_response(srv)) == [
        dnssd.Sighting("a", "", "", "a.local.", 5, (), 0)]


def test_a_host_name_without_its_final_dot_is_answered() -> None:
    ours = dnssd.Announcement("a", "Box.local", 1, "f", "v", ("10.0.0.3",))
    query = mdns.encode(Message(questions=(Question("box.local.", TYPE_A),)))
    reply = dnssd.answer(query, ours)
    assert reply is not None
    assert mdns.decode(reply).answers == (Record("Box.local.", TYPE_A, 120, A("10.0.0.3"), True),)
