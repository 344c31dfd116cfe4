"""The pairing exchange of SPEC §16, pure: SPAKE2 (the ``spake2`` package) with password =
the pairing code and identities = the two certificates' pins, then a key-confirmation MAC
each way over both pins. No I/O: the caller carries the messages over
``POST /api/v1/pairing/exchange`` and decides what to pin.

The roles: the *joiner* A holds B's code and connects to B's node port; the *host* B showed
the code. A runs ``SPAKE2_A`` with idA = A's pin and idB = the pin of the certificate B
presented in the TLS handshake; B runs ``SPAKE2_B`` with its own pin and the pin A claims.
A man in the middle who presents his own certificate to A makes A compute with his pin, so
the keys differ and B's check fails: nothing is pinned, one try of the code is spent.

Two round trips, ``{step, message, fingerprint, name}`` -> ``{message}``::

    step 1   A: Joiner.start()          -> B: HostSession.answer(msg) -> A
    step 2   A: Joiner.finish(reply)    -> B: HostSession.check(conf) -> A: Joiner.confirm()

``check`` answers None for a wrong confirmation (a wrong code, or someone in the middle:
the caller counts one of the 5 tries of §14); ``confirm`` False means A pins nothing.

Every object is single-use and moves one way; a call out of order, a malformed message and
anything the SPAKE2 arithmetic refuses raise :class:`PairingProtocolError` and nothing
else, and the object is spent. The code, the SPAKE2 key and the confirmations are never in a
``repr()`` or an error. ``spake2`` is imported only when an exchange begins.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final, Protocol

import attrs

from protocol.errors import SluiceError, bad_request
from protocol.lan.pairing import normalize_code
from protocol.lan.pinning import fingerprint_of, normalize_pin
from protocol.names import LABEL_RULE, is_fingerprint, is_label

__all__ = [
    "CONFIRMATION_SIZE",
    "EXCHANGE_FIELDS",
    "SPAKE2_MESSAGE_SIZE",
    "Exchange",
    "HostSession",
    "Joiner",
    "PairingProtocolError",
    "Welcome",
    "parse_exchange",
    "parse_welcome",
]

SPAKE2_MESSAGE_SIZE: Final = 33  # a side byte and an Ed25519 point
CONFIRMATION_SIZE: Final = 32  # HMAC-SHA256
MAX_MESSAGE_TEXT: Final = 64  # base64 characters: both messages are 44
EXCHANGE_FIELDS: Final = ("step", "message", "fingerprint", "name", "certificate")
MAX_CERTIFICATE: Final = 2048  # bytes of the joiner's certificate DER (Ed25519: ~300)
JOINER_LABEL: Final = b"sluice-pair-A"
HOST_LABEL: Final = b"sluice-pair-B"


class PairingProtocolError(ValueError):
    """A pairing exchange gone wrong: a call out of order, a malformed message. Its text is
    one of a few fixed sentences (never a code, a key or a message)."""


class _Spake2(Protocol):
    """What is used of ``spake2.SPAKE2_A`` / ``SPAKE2_B`` (untyped package)."""

    def start(self) -> bytes: ...

    def finish(self, inbound: bytes) -> bytes: ...


def _spake2(role: str, code: str, joiner_fp: str, host_fp: str) -> _Spake2:
    import spake2  # here: only an exchange needs it (SPEC §16)

    kind = spake2.SPAKE2_A if role == "A" else spake2.SPAKE2_B
    made: _Spake2 = kind(code.encode(), idA=joiner_fp.encode(), idB=host_fp.encode())
    return made


def _decode(text: object, size: int, what: str) -> bytes:
    """Strict base64 of exactly ``size`` bytes, else PairingProtocolError."""
    if not isinstance(text, str) or len(text) > MAX_MESSAGE_TEXT or not text.isascii():
        raise PairingProtocolError(f"the {what} is not base64 text of {size} bytes")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise PairingProtocolError(f"the {what} is not base64 text of {size} bytes") from None
    if len(raw) != size:
        raise PairingProtocolError(f"the {what} is not base64 text of {size} bytes")
    return raw


def _encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _code(code: str) -> str:
    digits = normalize_code(code)
    if digits is None:
        raise PairingProtocolError("the pairing code is not six digits")
    return digits


def _pin(value: str, whose: str) -> str:
    pin = normalize_pin(value)
    if pin is None:
        raise PairingProtocolError(f"{whose} fingerprint is not a sha256: pin")
    return pin


def _confirmation(key: bytes, label: bytes, joiner_fp: str, host_fp: str) -> bytes:
    return hmac.new(key, label + joiner_fp.encode() + host_fp.encode(), hashlib.sha256).digest()


class _Step(enum.Enum):
    NEW = "new"
    STARTED = "started"  # the joiner sent step 1 / the host answered it
    FINISHED = "finished"  # the joiner sent its confirmation
    DONE = "done"  # confirmed, refused or failed: the object is spent


class _Session:
    """What both roles share: the SPAKE2 side, the two pins, where the exchange is."""

    __slots__ = ("_key", "_spake", "_step", "host_fp", "joiner_fp")

    def __init__(self, role: str, code: str, joiner_fp: str, host_fp: str) -> None:
        self.joiner_fp = _pin(joiner_fp, "the joiner's")
        self.host_fp = _pin(host_fp, "the host's")
        self._spake = _spake2(role, _code(code), self.joiner_fp, self.host_fp)
        self._key: bytes | None = None
        self._step = _Step.NEW

    def __repr__(self) -> str:  # never the code, the key or a confirmation
        return (f"{type(self).__name__}({self._step.value}, joiner={self.joiner_fp}, "
                f"host={self.host_fp})")

    def _expect(self, step: _Step, call: str) -> None:
        if self._step is not step:
            error = PairingProtocolError(f"{call}() called out of order (the exchange is "
                                         f"{self._step.value}; each object is single-use)")
            self._spent()
            raise error

    def _spent(self) -> None:
        self._step = _Step.DONE
        self._key = None

    def _start(self) -> bytes:
        message = self._spake.start()
        self._step = _Step.STARTED
        return message

    def _decode(self, text: str, size: int, what: str) -> bytes:
        """:func:`_decode`, spending the object when ``text`` is malformed."""
        try:
            return _decode(text, size, what)
        except PairingProtocolError:
            self._spent()
            raise

    def _finish(self, inbound: bytes) -> None:
        """The SPAKE2 key from the peer's step-1 message (decoded)."""
        try:
            self._key = self._spake.finish(inbound)
        except Exception:  # the package raises several kinds for a bad point or side
            self._spent()
            raise PairingProtocolError("the SPAKE2 message was refused") from None

    def _mac(self, label: bytes) -> bytes:
        assert self._key is not None
        return _confirmation(self._key, label, self.joiner_fp, self.host_fp)


