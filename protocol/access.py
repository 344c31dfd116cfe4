"""Access-control rules (SPEC §5), pure: the DNS-rebinding guard (``Host`` and ``Origin``),
bearer tokens, access-key format, hashing and constant-time verification, and the errors
these checks answer with. No sockets, no clock, no files.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from protocol.errors import ConfigError, SluiceError, Source, rate_limit_error

__all__ = [
    "CORS_MAX_AGE", "KEY_PREFIX", "PAIRING_CLAIM_PATH", "PAIRING_PATH", "PREFLIGHT_METHODS",
    "admin_token_invalid",
    "admin_token_missing", "api_key_header", "bearer_token", "check_api_key",
    "check_secret_maps",
    "cors_headers", "forbidden_host", "forbidden_origin", "hash_key", "host_allowed",
    "is_loopback_ip", "key_expired", "key_invalid", "key_matches", "key_missing",
    "model_not_allowed", "new_access_key", "normal_address", "open_to_strangers",
    "origin_allowed", "own_host", "preflight_headers", "rate_limited", "token_equals",
]

Stored = TypeVar("Stored", bound=Mapping[str, Any])  # an access key as stored
KEY_PREFIX = "sk-sluice-"  # public and recognisable (for secret scanners); the rest is random
HASH_SCHEME = "sha256:"
CORS_MAX_AGE = b"600"  # seconds a browser may cache a preflight answer
PREFLIGHT_METHODS = b"GET, POST, PUT, PATCH, DELETE, OPTIONS"
PREFLIGHT_HEADERS = b"Authorization, Content-Type"
MAX_KEY_LENGTH = 4096
_WWW_AUTHENTICATE = ((b"www-authenticate", b"Bearer"),)
PAIRING_PATH = "/api/v1/pairing"  # SPEC §14: the code; admin only, even to read
PAIRING_CLAIM_PATH = "/api/v1/pairing/claim"  # SPEC §14: how another computer gets a key


# ----------------------------------------------------------------------- DNS rebinding


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


# ----------------------------------------------------------------------- tokens and keys


def open_to_strangers(method: bytes, path: str) -> bool:
    """The one request that needs neither the admin token nor an access key, on every
    listener: a pairing claim (SPEC §14), guarded by its one-time code, the code's tries and
    a rate limit per peer (:mod:`protocol.pairing`). The Host/Origin guard still applies."""
    return method == b"POST" and path == PAIRING_CLAIM_PATH


_VISIBLE_ASCII = re.compile("[!-~]+")  # U+0021 to U+007E


def _visible_ascii(value: str) -> bool:
    return len(value) <= MAX_KEY_LENGTH and _VISIBLE_ASCII.fullmatch(value) is not None


def check_api_key(field: str, value: object) -> None:
    """An API key given to the gateway (secrets.yaml, the API): visible ASCII only — no
    CR, LF, NUL, spaces or other control characters. The error names ``field``, never the
    value."""
    if not isinstance(value, str) or not _visible_ascii(value):
        raise ConfigError(field, "must be a non-empty string of visible ASCII characters "
                                 f"(no spaces, CR, LF, NUL or control characters; at most "
                                 f"{MAX_KEY_LENGTH})")


def check_secret_maps(maps: Mapping[str, Mapping[str, Any]]) -> None:
    """Check every key of ``{"backend_keys": {...}, "node_keys": {...}}``."""
    for section, keys in maps.items():
        for name, value in keys.items():
            check_api_key(f"{section}.{name}", value)


def bearer_token(values: Sequence[bytes]) -> str | None:
    """The token of one ``Authorization: Bearer <token>`` header; None when there is none.
    A malformed token comes back as "" (a credential that matches nothing)."""
    if not values:
        return None
    if len(values) > 1:
        return ""
    scheme, _, token = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    try:
        text = token.strip().decode("ascii")
    except UnicodeDecodeError:
        return ""
    return text if _visible_ascii(text) else ""


def api_key_header(values: Sequence[bytes]) -> str | None:
    """The key of one ``x-api-key`` header (Anthropic's clients); None when there is none,
    "" when it is malformed or repeated (a credential that matches nothing)."""
    if not values:
        return None
    if len(values) > 1:
        return ""
    try:
        text = values[0].strip().decode("ascii")
    except UnicodeDecodeError:
        return ""
    return text if text and _visible_ascii(text) else ""


def hash_key(key: str) -> str:
    """How an access key is stored: the sha256 of a 256-bit random key (no salt or stretching
    needed at that entropy)."""
    return HASH_SCHEME + hashlib.sha256(key.encode()).hexdigest()


def new_access_key() -> tuple[str, str]:
    """A fresh ``(id, key)``."""
    return "ak-" + secrets.token_hex(6), KEY_PREFIX + secrets.token_urlsafe(32)


def token_equals(presented: str, expected: str) -> bool:
    """Constant-time comparison of two secrets (their digests, so lengths do not leak)."""
    if not expected:
        return False
    a = hashlib.sha256(presented.encode()).digest()
    b = hashlib.sha256(expected.encode()).digest()
    return hmac.compare_digest(a, b)


def key_matches(presented: str, stored: Iterable[Stored]) -> Stored | None:
    """The stored access key ``presented`` is, compared in constant time against every
    stored hash (no early exit)."""
    digest = hash_key(presented).encode()
    found: Stored | None = None
    for entry in stored:
        value = entry.get("hash")
        if isinstance(value, str) and hmac.compare_digest(digest, value.encode()):
            found = entry
    return found


# ----------------------------------------------------------------------- answers


def _auth_error(status: int, message: str, code: str, *, challenge: bool) -> SluiceError:
    return SluiceError(status, message, type="invalid_request_error", code=code,
                       source=Source.CLIENT, headers=_WWW_AUTHENTICATE if challenge else ())


def key_missing() -> SluiceError:
    return _auth_error(401, "an access key is required: send 'Authorization: Bearer <key>' "
                            "or 'x-api-key: <key>' (create one with 'sluice keys create')",
                       "missing_api_key",
                       challenge=True)


def key_invalid() -> SluiceError:
    return _auth_error(401, "the access key is not valid (unknown or revoked)",
                       "invalid_api_key", challenge=True)


def key_expired(expires_at: str) -> SluiceError:
    """401 for a known key past its ``expiresAt`` (SPEC §13)."""
    return _auth_error(401, f"the access key expired at {expires_at}", "key_expired",
                       challenge=True)


def model_not_allowed(model: str) -> SluiceError:
    """403 for a model outside the key's ``models`` (SPEC §13)."""
    return SluiceError(403, f"this access key may not use model {model!r}",
                       type="invalid_request_error", code="model_not_allowed", param="model",
                       source=Source.CLIENT)


def rate_limited(rpm: int, retry_after: int) -> SluiceError:
    """429 for a key over its ``rpm`` (SPEC §13), with ``Retry-After`` in whole seconds."""
    return rate_limit_error(f"this access key may send {rpm} requests a minute; retry in "
                            f"{retry_after} s", retry_after)


def admin_token_missing() -> SluiceError:
    return _auth_error(401, "this endpoint needs the admin token: send "
                            "'Authorization: Bearer <admin_token from secrets.yaml>'",
                       "admin_token_required", challenge=True)


def admin_token_invalid() -> SluiceError:
    return _auth_error(403, "the admin token is not valid", "invalid_admin_token",
                       challenge=False)


def forbidden_host() -> SluiceError:
    return SluiceError(403, "the Host header names neither localhost, a loopback address nor "
                            "a name in api.allowed_hosts", type="invalid_request_error",
                       code="forbidden_host", param="api.allowed_hosts", source=Source.CLIENT)


def forbidden_origin() -> SluiceError:
    return SluiceError(403, "the Origin is neither loopback nor listed in "
                            "api.allowed_origins", type="invalid_request_error",
                       code="forbidden_origin", param="api.allowed_origins",
                       source=Source.CLIENT)
