"""Pairing on the computer that adds (SPEC §14): trade the code another computer gave out
for an access key of its, with one ``POST {baseUrl}/api/v1/pairing/claim``, over the
gateway's own upstream connections (:func:`proxy.upstream.pool.exchange`, as the node
identity lookup and the health checks), bounded by ``timeouts.connection`` to connect and
:data:`CLAIM_TIMEOUT` in all.

What the other computer answers becomes this gateway's answer to ``POST /api/v1/nodes``:
401 -> 422 naming ``pairingCode``; 429 -> 429 with its ``Retry-After``; no answer in time,
no connection or a broken answer -> 502. The code and the key never reach a log line or an
error message.
"""

from __future__ import annotations

import json
import logging
import socket

import trio

from protocol.access import PAIRING_CLAIM_PATH
from protocol.errors import (
    ConfigError,
    SluiceError,
    Source,
    rate_limit_error,
    upstream_bad_response,
    upstream_unreachable,
)
from protocol.headers import Header, header_value
from protocol.lan.pairing import parse_claim_answer
from protocol.names import MAX_LABEL, is_label
from protocol.upstream_url import UpstreamAddress
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, whole_exchange

__all__ = ["ANSWER_CAP", "CLAIM_TIMEOUT", "NOT_ACCEPTED", "answer_error", "ask", "claim_key",
           "computer_name"]

log = logging.getLogger("sluice.pairing")

CLAIM_TIMEOUT = 10.0  # seconds, at most, for the whole claim
ANSWER_CAP = 64 * 1024  # bytes of the other computer's answer read at most
NOT_ACCEPTED = ("the code was not accepted: wrong, used or expired (make a new one on the "
                "other computer with 'sluice pair')")


def computer_name() -> str:
    """This computer's name as the other one will call the key it gives (the host name);
    "" when it is not a printable label (the other side then uses our fingerprint)."""
    name = socket.gethostname().strip()[:MAX_LABEL]
    return name if is_label(name) else ""


def _remote_message(body: bytes) -> str:
    """The other side's error message, when it sent one we can show (short, printable)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return ""
    if not isinstance(message, str):
        return ""
    message = message[:200]
    return message if message.isprintable() else ""


def _retry_after(headers: list[Header]) -> bytes:
    value = header_value(headers, b"retry-after")
    if value is not None and value.isdigit() and len(value) <= 6:
        return value
    return b"60"


def _answer(status: int, headers: list[Header], body: bytes, url: str) -> tuple[str, str]:
    """``(fingerprint, key)`` from the other side's answer, or the error we answer."""
    if status != 200:
        raise answer_error(status, headers, body, url)
    try:
        found = parse_claim_answer(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        found = None
    if found is None:
        raise upstream_bad_response(f"{url} answered the pairing claim with something "
                                    "that is not a fingerprint and an access key")
    return found


def answer_error(status: int, headers: list[Header], body: bytes, url: str) -> SluiceError:
    """What we answer when the other side refused a claim or an exchange with ``status``:
    401 -> 422 naming ``pairingCode``; 429 -> 429 with its ``Retry-After``; else 502."""
    if status == 401:
        return ConfigError("pairingCode", NOT_ACCEPTED)
    if status == 429:
        retry = _retry_after(headers)
        return rate_limit_error(f"{url} refuses more pairing attempts for now; retry in "
                                f"{retry.decode()} s", retry, Source.UPSTREAM)
    said = _remote_message(body)
    if status == 404:
        hint = "it does not offer pairing (an older sluice, or not sluice at all?)"
    else:
        hint = f"it answered {status}" + (f": {said}" if said else "")
    return upstream_bad_response(f"{url} refused pairing: {hint}")


async def ask(connections: ConnectionPool, address: UpstreamAddress, url: str,
              method: bytes, path: bytes, headers: list[Header], body: bytes, *,
              connect_timeout: float) -> tuple[int, list[Header], bytes]:
    """One small exchange with the gateway at ``url`` for pairing: ``(status, headers,
    body)``, bounded by ``connect_timeout`` to connect and CLAIM_TIMEOUT in all; no
    connection or no answer in time -> the 502 we answer."""
    scope = trio.CancelScope(deadline=trio.current_time() + CLAIM_TIMEOUT)
    end = scope.deadline

    def connecting() -> None:
        scope.deadline = min(end, trio.current_time() + connect_timeout)

    def connected() -> None:
        scope.deadline = end

    status, answer_headers, answer = 0, [], b""
    with scope:
        try:
            head, answer = await whole_exchange(
                connections, address, method, address.target(path), headers, body,
                cap=ANSWER_CAP, on_connecting=connecting, on_connected=connected)
        except (UpstreamFailure, OSError, ValueError) as exc:
            log.info("pairing with %s failed: %s", url, type(exc).__name__)
            reason = str(exc) if isinstance(exc, UpstreamFailure) else type(exc).__name__
            raise upstream_unreachable(f"cannot pair with {url}: {reason}") from None
        status, answer_headers = head.status_code, head.headers
    if scope.cancelled_caught:
        log.info("pairing with %s failed: no answer in time", url)
        raise upstream_unreachable(f"cannot pair with {url}: no answer within "
                                   f"{CLAIM_TIMEOUT:g}s (connect: {connect_timeout:g}s)")
    return status, answer_headers, answer


async def claim_key(connections: ConnectionPool, address: UpstreamAddress, url: str, *,
                    code: str, fingerprint: str, name: str,
                    connect_timeout: float) -> tuple[str, str]:
    """Claim ``code`` at the gateway ``url`` (``address``) as ``fingerprint`` / ``name``:
    its ``(fingerprint, accessKey)``. Raises the SluiceError this gateway answers."""
    doc = {"code": code, "fingerprint": fingerprint}
    if name:
        doc["name"] = name
    body = json.dumps(doc).encode()
    headers: list[Header] = [(b"host", address.authority), (b"accept", b"application/json"),
                             (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]
    status, answer_headers, answer = await ask(
        connections, address, url, b"POST", PAIRING_CLAIM_PATH.encode(), headers, body,
        connect_timeout=connect_timeout)
    log.info("pairing with %s: it answered %d", url, status)
    return _answer(status, answer_headers, answer, url)
