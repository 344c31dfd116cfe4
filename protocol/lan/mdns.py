"""DNS messages in their wire format (RFC 1035 §4), with the bits Multicast DNS adds (RFC 6762).

Pure bytes and values: :func:`encode` makes a packet from a :class:`Message` (names compressed
with pointers to earlier suffixes), :func:`decode` reads one. Decoding trusts nothing: every
length, count and pointer is checked against the bytes there are before it is followed, so any
bytes give a :class:`Message` or a :class:`MalformedPacket`, never another exception, and a
lying packet costs neither memory nor time (pointers only go backwards, a few per name).

Names are dotted strings ending with ``"."``: ``"My Mac._sluice._tcp.local."``. A label is
UTF-8 and may hold spaces; a ``"."`` or ``"\\"`` inside a label is written ``\\.`` / ``\\\\``
(:func:`labels` and :func:`join` turn one form into the other). Names compare without ASCII
case (:func:`same_name`, :func:`fold`). Questions and records are class IN; the top bit of
the class is the unicast-response bit of a question and the cache-flush bit of a record.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

__all__ = [
    "AAAA", "ANY", "CLASS_IN", "MAX_LABEL", "MAX_NAME", "NSEC", "PTR", "SRV", "TXT", "TYPE_A",
    "TYPE_AAAA", "A", "MalformedPacket", "Message", "Opaque", "Ptr", "Question", "RData",
    "Record", "Srv", "Txt", "decode", "encode", "fold", "join", "labels", "same_name",
]

# Record types. A and AAAA name the rdata classes, so their numbers are TYPE_A and TYPE_AAAA.
TYPE_A, PTR, TXT, TYPE_AAAA, SRV, NSEC, ANY = 1, 12, 16, 28, 33, 47, 255
CLASS_IN = 1
_TOP_BIT = _QR = 0x8000  # QU in a question's class, cache-flush in a record's; QR in flags
MAX_LABEL = 63
MAX_NAME = 255  # wire bytes, the final zero length included
_MAX_JUMPS = 64  # compression pointers followed in one name
_POINTER_LIMIT = 0x3FFF  # the largest offset a pointer can hold

_HEADER = struct.Struct("!6H")
_QTAIL = struct.Struct("!2H")
_RTAIL = struct.Struct("!HHIH")
_SRV_HEAD = struct.Struct("!3H")
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class MalformedPacket(ValueError):
    """Bytes that are not a DNS message this codec can read."""


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    rtype: int
    unicast: bool = False  # QU: the asker would take a unicast answer (RFC 6762 §5.4)


@dataclass(frozen=True, slots=True)
class Ptr:
    target: str


@dataclass(frozen=True, slots=True)
class Srv:
    priority: int
    weight: int
    port: int
    target: str


@dataclass(frozen=True, slots=True)
class Txt:
    """The strings of a TXT record. A record of one empty string (how "no strings" is sent,
    RFC 6763 §6.1) decodes as ``()``."""

    entries: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class A:
    address: str


@dataclass(frozen=True, slots=True)
class AAAA:
    address: str


@dataclass(frozen=True, slots=True)
class Opaque:
    """The rdata of any other type (NSEC, OPT, ...), as bytes; names inside are not read."""

    rtype: int
    data: bytes


RData = Ptr | Srv | Txt | A | AAAA | Opaque


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    rtype: int
    ttl: int
    data: RData
    cache_flush: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    id: int = 0
    flags: int = 0
    questions: tuple[Question, ...] = ()
    answers: tuple[Record, ...] = ()
    authorities: tuple[Record, ...] = ()
    additionals: tuple[Record, ...] = ()

    @property
    def is_response(self) -> bool:
        return bool(self.flags & _QR)


# ---------------------------------------------------------------- names


def labels(name: str) -> tuple[str, ...]:
    """The labels of a dotted name, escapes undone: ``labels("a\\.b.local.") == ("a.b",
    "local")``. The final dot may be left out; ``"."`` and ``""`` are the root, ``()``.
    An empty label inside the name, or a lone ``\\`` at its end, is a ValueError."""
    if "\\" not in name:
        if name in (".", ""):
            return ()
        parts = (name[:-1] if name.endswith(".") else name).split(".")
        if "" in parts:
            raise ValueError(f"empty label in {name!r}")
        return tuple(parts)
    out: list[str] = []
    current: list[str] = []
    chars = iter(name)
    for char in chars:
        if char == "\\":
            escaped = next(chars, None)
            if escaped is None:
                raise ValueError(f"a lone backslash ends {name!r}")
            current.append(escaped)
        elif char == ".":
            if not current:
                raise ValueError(f"empty label in {name!r}")
            out.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        out.append("".join(current))
    return tuple(out)


def _escape(label: str) -> str:
    if "." in label or "\\" in label:
        return label.replace("\\", "\\\\").replace(".", "\\.")
    return label


def join(parts: tuple[str, ...] | list[str]) -> str:
    """The dotted name of ``parts`` (the inverse of :func:`labels`), ending with ``"."``."""
    return "".join(_escape(part) + "." for part in parts) or "."


def fold(name: str) -> str:
    """``name`` with ASCII letters in lower case (DNS ignores their case, and only theirs)."""
    return name.translate(_ASCII_FOLD)


def same_name(a: str, b: str) -> bool:
    """Whether two dotted names name the same node, ignoring ASCII case and a missing final
    dot. Names that are not names (an empty label) are the same only if they are equal."""
    fa, fb = fold(a), fold(b)
    if fa == fb:
        return True
    try:
        return labels(fa) == labels(fb)
    except ValueError:
        return False


# ---------------------------------------------------------------- encoding


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()
        self.suffixes: dict[tuple[bytes, ...], int] = {}

    def name(self, name: str) -> None:
        parts = tuple(label.encode() for label in labels(name))
        if any(len(part) > MAX_LABEL for part in parts):
            raise ValueError(f"a label longer than {MAX_LABEL} bytes in {name!r}")
        if sum(len(part) + 1 for part in parts) + 1 > MAX_NAME:
            raise ValueError(f"a name longer than {MAX_NAME} bytes: {name!r}")
        out = self.out
        for i in range(len(parts)):
            suffix = parts[i:]
            offset = self.suffixes.get(suffix)
            if offset is not None:
                out += struct.pack("!H", 0xC000 | offset)
                return
            if len(out) <= _POINTER_LIMIT:
                self.suffixes[suffix] = len(out)
            out.append(len(parts[i]))
            out += parts[i]
        out.append(0)

    def question(self, q: Question) -> None:
        self.name(q.name)
        self.out += _QTAIL.pack(q.rtype, CLASS_IN | (_TOP_BIT if q.unicast else 0))

    def record(self, r: Record) -> None:
        self.name(r.name)
        rclass = CLASS_IN | (_TOP_BIT if r.cache_flush else 0)
        self.out += _RTAIL.pack(r.rtype, rclass, r.ttl, 0)
        start = len(self.out)
        self.rdata(r.data)
        size = len(self.out) - start
        if size > 0xFFFF:
            raise ValueError(f"rdata of {r.name!r} longer than 65535 bytes")
        struct.pack_into("!H", self.out, start - 2, size)

    def rdata(self, data: RData) -> None:
        out = self.out
        if isinstance(data, Ptr):
            self.name(data.target)
        elif isinstance(data, Srv):
            out += _SRV_HEAD.pack(data.priority, data.weight, data.port)
            self.name(data.target)
        elif isinstance(data, Txt):
            if not data.entries:
                out.append(0)
            for entry in data.entries:
                if len(entry) > 255:
                    raise ValueError("a TXT string longer than 255 bytes")
                out.append(len(entry))
                out += entry
        elif isinstance(data, A):
            out += ipaddress.IPv4Address(data.address).packed
        elif isinstance(data, AAAA):
            out += ipaddress.IPv6Address(data.address.partition("%")[0]).packed
        else:
            out += data.data


def encode(msg: Message) -> bytes:
    """The wire bytes of ``msg``. A label over 63 bytes, a name over 255, an address that is
    not one, or a number that does not fit its field is a ValueError."""
    w = _Writer()
    sections = (msg.answers, msg.authorities, msg.additionals)
    try:
        w.out += _HEADER.pack(msg.id, msg.flags, len(msg.questions), *map(len, sections))
        for q in msg.questions:
            w.question(q)
        for section in sections:
            for r in section:
                w.record(r)
    except struct.error as exc:  # a port, TTL, type or count out of range
        raise ValueError(str(exc)) from None
    return bytes(w.out)


# ---------------------------------------------------------------- decoding


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` and the offset after it where it is written (after its first
    pointer, if any). A pointer must go below the start of the run of labels it ends, so
    the names it leads to cannot loop; the name's wire length is bounded too."""
    size = len(data)
    parts: list[str] = []
    wire = 1
    end = -1
    run_start = offset
    jumps = 0
    while True:
        if offset >= size:
            raise MalformedPacket("a name runs past the end of the packet")
        length = data[offset]
        if length == 0:
            return "".join(parts) or ".", (offset + 1 if end < 0 else end)
        kind = length & 0xC0
        if kind == 0xC0:
            if offset + 1 >= size:
                raise MalformedPacket("a compression pointer cut short")
            target = ((length & 0x3F) << 8) | data[offset + 1]
            if target >= run_start or target < _HEADER.size:
                raise MalformedPacket("a compression pointer that does not point back into "
                                      "the records")
            jumps += 1
            if jumps > _MAX_JUMPS:
                raise MalformedPacket("too many compression pointers in a name")
            if end < 0:
                end = offset + 2
            offset = run_start = target
            continue
        if kind:
            raise MalformedPacket(f"a label length byte 0x{length:02x} (over {MAX_LABEL})")
        wire += length + 1
        if wire > MAX_NAME:
            raise MalformedPacket(f"a name longer than {MAX_NAME} bytes")
        stop = offset + 1 + length
        if stop > size:
            raise MalformedPacket("a label runs past the end of the packet")
        parts.append(_escape(data[offset + 1 : stop].decode("utf-8", "replace")) + ".")
        offset = stop


