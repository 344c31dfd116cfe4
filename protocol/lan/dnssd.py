"""The ``_sluice._tcp`` DNS-SD service (RFC 6763) over Multicast DNS (RFC 6762), as packets.

SPEC §14: a gateway announces itself as ``<computer name>._sluice._tcp.local.`` with its port
and a TXT record of ``fp=<fingerprint>`` and ``v=<version>`` (and SPEC §16's ``id=<pin>``
and ``tls=<node port>`` when the gateway has them); others browse for the
service type. This module makes and reads the packets and decides answers; the sockets, the
timers and the multicast groups are ``proxy/lan/discovery/``'s.

- :func:`announce_packet`: the unsolicited response that announces (or, ``goodbye=True``,
  withdraws) an :class:`Announcement`.
- :func:`query_packet`: the browse query, with the instances already known (RFC 6762 §7.1).
- :func:`answer`: our response to someone's query, or None.
- :func:`sightings`: the sluice instances a response describes.

:func:`answer` and :func:`sightings` see every mDNS packet on the LAN, nearly all of them
about other services: both look for the ``_sluice`` label (or our host's) in the raw bytes
before decoding anything, and neither raises, whatever the bytes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol.lan import mdns
from protocol.lan.mdns import (
    AAAA,
    ANY,
    PTR,
    SRV,
    TXT,
    TYPE_A,
    TYPE_AAAA,
    A,
    Message,
    Ptr,
    Question,
    Record,
    Srv,
    Txt,
)

__all__ = [
    "HOST_TTL", "LEGACY_TTL", "MDNS_GROUP", "MDNS_GROUP6", "MDNS_PORT", "OTHER_TTL",
    "RESPONSE_FLAGS", "SERVICE", "SERVICES_META", "Announcement", "Sighting", "announce_packet",
    "answer", "instance_name", "query_packet", "sightings",
]

SERVICE = "_sluice._tcp.local."
SERVICES_META = "_services._dns-sd._udp.local."  # the service types a host offers (§9)
MDNS_PORT = 5353
MDNS_GROUP = "224.0.0.251"
MDNS_GROUP6 = "ff02::fb"
HOST_TTL = 120  # RFC 6762 §10: records that name a host (SRV, A, AAAA)
OTHER_TTL = 4500  # RFC 6762 §10: the rest (PTR, TXT)
LEGACY_TTL = 10  # RFC 6762 §6.7: the most a legacy (port != 5353) asker is given
RESPONSE_FLAGS = 0x8400  # QR and AA

_QR = 0x8000
_SERVICE_KEY = mdns.fold(SERVICE)
_META_KEY = mdns.fold(SERVICES_META)
_SERVICE_LABELS = mdns.labels(_SERVICE_KEY)
_MARK = b"\x07_sluice"  # the label every name of ours is under, as it is on the wire
_META_MARK = b"\x09_services"


@dataclass(frozen=True)
class Announcement:
    """What this gateway announces: ``instance`` is the computer's name (one label, spaces
    allowed), ``host`` its ``.local.`` host name, ``addresses`` the IPv4/IPv6 literals of
    that host."""

    instance: str
    host: str
    port: int
    fingerprint: str
    version: str
    addresses: tuple[str, ...] = ()
    identity: str = ""  # SPEC §16: the certificate's pin (TXT ``id=``), "" = none
    node_port: int = 0  # SPEC §16: the TLS node listener's port (TXT ``tls=``), 0 = none


@dataclass(frozen=True)
class Sighting:
    """One sluice instance a response described. ``ttl`` 0 is a goodbye: the instance is
    leaving (its fingerprint may then be "")."""

    instance: str
    fingerprint: str
    version: str
    host: str
    port: int
    addresses: tuple[str, ...]
    ttl: int
    identity: str = ""  # TXT ``id=`` (SPEC §16): "" when not announced
    node_port: int = 0  # TXT ``tls=``: 0 when not announced (or not a port)


def instance_name(instance: str) -> str:
    """The instance's full name: ``"studio"`` -> ``"studio._sluice._tcp.local."`` (a dot or
    backslash in it escaped)."""
    return mdns.join((instance, *_SERVICE_LABELS))


# ---------------------------------------------------------------- our records


def _records(a: Announcement, ttl_of: int | None = None) -> dict[str, list[Record]]:
    """Our records by role; ``ttl_of`` replaces every TTL (0 for goodbyes, LEGACY_TTL)."""

    def ttl(default: int) -> int:
        return default if ttl_of is None else min(default, ttl_of)

    full = instance_name(a.instance)
    host_records = []
    for address in a.addresses:
        ip = ipaddress.ip_address(address.partition("%")[0])
        if ip.version == 4:
            host_records.append(Record(a.host, TYPE_A, ttl(HOST_TTL), A(str(ip)), True))
        else:
            host_records.append(Record(a.host, TYPE_AAAA, ttl(HOST_TTL), AAAA(str(ip)), True))
    entries = [b"fp=" + a.fingerprint.encode(), b"v=" + a.version.encode()]
    if a.identity:
        entries.append(b"id=" + a.identity.encode())
    if a.node_port:
        entries.append(b"tls=%d" % a.node_port)
    txt = Txt(tuple(entries))
    return {
        "ptr": [Record(SERVICE, PTR, ttl(OTHER_TTL), Ptr(full))],
        "meta": [Record(SERVICES_META, PTR, ttl(OTHER_TTL), Ptr(SERVICE))],
        "srv": [Record(full, SRV, ttl(HOST_TTL), Srv(0, 0, a.port, a.host), True)],
        "txt": [Record(full, TXT, ttl(OTHER_TTL), txt, True)],
        "host": host_records,
    }


def announce_packet(a: Announcement, *, goodbye: bool = False) -> bytes:
    """The unsolicited response announcing ``a`` (RFC 6762 §8.3), or with ``goodbye`` the
    same records with TTL 0, which withdraws them (§10.1). A name or address that cannot be
    sent is a ValueError."""
    rec = _records(a, 0 if goodbye else None)
    answers = (*rec["ptr"], *rec["srv"], *rec["txt"], *rec["host"], *rec["meta"])
    return mdns.encode(Message(0, RESPONSE_FLAGS, answers=answers))


def query_packet(known: Sequence[tuple[str, int]] = (), *, unicast: bool = False) -> bytes:
    """The browse query: PTR of the service, with ``known`` (instance full name, TTL left)
    in the answer section so that those instances stay quiet (RFC 6762 §7.1). ``unicast``
    sets the QU bit (§5.4: for the first query after starting)."""
    answers = tuple(Record(SERVICE, PTR, max(0, ttl), Ptr(name)) for name, ttl in known)
    return mdns.encode(Message(questions=(Question(SERVICE, PTR, unicast),), answers=answers))


# ---------------------------------------------------------------- answering


def _host_mark(host: str) -> bytes:
    try:
        first = mdns.labels(mdns.fold(host))[0].encode()
    except (ValueError, IndexError):
        return _MARK
    return bytes((len(first) & 0xFF,)) + first


def _asked(q: Question, rec: dict[str, list[Record]], full: str, host: str) -> tuple[
        list[Record], list[Record]]:
    """The answers and additional records one question asks of us (RFC 6763 §12)."""
    name, rtype = mdns.fold(q.name), q.rtype
    if name == _SERVICE_KEY and rtype in (PTR, ANY):
        return rec["ptr"], rec["srv"] + rec["txt"] + rec["host"]
    if name == _META_KEY and rtype in (PTR, ANY):
        return rec["meta"], []
    if name == full:
        if rtype == SRV:
            return rec["srv"], rec["host"]
        if rtype == TXT:
            return rec["txt"], []
        if rtype == ANY:
            return rec["srv"] + rec["txt"], rec["host"]
    if name == host:
        wanted = {TYPE_A: (TYPE_A,), TYPE_AAAA: (TYPE_AAAA,), ANY: (TYPE_A, TYPE_AAAA)}
        types = wanted.get(rtype, ())
        answers = [r for r in rec["host"] if r.rtype in types]
        return answers, [r for r in rec["host"] if r not in answers] if answers else []
    return [], []


def _known(record: Record, known: Iterable[Record]) -> bool:
    """Whether the asker listed ``record`` with at least half its TTL left (RFC 6762 §7.1)."""
    for k in known:
        if k.rtype != record.rtype or not mdns.same_name(k.name, record.name):
            continue
        if k.ttl * 2 < record.ttl:
            continue
        if isinstance(k.data, Ptr) and isinstance(record.data, Ptr):
            if mdns.same_name(k.data.target, record.data.target):
                return True
        elif isinstance(k.data, Srv) and isinstance(record.data, Srv):
            kd, rd = k.data, record.data
            if (kd.priority, kd.weight, kd.port) == (rd.priority, rd.weight, rd.port) and \
                    mdns.same_name(kd.target, rd.target):
                return True
        elif k.data == record.data:
            return True
    return False


def answer(packet: bytes, a: Announcement, *, legacy_id: int | None = None) -> bytes | None:
    """Our response to the query in ``packet``, or None: not a query, malformed, or nothing
    asked of ours (or all of it known to the asker). The answers are the records asked; the
    related records go in the additional section (RFC 6763 §12). ``legacy_id``: the query
    came from a port other than 5353 (RFC 6762 §6.7), so the response carries its id and
    questions, TTLs of at most 10 s and no cache-flush bits. Never raises."""
    try:
        return _answer(packet, a, legacy_id)
    except ValueError:  # a malformed packet, or an announcement that cannot be sent
        return None


def _answer(packet: bytes, a: Announcement, legacy_id: int | None) -> bytes | None:
    if len(packet) < 12 or packet[2] & 0xF8 or not (packet[4] or packet[5]):
        return None  # a response, an opcode other than QUERY (RFC 6762 §18.3), no question
    lowered = bytes(packet).lower()
    if _MARK not in lowered and _META_MARK not in lowered and _host_mark(a.host) not in lowered:
        return None
    msg = mdns.decode(packet)
    rec = _records(a, None if legacy_id is None else LEGACY_TTL)
    full, host = mdns.fold(instance_name(a.instance)), mdns.fold(mdns.join(mdns.labels(a.host)))
    answers: list[Record] = []
    extra: list[Record] = []
    asked: list[Question] = []
    for q in msg.questions:
        these, more = _asked(q, rec, full, host)
        if these:
            asked.append(q)
        answers += [r for r in these if r not in answers]
        extra += [r for r in more if r not in extra]
    known = msg.answers
    answers = [r for r in answers if not _known(r, known)]
    if not answers:
        return None
    extra = [r for r in extra if r not in answers and not _known(r, known)]
    if legacy_id is None:
        reply = Message(0, RESPONSE_FLAGS, answers=tuple(answers), additionals=tuple(extra))
    else:
        answers = [_no_flush(r) for r in answers]
        extra = [_no_flush(r) for r in extra]
        questions = tuple(Question(q.name, q.rtype) for q in asked)
        reply = Message(legacy_id & 0xFFFF, RESPONSE_FLAGS, questions, tuple(answers),
                        additionals=tuple(extra))
    return mdns.encode(reply)


def _no_flush(r: Record) -> Record:
    return Record(r.name, r.rtype, r.ttl, r.data) if r.cache_flush else r


# ---------------------------------------------------------------- browsing


def _txt_values(entries: tuple[bytes, ...]) -> dict[str, str]:
    """TXT ``key=value`` strings (RFC 6763 §6.4): keys without case, the first one wins."""
    values: dict[str, str] = {}
    for entry in entries:
        key, eq, value = entry.partition(b"=")
        if not eq or not key:
            continue
        name = mdns.fold(key.decode("ascii", "replace"))
        values.setdefault(name, value.decode("utf-8", "replace"))
    return values


def _instance_label(name: str) -> str | None:
    """The instance label of ``<instance>._sluice._tcp.local.``, else None."""
    folded = mdns.fold(name)
    if not folded.endswith("._sluice._tcp.local."):
        return None
    try:
        parts = mdns.labels(name)
    except ValueError:
        return None
    if len(parts) != 4 or tuple(mdns.fold(p) for p in parts[1:]) != _SERVICE_LABELS:
        return None
    return parts[0]


def sightings(packet: bytes) -> list[Sighting]:
    """Every sluice instance the response in ``packet`` describes (answers and additional
    records). An instance without an ``fp`` in its TXT record is left out, unless it is a
    goodbye (TTL 0). Queries and junk give []. Never raises."""
    try:
        return _sightings(packet)
    except ValueError:
        return []


def _sightings(packet: bytes) -> list[Sighting]:
    if len(packet) < 12 or packet[2] & 0xF8 != 0x80 or _MARK not in bytes(packet).lower():
        return []  # a query, an opcode other than QUERY (RFC 6762 §18.3), not about sluice
    msg = mdns.decode(packet)
    records = msg.answers + msg.additionals
    order: list[str] = []  # folded instance names, in the order first seen
    label: dict[str, str] = {}
    ptrs: dict[str, Record] = {}
    srvs: dict[str, Srv] = {}
    srv_ttl: dict[str, int] = {}
    txts: dict[str, Record] = {}
    addresses: dict[str, list[str]] = {}
    for r in records:
        data = r.data
        if isinstance(data, A | AAAA):
            addresses.setdefault(mdns.fold(r.name), []).append(data.address)
            continue
        if isinstance(data, Ptr) and r.rtype == PTR:
            if mdns.fold(r.name) != _SERVICE_KEY:
                continue
            name = data.target
        elif r.rtype in (SRV, TXT):
            name = r.name
        else:
            continue
        instance = _instance_label(name)
        if instance is None:
            continue
        key = mdns.fold(name)
        if key not in label:
            order.append(key)
            label[key] = instance
        if isinstance(data, Ptr):
            ptrs.setdefault(key, r)
        elif isinstance(data, Srv):
            srvs.setdefault(key, data)
            srv_ttl.setdefault(key, r.ttl)
        elif isinstance(data, Txt):
            txts.setdefault(key, r)
    found: list[Sighting] = []
    for key in order:
        ptr, srv, txt = ptrs.get(key), srvs.get(key), txts.get(key)
        if ptr is not None:
            ttl = ptr.ttl
        elif srv is not None:
            ttl = srv_ttl[key]
        else:
            ttl = txt.ttl if txt is not None else 0
        values = _txt_values(txt.data.entries) if txt and isinstance(txt.data, Txt) else {}
        fingerprint = values.get("fp", "")
        if not fingerprint and ttl:
            continue
        host = srv.target if srv else ""
        seen = addresses.get(mdns.fold(host), []) if host else []
        tls = values.get("tls", "")
        found.append(Sighting(label[key], fingerprint, values.get("v", ""), host,
                              srv.port if srv else 0, tuple(dict.fromkeys(seen)), ttl,
                              values.get("id", "")[:80],
                              int(tls) if tls.isdigit() and 0 < int(tls) < 65536 else 0))
    return found
