"""Access-control rules (SPEC §5, §13, §14, §16), pure: bearer tokens, access-key format, hashing
and constant-time verification, who may call a path (:class:`Access`, by method a
:class:`Rule`: the route table gives every route one, :mod:`proxy.api.routes`), the access
table (:data:`TABLE`: what a request at a level must show on each listener's
:class:`Column`, the node listener's included), the decision for one request
(:func:`authorize`) and the errors it answers with. The DNS-rebinding guard is
:mod:`protocol.rebinding`. No sockets, no clock, no files.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from protocol.errors import ConfigError, SluiceError, Source, rate_limit_error
from protocol.headers import Header
from protocol.lan.pairing import check_claim_body

__all__ = [
    "ADMIN_CHANGES", "ADMIN_ONLY", "ANYONE", "KEY_HOLDERS", "KEY_PREFIX", "PAIRING_CLAIM_PATH",
    "PAIRING_EXCHANGE_PATH", "PAIRING_PATH", "TABLE", "WRITES", "Access", "Column", "Rule",
    "Step", "admin_token_invalid", "admin_token_missing", "api_key_header", "authorize",
    "bearer_token", "check_api_key", "check_secret_maps", "exchange_elsewhere", "hash_key",
    "key_expired", "key_invalid", "key_matches", "key_missing", "key_not_bound",
    "model_not_allowed", "new_access_key", "rate_limited", "token_equals",
    "unpaired_certificate",
]

Stored = TypeVar("Stored", bound=Mapping[str, Any])  # an access key as stored
KEY_PREFIX = "sk-sluice-"  # public and recognisable (for secret scanners); the rest is random
HASH_SCHEME = "sha256:"
MAX_KEY_LENGTH = 4096
_WWW_AUTHENTICATE = ((b"www-authenticate", b"Bearer"),)
PAIRING_PATH = "/api/v1/pairing"  # SPEC §14: the code; admin only, even to read
PAIRING_CLAIM_PATH = "/api/v1/pairing/claim"  # SPEC §14: how another computer gets a key
PAIRING_EXCHANGE_PATH = "/api/v1/pairing/exchange"  # SPEC §16: the same, by SPAKE2 over TLS


# ----------------------------------------------------------------------- tokens and keys


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


# ----------------------------------------------------------------------- who may call a path


class Access(enum.Enum):
    """What a request must show to be let through (SPEC §5, §14); the Host/Origin guard
    applies before it, whatever the level."""

    OPEN = "open"  # nothing, on every listener: GET /health, a CORS preflight
    CLAIM = "claim"  # nothing but a small body: a pairing claim, its one-time code its key
    PAIRING = "pairing"  # the pairing exchange (SPEC §16): a claim's kind, served on the node
    # listener only, and there the one call open to a client without a paired certificate
    KEY = "key"  # an access key (or the admin token) on the tcp API listener from a peer
    # that is not loopback, and from loopback peers too with api.require_auth; nothing on
    # the Unix socket or local-tcp
    ADMIN = "admin"  # the admin token, on every listener


WRITES = frozenset({b"POST", b"PUT", b"PATCH", b"DELETE"})


@attrs.frozen
class Rule:
    """Who may call one path, by method: ``writes`` for POST, PUT, PATCH and DELETE,
    ``reads`` for every other method, ``own`` for a method with a level of its own. Methods
    the path does not serve have a level too (it is decided before the 405). A preflight
    (OPTIONS, which carries no credentials) is OPEN on every path."""

    reads: Access
    writes: Access
    own: tuple[tuple[bytes, Access], ...] = ()

    def level(self, method: bytes) -> Access:
        if method == b"OPTIONS":
            return Access.OPEN
        for name, level in self.own:
            if name == method:
                return level
        return self.writes if method in WRITES else self.reads

    def but(self, method: bytes, level: Access) -> Rule:
        """This rule with ``method`` at ``level``."""
        return attrs.evolve(self, own=(*self.own, (method, level)))


ANYONE = Rule(Access.OPEN, Access.OPEN)
KEY_HOLDERS = Rule(Access.KEY, Access.KEY)  # the model API, and what a key holder reads
ADMIN_CHANGES = Rule(Access.KEY, Access.ADMIN)  # read with a key, changed by the admin
ADMIN_ONLY = Rule(Access.ADMIN, Access.ADMIN)

def _values(headers: Sequence[Header], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def _presented(headers: Sequence[Header]) -> str | None:
    """The credential a request carries: ``Authorization: Bearer``, else ``x-api-key``
    (Anthropic's clients, SPEC §12)."""
    token = bearer_token(_values(headers, b"authorization"))
    if token is None:
        token = api_key_header(_values(headers, b"x-api-key"))
    return token


def _ours(key: Stored | None) -> Stored | None:
    """A key bound to a paired computer's certificate (SPEC §16) counts only with that
    certificate, on the node listener: elsewhere it is no key of ours."""
    return None if key is None or key.get("pin") is not None else key


def _offered_key(headers: Sequence[Header],
                 find_key: Callable[[str], Stored | None]) -> Stored | None:
    """Where no key is needed: the stored key the request carries if it is one of ours
    (SPEC §13: held to its limits); None for no token or any other (apps send dummy keys;
    never looked up unless it looks like ours)."""
    for name, _ in headers:  # most requests here carry no credential: one pass, no parse
        if name == b"authorization" or name == b"x-api-key":
            break
    else:
        return None
    token = _presented(headers)
    if token is None or not token.startswith(KEY_PREFIX):
        return None
    return _ours(find_key(token))


def _needed_key(headers: Sequence[Header], admin_token: str,
                find_key: Callable[[str], Stored | None]) -> Stored | None:
    """Where a key is needed: the stored key presented (None for the admin token, which
    passes where a key is asked); 401 for none or one that is not ours."""
    token = _presented(headers)
    if token is None:
        raise key_missing()
    if token_equals(token, admin_token):
        return None
    key = _ours(find_key(token))
    if key is None:
        raise key_invalid()
    return key


def _admin(headers: Sequence[Header], admin_token: str) -> None:
    """The admin token, or 401/403 (a key never counts as the admin token)."""
    token = _presented(headers)
    if token is None:
        raise admin_token_missing()
    if not token_equals(token, admin_token):
        raise admin_token_invalid()


def _bound_key(headers: Sequence[Header], bound_key_id: str | None,
               find_key: Callable[[str], Stored | None]) -> Stored:
    """On the node listener: the key bound to the client's certificate, and no other (401
    for none or another, the admin token included)."""
    token = _presented(headers)
    if token is None:
        raise key_missing()
    key = find_key(token)
    if key is None or key.get("id") != bound_key_id:
        raise key_not_bound()
    return key


class Column(enum.Enum):
    """A listener's column of the access table: who its peers are
    (:class:`proxy.link.listener.Listener` names its own)."""

    LOCAL = "local"  # the Unix socket and the loopback-only TCP listeners (the local
    # fallback, the Ollama API's port): this machine's users; no key ever needed
    API = "api"  # the TCP API listener: a key from peers that are not this machine (and
    # from loopback too with api.require_auth)
    NODE = "node"  # SPEC §16's TLS listener: every peer remote, known by its certificate


class Step(enum.Enum):
    """One check of a cell of the access table, in the cell's order; the first that refuses
    decides."""

    PAIRED = "paired"  # a paired certificate (401 unpaired_certificate)
    SMALL_BODY = "small body"  # a Content-Length of at most 4 KiB, else 413 (chunked too)
    ELSEWHERE = "elsewhere"  # not served on this listener (404)
    OFFERED_KEY = "offered key"  # no key needed; one of ours offered is held to its limits
    KEY_FROM_REMOTE = "key from remote"  # a key from a remote peer (or with require_auth)
    BOUND_KEY = "bound key"  # the key bound to the client's certificate, no other (401)
    ADMIN_TOKEN = "admin token"  # the admin token (401/403)


_P, _S, _E = Step.PAIRED, Step.SMALL_BODY, Step.ELSEWHERE
_L, _A, _N = Column.LOCAL, Column.API, Column.NODE

# The access table: what a request at a level must show, by the column of the listener it
# came on. Every cap of a level (a claim's small body) holds in every column that serves it.
TABLE: Mapping[Access, Mapping[Column, tuple[Step, ...]]] = {
    Access.OPEN: {_L: (), _A: (), _N: (_P,)},
    Access.CLAIM: {_L: (_S,), _A: (_S,), _N: (_P, _S, Step.BOUND_KEY)},
    Access.PAIRING: {_L: (_S, _E), _A: (_S, _E), _N: (_S,)},
    Access.KEY: {_L: (Step.OFFERED_KEY,), _A: (Step.KEY_FROM_REMOTE,),
                 _N: (_P, Step.BOUND_KEY)},
    Access.ADMIN: {_L: (Step.ADMIN_TOKEN,), _A: (Step.ADMIN_TOKEN,),
                   _N: (_P, Step.ADMIN_TOKEN)},
}


def authorize(level: Access, column: Column, headers: Sequence[Header], *, loopback: bool,
              require_auth: bool, admin_token: str, find_key: Callable[[str], Stored | None],
              bound_key_id: str | None = None) -> Stored | None:
    """The decision for one request at ``level`` on a listener of ``column``
    (:data:`TABLE`), from a ``loopback`` peer or not: the stored access key it used, to be
    held to its limits, or None. ``find_key(token)`` is the stored key a presented token
    is (:func:`key_matches` over the stored keys), None for no key of ours; a key bound to
    a paired computer's certificate counts only on the node listener, as the key of the
    certificate it was bound to (``bound_key_id``, the id of the key bound to the client's
    certificate: None when it showed none, or is no paired peer's any more). Raises 401/403
    for a missing or wrong credential (the admin token passes where a key is asked, except
    on the node listener; a key never counts as the admin token), 413 for a body too large
    for the level, 404 for a level the listener does not serve."""
    key = None
    for step in TABLE[level][column]:
        if step is Step.OFFERED_KEY:
            key = _offered_key(headers, find_key)
        elif step is Step.KEY_FROM_REMOTE:
            key = _offered_key(headers, find_key) if loopback and not require_auth \
                else _needed_key(headers, admin_token, find_key)
        elif step is Step.PAIRED:
            if bound_key_id is None:
                raise unpaired_certificate()
        elif step is Step.SMALL_BODY:
            check_claim_body(headers)
        elif step is Step.ELSEWHERE:
            raise exchange_elsewhere()
        elif step is Step.BOUND_KEY:
            key = _bound_key(headers, bound_key_id, find_key)
        else:
            _admin(headers, admin_token)
    return key


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


def key_not_bound() -> SluiceError:
    """401 on the node listener for a key other than the one paired with the client's
    certificate (SPEC §16)."""
    return _auth_error(401, "on the node port only the access key paired with this "
                            "certificate is accepted", "invalid_api_key", challenge=True)


def exchange_elsewhere() -> SluiceError:
    """404 for the pairing exchange on a listener other than the node listener."""
    return SluiceError(404, "the pairing exchange is served on the node port (TLS), see "
                            "GET /health's nodePort", type="invalid_request_error",
                       code="not_found", source=Source.CLIENT)


def unpaired_certificate() -> SluiceError:
    """401 on the node listener for a client without a paired certificate (SPEC §16)."""
    return _auth_error(401, "this connection shows no paired certificate: the node port "
                            f"serves it only POST {PAIRING_EXCHANGE_PATH}",
                       "unpaired_certificate", challenge=False)


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