def _read_rdata(data: bytes, rtype: int, start: int, stop: int) -> RData:
    raw = data[start:stop]
    if rtype == PTR:
        target, after = _read_name(data, start)
        if after != stop:
            raise MalformedPacket("a PTR record's name does not fill its rdata")
        return Ptr(target)
    if rtype == SRV:
        if stop - start < 7:
            raise MalformedPacket("an SRV record too short")
        priority, weight, port = _SRV_HEAD.unpack_from(data, start)
        target, after = _read_name(data, start + 6)
        if after != stop:
            raise MalformedPacket("an SRV record's target does not fill its rdata")
        return Srv(priority, weight, port, target)
    if rtype == TXT:
        entries: list[bytes] = []
        at = 0
        while at < len(raw):
            length = raw[at]
            if at + 1 + length > len(raw):
                raise MalformedPacket("a TXT string runs past its record")
            entries.append(raw[at + 1 : at + 1 + length])
            at += 1 + length
        return Txt(() if entries == [b""] else tuple(entries))
    if rtype == TYPE_A:
        if len(raw) != 4:
            raise MalformedPacket(f"an A record of {len(raw)} bytes")
        return A(".".join(map(str, raw)))
    if rtype == TYPE_AAAA:
        if len(raw) != 16:
            raise MalformedPacket(f"an AAAA record of {len(raw)} bytes")
        return AAAA(str(ipaddress.IPv6Address(raw)))
    return Opaque(rtype, raw)


