"""The DNS-rebinding guard (SPEC §5), pure: which ``Host`` and ``Origin`` a TCP request may
carry (loopback names, ``api.allowed_hosts`` and ``api.allowed_origins``, this computer's own
address with external access, SPEC §14), the CORS headers an allowed origin gets, and the
403s for the others. No sockets, no clock, no files: :mod:`proxy.access.auth` applies it.
"""

from __future__ import annotations

import functools
import ipaddress

from protocol.errors import SluiceError, Source

__all__ = [
    "CORS_MAX_AGE", "PREFLIGHT_METHODS", "cors_headers", "forbidden_host", "forbidden_origin",
    "host_allowed", "is_loopback_ip", "normal_address", "origin_allowed", "own_host",
    "preflight_headers",
]

CORS_MAX_AGE = b"600"  # seconds a browser may cache a preflight answer
PREFLIGHT_METHODS = b"GET, POST, PUT, PATCH, DELETE, OPTIONS"
PREFLIGHT_HEADERS = b"Authorization, Content-Type"


def is_loopback_ip(text: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped ::ffff:127.x (a dual-stack socket's view)."""
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def _split_authority(value: str) -> tuple[str, str] | None:
    """``host[:port]`` or ``[v6][:port]`` -> (host, port); None when malformed."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
        if ":" not in host:  # brackets are for IPv6 only
            return None
    else:
        host, _, port = value.partition(":")
        if ":" in port:
            return None
    if port and not port.isdigit():
        return None
    return host, port


def _is_local_name(host: str) -> bool:
    return host == "localhost" or is_loopback_ip(host)


@functools.lru_cache(maxsize=512)
def host_allowed(host: bytes | None, allowed_hosts: tuple[str, ...] = ()) -> bool:
    """The ``Host`` check on TCP: ``localhost``, a loopback address or a name listed in
    ``api.allowed_hosts`` (the port is ignored). No Host at all (HTTP/1.0) passes; an empty
    host (``Host: :39080``) does not."""
    if host is None:
        return True
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    parts = _split_authority(text)
    if parts is None or not parts[0] or "@" in text:
        return False
    name = parts[0].removesuffix(".") if parts[0] != "." else ""
    if not name:
        return False
    if _is_local_name(name):
        return True
    for entry in allowed_hosts:
        entry = entry.strip().lower()
        if entry in (name, text):
            return True
    return False


def own_host(host: bytes, addresses: frozenset[str], hostname: str) -> bool:
    """A ``Host`` that names this computer itself (SPEC §14, with external access): an IP
    literal among ``addresses`` (this computer's own, as :func:`normal_address` writes
    them; an IPv6 zone is ignored) or ``<hostname>.local`` (any case, a final dot allowed).
    The port is ignored. A DNS-rebinding page needs a name it controls, not our address."""
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    parts = _split_authority(text)
    if parts is None or "@" in text:
        return False
    name = parts[0].removesuffix(".")
    if not name:
        return False
    if hostname and name == hostname.lower() + ".local":
        return True
    address = normal_address(name.split("%", 1)[0])
    return address is not None and address in addresses


def normal_address(text: str) -> str | None:
    """An IP address in one spelling (``::FFFF:10.0.0.1`` and ``10.0.0.1`` alike), or None
    for text that is no address."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


@functools.lru_cache(maxsize=512)
def origin_allowed(origin: bytes, allowed_origins: tuple[str, ...] = ()) -> bool:
    """A browser ``Origin`` the gateway answers: http(s) on localhost or a loopback
    address (any port), or one listed exactly in ``api.allowed_origins``."""
    try:
        text = origin.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    for entry in allowed_origins:
        if entry.strip().lower().rstrip("/") == text.rstrip("/"):
            return True
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https") or "/" in rest or "@" in rest:
        return False
    parts = _split_authority(rest)
    return parts is not None and bool(parts[0]) and _is_local_name(parts[0])


def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    """What an answer to an allowed origin carries."""
    return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]


def preflight_headers() -> list[tuple[bytes, bytes]]:
    """What a preflight answer to an allowed origin adds to :func:`cors_headers`."""
    return [(b"access-control-allow-methods", PREFLIGHT_METHODS),
            (b"access-control-allow-headers", PREFLIGHT_HEADERS),
            (b"access-control-max-age", CORS_MAX_AGE)]


def forbidden_host() -> SluiceError:
    return SluiceError(403, "the Host header names neither localhost, a loopback address nor "
                            "a name in api.allowed_hosts", type="invalid_request_error",
                       code="forbidden_host", param="api.allowed_hosts", source=Source.CLIENT)


def forbidden_origin() -> SluiceError:
    return SluiceError(403, "the Origin is neither loopback nor listed in "
                            "api.allowed_origins", type="invalid_request_error",
                       code="forbidden_origin", param="api.allowed_origins",
                       source=Source.CLIENT)