class Joiner(_Session):
    """A's side: it holds B's ``code``; ``own_fp`` is its certificate's pin, ``host_fp`` the
    pin of the certificate B presented in the TLS handshake."""

    __slots__ = ()

    def __init__(self, code: str, own_fp: str, host_fp: str) -> None:
        super().__init__("A", code, own_fp, host_fp)

    def start(self) -> str:
        """Step 1's ``message``: A's SPAKE2 message (base64)."""
        self._expect(_Step.NEW, "start")
        return _encode(self._start())

    def finish(self, host_message_b64: str) -> str:
        """Step 2's ``message`` from B's answer to step 1: A's key confirmation (base64)."""
        self._expect(_Step.STARTED, "finish")
        self._finish(self._decode(host_message_b64, SPAKE2_MESSAGE_SIZE, "SPAKE2 message"))
        self._step = _Step.FINISHED
        return _encode(self._mac(JOINER_LABEL))

    def confirm(self, host_confirmation_b64: str) -> bool:
        """Whether B's answer to step 2 is B's confirmation: only then may A trust what came
        with it and pin B. The object is spent either way."""
        self._expect(_Step.FINISHED, "confirm")
        try:
            got = _decode(host_confirmation_b64, CONFIRMATION_SIZE, "key confirmation")
            return hmac.compare_digest(got, self._mac(HOST_LABEL))
        finally:
            self._spent()


class HostSession(_Session):
    """B's side: it showed ``code``; ``own_fp`` is its certificate's pin, ``joiner_fp`` the
    pin A sent in step 1."""

    __slots__ = ()

    def __init__(self, code: str, own_fp: str, joiner_fp: str) -> None:
        super().__init__("B", code, joiner_fp, own_fp)

    def answer(self, joiner_message_b64: str) -> str:
        """Step 1's answer: B's SPAKE2 message (base64)."""
        self._expect(_Step.NEW, "answer")
        inbound = self._decode(joiner_message_b64, SPAKE2_MESSAGE_SIZE, "SPAKE2 message")
        message = self._start()  # a malformed message costs no arithmetic
        self._finish(inbound)
        return _encode(message)

    def check(self, joiner_confirmation_b64: str) -> str | None:
        """Step 2: B's own confirmation (base64) when A's is right; None when it is wrong (a
        wrong code, or a man in the middle). The object is spent either way."""
        self._expect(_Step.STARTED, "check")
        try:
            got = _decode(joiner_confirmation_b64, CONFIRMATION_SIZE, "key confirmation")
            if not hmac.compare_digest(got, self._mac(JOINER_LABEL)):
                return None
            return _encode(self._mac(HOST_LABEL))
        finally:
            self._spent()