def _read_record(data: bytes, offset: int) -> tuple[Record, int]:
    name, offset = _read_name(data, offset)
    if offset + _RTAIL.size > len(data):
        raise MalformedPacket("a record cut short")
    rtype, rclass, ttl, rdlength = _RTAIL.unpack_from(data, offset)
    start = offset + _RTAIL.size
    stop = start + rdlength
    if stop > len(data):
        raise MalformedPacket("a record's rdata runs past the end of the packet")
    rdata = _read_rdata(data, rtype, start, stop)
    return Record(name, rtype, ttl, rdata, bool(rclass & _TOP_BIT)), stop


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The message in ``data``; anything wrong with it is a :class:`MalformedPacket`. Bytes
    after the counted records are ignored."""
    try:
        return _decode(bytes(data))
    except MalformedPacket:
        raise
    except (IndexError, ValueError, struct.error, TypeError) as exc:  # a check missed: still bad
        raise MalformedPacket(f"unreadable packet: {exc}") from None


def _decode(data: bytes) -> Message:
    if len(data) < _HEADER.size:
        raise MalformedPacket("shorter than a DNS header")
    ident, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(data)
    # Each question takes 5 bytes at least, each record 11: a count beyond that is a lie.
    if qdcount * 5 + (ancount + nscount + arcount) * 11 > len(data) - _HEADER.size:
        raise MalformedPacket("counts larger than the packet")
    offset = _HEADER.size
    questions: list[Question] = []
    for _ in range(qdcount):
        name, offset = _read_name(data, offset)
        if offset + _QTAIL.size > len(data):
            raise MalformedPacket("a question cut short")
        qtype, qclass = _QTAIL.unpack_from(data, offset)
        offset += _QTAIL.size
        questions.append(Question(name, qtype, bool(qclass & _TOP_BIT)))
    sections: list[tuple[Record, ...]] = []
    for count in (ancount, nscount, arcount):
        records: list[Record] = []
        for _ in range(count):
            record, offset = _read_record(data, offset)
            records.append(record)
        sections.append(tuple(records))
    answers, authorities, additionals = sections
    return Message(ident, flags, tuple(questions), answers, authorities, additionals)
