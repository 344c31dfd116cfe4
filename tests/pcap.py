"""Just enough of a pcap file (what ``tcpdump -w`` writes, libpcap's classic format) to say
what crossed a veth: every packet's TCP segments over IPv4 on Ethernet, each TCP
connection's two byte streams put back in order (by sequence number, retransmissions
dropped), and the TLS records of a stream (content type, protocol version of a
ServerHello). Anything else (ARP, IPv6's neighbour discovery) is counted, not read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import attrs

# The classic pcap magic in both byte orders, micro- and nanosecond timestamps.
_MAGIC = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<",
          b"\xa1\xb2\xc3\xd4": ">", b"\xa1\xb2\x3c\x4d": ">"}
ETHERNET = 1
IPV4 = 0x0800
TCP = 6
HANDSHAKE, CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA = 0x16, 0x14, 0x15, 0x17
SERVER_HELLO = 2
SUPPORTED_VERSIONS = 0x002B
TLS13 = 0x0304


@attrs.frozen
class Segment:
    """One TCP segment: who sent it to whom, its sequence number, flags and payload."""

    src: tuple[str, int]
    dst: tuple[str, int]
    seq: int
    syn: bool
    payload: bytes


def packets(data: bytes) -> Iterator[bytes]:
    """The captured bytes of each packet of a pcap file (Ethernet frames only)."""
    order = _MAGIC.get(data[:4])
    if order is None:
        raise ValueError("not a pcap file (tcpdump -w writes the classic format)")
    (linktype,) = struct.unpack_from(order + "I", data, 20)
    if linktype != ETHERNET:
        raise ValueError(f"link type {linktype}, expected Ethernet")
    at = 24
    while at + 16 <= len(data):
        included = struct.unpack_from(order + "I", data, at + 8)[0]
        yield data[at + 16:at + 16 + included]
        at += 16 + included


def _address(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def segment_of(frame: bytes) -> Segment | None:
    """The TCP segment in an Ethernet frame; None for anything that is not TCP over IPv4."""
    if len(frame) < 14 + 20 or struct.unpack_from("!H", frame, 12)[0] != IPV4:
        return None
    ip = frame[14:]
    header = (ip[0] & 0x0F) * 4
    total = struct.unpack_from("!H", ip, 2)[0]
    if ip[9] != TCP or len(ip) < header + 20:
        return None
    tcp = ip[header:total]
    sport, dport, seq = struct.unpack_from("!HHI", tcp, 0)
    offset = (tcp[12] >> 4) * 4
    return Segment((_address(ip[12:16]), sport), (_address(ip[16:20]), dport), seq,
                   bool(tcp[13] & 0x02), bytes(tcp[offset:]))


def segments(data: bytes) -> list[Segment]:
    """Every TCP segment of a pcap file, in capture order."""
    return [s for s in map(segment_of, packets(data)) if s is not None]


Direction = tuple[tuple[str, int], tuple[str, int]]


def streams(found: list[Segment]) -> dict[Direction, bytes]:
    """Each direction's bytes, ``(src, dst) -> stream``, put in order from the first
    segment seen (its SYN when the capture started before the connection did)."""
    pieces: dict[Direction, list[tuple[int, bytes]]] = {}
    first: dict[Direction, int] = {}
    for seg in found:
        way = (seg.src, seg.dst)
        base = first.setdefault(way, seg.seq + 1 if seg.syn else seg.seq)
        if seg.payload:
            pieces.setdefault(way, []).append(((seg.seq - base) % 2**32, seg.payload))
    out = {}
    for way, parts in pieces.items():
        stream = bytearray()
        for at, payload in sorted(parts, key=lambda p: p[0]):
            if at + len(payload) > len(stream):  # a retransmission adds only what is new
                stream += payload[max(len(stream) - at, 0):]
        out[way] = bytes(stream)
    return out


def tls_records(stream: bytes) -> list[tuple[int, bytes]]:
    """The TLS records at the start of a stream, ``(content type, fragment)``: it stops at
    the first bytes that are not a TLS record header (plain HTTP gives none)."""
    records = []
    at = 0
    while at + 5 <= len(stream):
        kind, major, length = stream[at], stream[at + 1], struct.unpack_from("!H", stream,
                                                                             at + 3)[0]
        if kind not in (HANDSHAKE, CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA) or \
                major != 3 or at + 5 + length > len(stream):
            break
        records.append((kind, stream[at + 5:at + 5 + length]))
        at += 5 + length
    return records


def server_hello_version(fragment: bytes) -> int | None:
    """The version a ServerHello (a handshake record's fragment) chose: its
    supported_versions extension (TLS 1.3), else its legacy version field."""
    if len(fragment) < 4 + 35 or fragment[0] != SERVER_HELLO:
        return None
    body = fragment[4:]
    legacy: int = struct.unpack_from("!H", body, 0)[0]
    at = 34  # legacy_version, random
    at += 1 + body[at]  # legacy_session_id_echo
    at += 2 + 1  # cipher_suite, legacy_compression_method
    if at + 2 > len(body):
        return legacy
    end = at + 2 + struct.unpack_from("!H", body, at)[0]
    at += 2
    while at + 4 <= end:
        kind, length = struct.unpack_from("!HH", body, at)
        if kind == SUPPORTED_VERSIONS and length == 2:
            chosen: int = struct.unpack_from("!H", body, at + 4)[0]
            return chosen
        at += 4 + length
    return legacy