# ----------------------------------------------------------------------- the request's body


@attrs.frozen
class Exchange:
    """One ``POST /api/v1/pairing/exchange`` body, checked: step 1 or 2, the message (base64
    of the step's size), the joiner's pin and its name ("" when it gave none)."""

    step: int
    message: str = attrs.field(repr=False)
    fingerprint: str
    name: str
    certificate: bytes = attrs.field(default=b"", repr=False)  # step 1: the joiner's DER

    @property
    def key_name(self) -> str:
        """What the access key made for the joiner is called: its name, else its pin."""
        return self.name or self.fingerprint


def _bad(field: str, message: str) -> SluiceError:
    return bad_request(f"{field}: {message}", param=field)


def parse_exchange(doc: Mapping[str, Any]) -> Exchange:
    """``{step, message, fingerprint, name?, certificate}``; 400 with ``param`` naming the
    field (never echoing a message). Step 1 carries the joiner's certificate (base64 DER),
    which must hash to ``fingerprint``: the host trusts it at its handshakes once paired,
    and it never saw it otherwise (the joiner pairs without presenting it)."""
    for field in doc:
        if field not in EXCHANGE_FIELDS:
            raise _bad(str(field)[:64], f"unknown field; expected one of "
                                        f"{', '.join(EXCHANGE_FIELDS)}")
    step = doc.get("step")
    if type(step) is not int or step not in (1, 2):
        raise _bad("step", "expected 1 or 2")
    size = SPAKE2_MESSAGE_SIZE if step == 1 else CONFIRMATION_SIZE
    message = doc.get("message")
    try:
        _decode(message, size, "message")
    except PairingProtocolError:
        raise _bad("message", f"expected base64 text of {size} bytes for step {step}") \
            from None
    assert isinstance(message, str)
    fingerprint = normalize_pin(doc.get("fingerprint"))
    if fingerprint is None:
        raise _bad("fingerprint", "expected the joining node's certificate pin: 'sha256:' "
                                  "and 64 hex digits")
    name = doc.get("name")
    if name is None:
        name = ""
    if not is_label(name):
        raise _bad("name", LABEL_RULE)
    certificate = b""
    if step == 1:
        certificate = _certificate(doc.get("certificate"))
        if fingerprint_of(certificate) != fingerprint:
            raise _bad("certificate", "its SHA-256 is not the fingerprint sent with it")
    elif "certificate" in doc:
        raise _bad("certificate", "sent in step 1 only")
    return Exchange(step, message, fingerprint, name.strip(), certificate)


def _certificate(text: object) -> bytes:
    """Step 1's ``certificate``: base64 of a DER of at most MAX_CERTIFICATE bytes."""
    problem = _bad("certificate", "expected the joining node's certificate: base64 of its "
                                  f"DER, at most {MAX_CERTIFICATE} bytes")
    if not isinstance(text, str) or not text.isascii() or len(text) > MAX_CERTIFICATE * 4 // 3 + 4:
        raise problem
    try:
        der = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise problem from None
    if not der or len(der) > MAX_CERTIFICATE:
        raise problem
    return der


@attrs.frozen
class Welcome:
    """The host's answer to step 2 as the joiner reads it: the host's confirmation, then,
    to be trusted only once that confirmation checks, its node id, name and the access key
    it made for the joiner."""

    message: str = attrs.field(repr=False)
    node_id: str
    name: str
    access_key: str = attrs.field(repr=False)


def parse_welcome(doc: object) -> Welcome | None:
    """``{message, fingerprint, name, accessKey}`` from the host; None when it is not that."""
    if not isinstance(doc, dict):
        return None
    message, node_id, key = doc.get("message"), doc.get("fingerprint"), doc.get("accessKey")
    name = doc.get("name") or ""
    if not isinstance(message, str) or not is_fingerprint(node_id) or not is_label(name) \
            or not isinstance(key, str) or not key or len(key) > 4096:
        return None
    return Welcome(message, node_id, name.strip(), key)
