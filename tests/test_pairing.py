"""Pairing's rules (SPEC §14), pure (protocol/lan/pairing.py) on plain numbers, and its holder
(proxy/lan/pairing.py) on trio's MockClock: six random digits, 5 minutes, one use, 5 wrong
tries and the code is void, a new code replaces the old one, cancel; the claims a minute
per peer address and their Retry-After, the bounded table of addresses; the claim's body
checked naming the field; nothing shows a code."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from protocol.errors import ConfigError, SluiceError
from protocol.lan.pairing import (
    CLAIMS_PER_MINUTE,
    CODE_LIFETIME,
    MAX_CLAIM_BODY,
    MAX_PEERS,
    MAX_TRIES,
    ClaimRateLimit,
    CodeState,
    Outcome,
    PairingState,
    check_claim_body,
    claim_rate_limited,
    code_not_accepted,
    new_code,
    normalize_code,
    parse_claim,
    parse_claim_answer,
    shown_code,
)
from proxy.cli import pair as cli_pair
from proxy.cli.pair import valid_until
from proxy.lan.pairing import Pairing
from proxy.notifications import Notifications
from proxy.observe.hub import Hub

T0 = 1000.0


def test_codes_are_six_random_digits() -> None:
    codes = {new_code() for _ in range(2000)}
    assert all(len(c) == 6 and c.isdigit() for c in codes)
    assert len(codes) > 1900  # random: 2000 draws of 10**6 rarely repeat
    assert any(c.startswith("0") for c in {new_code() for _ in range(5000)})  # zeros kept


@pytest.mark.parametrize(("typed", "digits"), [
    ("123456", "123456"), ("123 456", "123456"), ("123-456", "123456"), (" 012345 ", "012345"),
    ("12345", None), ("1234567", None), ("12345a", None), (123456, None), (None, None),
    ("١٢٣٤٥٦", None), ("1" * 40, None)])
def test_a_code_as_typed(typed: object, digits: str | None) -> None:
    assert normalize_code(typed) == digits


def test_shown_code() -> None:
    assert shown_code("012345") == "012 345"


def test_one_use() -> None:
    state = PairingState()
    issued = state.issue("123456", T0)
    assert (issued.expires, issued.replaced) == (T0 + CODE_LIFETIME, False)
    assert state.claim("123456", T0 + 1, "laptop") is Outcome.ACCEPTED
    code = state.view(T0 + 2)
    assert code is not None
    assert (code.state, code.claimed_by) == (CodeState.CLAIMED, "laptop")
    assert state.claim("123456", T0 + 2, "other") is Outcome.NO_CODE
    assert state.view(T0 + 2).claimed_by == "laptop"  # type: ignore[union-attr]


def test_no_code_at_all() -> None:
    state = PairingState()
    assert state.view(T0) is None
    assert state.claim("123456", T0, "x") is Outcome.NO_CODE
    assert state.cancel(T0) is False


def test_expiry_at_five_minutes() -> None:
    state = PairingState()
    state.issue("123456", T0)
    assert state.view(T0 + CODE_LIFETIME - 0.001).state is CodeState.ACTIVE  # type: ignore[union-attr]
    assert state.view(T0 + CODE_LIFETIME).state is CodeState.EXPIRED  # type: ignore[union-attr]
    assert state.claim("123456", T0 + CODE_LIFETIME, "x") is Outcome.NO_CODE
    # Claimed at the last moment still counts.
    state.issue("654321", T0)
    assert state.claim("654321", T0 + CODE_LIFETIME - 0.001, "x") is Outcome.ACCEPTED


def test_five_wrong_tries_void_the_code() -> None:
    state = PairingState()
    state.issue("123456", T0)
    for left in range(MAX_TRIES - 1, 0, -1):
        assert state.claim("000000", T0 + 1, "x") is Outcome.WRONG
        assert state.view(T0 + 1).tries_left == left  # type: ignore[union-attr]
    assert state.claim("000001", T0 + 1, "x") is Outcome.VOIDED
    assert state.view(T0 + 1).state is CodeState.VOID  # type: ignore[union-attr]
    assert state.claim("123456", T0 + 2, "x") is Outcome.NO_CODE  # even the right one


def test_a_right_code_after_wrong_ones() -> None:
    state = PairingState()
    state.issue("123456", T0)
    for _ in range(MAX_TRIES - 1):
        state.claim("999999", T0, "x")
    assert state.claim("123456", T0, "x") is Outcome.ACCEPTED


def test_an_exchange_settles_against_the_code_it_began_with() -> None:
    """SPEC §16: the PAKE's outcome counts as a claim would; an exchange begun against a
    code that was replaced, cancelled or expired meanwhile claims nothing."""
    state = PairingState()
    state.issue("123456", T0)
    code = state.view(T0)
    assert code is not None
    for left in range(MAX_TRIES - 1, 0, -1):
        assert state.settle(code, False, T0 + 1, "x") is Outcome.WRONG
        assert code.tries_left == left
    assert state.settle(code, True, T0 + 2, "laptop") is Outcome.ACCEPTED
    assert (code.state, code.claimed_by) == (CodeState.CLAIMED, "laptop")
    assert state.settle(code, True, T0 + 2, "again") is Outcome.NO_CODE  # one use
    state.issue("111111", T0 + 3)
    old = state.view(T0 + 3)
    state.issue("222222", T0 + 4)
    assert old is not None
    assert state.settle(old, True, T0 + 5, "x") is Outcome.NO_CODE  # replaced
    assert state.view(T0 + 5).state is CodeState.ACTIVE  # type: ignore[union-attr]
    new = state.view(T0 + 5)
    assert new is not None
    assert state.settle(new, True, T0 + 4 + CODE_LIFETIME, "x") is Outcome.NO_CODE  # expired
    state.issue("333333", T0 + 9000)
    last = state.view(T0 + 9000)
    assert last is not None
    for _ in range(MAX_TRIES - 1):
        state.settle(last, False, T0 + 9001, "x")
    assert state.settle(last, False, T0 + 9001, "x") is Outcome.VOIDED
    assert state.settle(last, True, T0 + 9001, "x") is Outcome.NO_CODE


def test_a_new_code_replaces_the_old_one() -> None:
    state = PairingState()
    state.issue("111111", T0)
    second = state.issue("222222", T0 + 10)
    assert second.replaced is True
    assert state.view(T0 + 10).expires == T0 + 10 + CODE_LIFETIME  # type: ignore[union-attr]
    assert state.claim("111111", T0 + 11, "x") is Outcome.WRONG  # the old one is just wrong
    assert state.view(T0 + 11).tries_left == MAX_TRIES - 1  # type: ignore[union-attr]
    assert state.claim("222222", T0 + 12, "x") is Outcome.ACCEPTED
    # Nothing unused is replaced after a claim, an expiry, a cancel.
    assert state.issue("333333", T0 + 13).replaced is False
    assert state.issue("444444", T0 + 13 + CODE_LIFETIME * 2).replaced is False
    state.issue("555555", T0 + 2000)
    assert state.cancel(T0 + 2001) is True
    assert state.issue("666666", T0 + 2002).replaced is False


def test_cancel() -> None:
    state = PairingState()
    state.issue("123456", T0)
    assert state.cancel(T0 + 1) is True
    assert state.view(T0 + 1).state is CodeState.CANCELLED  # type: ignore[union-attr]
    assert state.claim("123456", T0 + 2, "x") is Outcome.NO_CODE
    assert state.cancel(T0 + 3) is False


def test_the_claim_rate_limit_per_peer() -> None:
    limit = ClaimRateLimit()
    for _ in range(CLAIMS_PER_MINUTE):  # the burst
        assert limit.take("10.0.0.9", T0) is None
    assert limit.take("10.0.0.9", T0) == 12  # one claim per 60/5 s
    assert limit.take("10.0.0.8", T0) is None  # another address has its own budget
    assert limit.take("10.0.0.9", T0 + 5) == 7
    assert limit.take("10.0.0.9", T0 + 12) is None  # refilled by one
    assert limit.take("10.0.0.9", T0 + 12) == 12
    assert limit.take("10.0.0.9", T0 + 12 + 60) is None  # a minute refills the burst...
    for _ in range(CLAIMS_PER_MINUTE - 1):
        assert limit.take("10.0.0.9", T0 + 12 + 60) is None
    assert limit.take("10.0.0.9", T0 + 12 + 60) is not None  # ...and no more
    error = claim_rate_limited(12)
    assert (error.status, error.headers) == (429, ((b"retry-after", b"12"),))
    assert error.code == "rate_limit_exceeded"


def test_the_table_of_peers_is_bounded() -> None:
    assert MAX_PEERS == 1024
    limit = ClaimRateLimit(rate=1, max_peers=3)
    for peer in ("a", "b", "c"):
        assert limit.take(peer, T0) is None
    assert limit.take("a", T0) is not None  # a is the most recent now
    assert limit.take("d", T0) is None  # b, the least recently seen, goes
    assert len(limit) == 3
    assert "b" not in limit
    assert ("a" in limit, "c" in limit, "d" in limit) == (True, True, True)
    assert limit.take("b", T0) is None  # back with a full budget
    assert "c" not in limit
    big = ClaimRateLimit()
    for n in range(MAX_PEERS + 500):
        big.take(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", T0)
    assert len(big) == MAX_PEERS


def _claim(**fields: Any) -> dict[str, Any]:
    return {"code": "123 456", "fingerprint": "node-abc", "name": "laptop", **fields}


def test_the_claims_body() -> None:
    claim = parse_claim(_claim())
    assert (claim.code, claim.fingerprint, claim.name, claim.key_name) == \
        ("123456", "node-abc", "laptop", "laptop")
    assert "123456" not in repr(claim)
    nameless = parse_claim({"code": "123456", "fingerprint": "node-abc"})
    assert nameless.key_name == "node-abc"
    assert parse_claim(_claim(name="  ")).key_name == "node-abc"
    assert parse_claim(_claim(name=None)).key_name == "node-abc"


@pytest.mark.parametrize(("doc", "param"), [
    ({"fingerprint": "node-abc"}, "code"),
    (_claim(code=123456), "code"),
    (_claim(code="12345"), "code"),
    (_claim(code="abcdef"), "code"),
    ({"code": "123456"}, "fingerprint"),
    (_claim(fingerprint="-bad"), "fingerprint"),
    (_claim(fingerprint="a" * 65), "fingerprint"),
    (_claim(fingerprint=7), "fingerprint"),
    (_claim(name=5), "name"),
    (_claim(name="x" * 101), "name"),
    (_claim(name="line\nbreak"), "name"),
    (_claim(extra=1), "extra"),
])
def test_a_bad_claim_names_the_field(doc: dict[str, Any], param: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_claim(doc)
    assert (caught.value.status, caught.value.param) == (422, param)
    code = doc.get("code")
    if isinstance(code, str):
        assert code not in caught.value.message


def test_the_claims_body_size() -> None:
    check_claim_body([(b"content-length", str(MAX_CLAIM_BODY).encode())])
    check_claim_body([])
    for headers in ([(b"content-length", str(MAX_CLAIM_BODY + 1).encode())],
                    [(b"transfer-encoding", b"chunked")]):
        with pytest.raises(SluiceError) as caught:
            check_claim_body(headers)
        assert caught.value.status == 413


def test_the_claim_answer() -> None:
    assert parse_claim_answer({"fingerprint": "node-b", "accessKey": "sk-sluice-x"}) == \
        ("node-b", "sk-sluice-x")
    for bad in (None, [], {"fingerprint": "node-b"}, {"accessKey": "k"},
                {"fingerprint": "-x", "accessKey": "k"}, {"fingerprint": "n", "accessKey": ""}):
        assert parse_claim_answer(bad) is None


def test_one_answer_for_every_refusal() -> None:
    error = code_not_accepted()
    assert (error.status, error.type, error.code) == (401, "invalid_request_error",
                                                      "invalid_pairing_code")
    assert error.to_dict()["message"] == (
        "the pairing code was not accepted: it is wrong, used or expired (make a new one "
        "with 'sluice pair')")


def test_no_repr_shows_the_code() -> None:
    state = PairingState()
    issued = state.issue("987654", T0)
    assert "987654" not in repr(issued)
    assert "987654" not in repr(state)
    assert "987654" not in repr(state.view(T0))


# ----------------------------------------------------------------- the gateway's holder


def _holder() -> tuple[Pairing, list[dict[str, Any]], Notifications]:
    hub = Hub()
    seen: list[dict[str, Any]] = []
    hub.subscribe(lambda kind, at, data: seen.append(data), ("pairing",))
    notes = Notifications(hub)
    return Pairing(hub, notes, wall=lambda: 1_700_000_000.0), seen, notes


async def test_the_holder_on_the_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    pairing, seen, notes = _holder()
    assert pairing.view() == {"active": False, "state": "none", "expiresAt": None,
                              "triesLeft": None, "name": None}
    made = pairing.issue()
    assert made == {"code": made["code"], "expiresAt": "2023-11-14T22:18:20Z",
                    "replaced": False}
    assert seen[-1] == {"active": True, "state": "active", "expiresAt": "2023-11-14T22:18:20Z",
                        "triesLeft": 5, "name": None}
    assert made["code"] not in repr(seen)
    await trio.sleep(CODE_LIFETIME - 1)
    assert pairing.view()["active"] is True
    await trio.sleep(1)
    assert pairing.view() == {"active": False, "state": "expired",
                              "expiresAt": "2023-11-14T22:18:20Z", "triesLeft": 0,
                              "name": None}
    with pytest.raises(SluiceError) as caught:
        pairing.claim(parse_claim(_claim(code=made["code"])), "10.0.0.1")
    assert caught.value.status == 401
    assert notes.all() == []


async def test_the_holder_claims_and_tells(autojump_clock: trio.testing.MockClock) -> None:
    pairing, seen, notes = _holder()
    first = pairing.issue()
    assert pairing.issue()["replaced"] is True
    wrong = "000000" if first["code"] != "000000" else "000001"
    with pytest.raises(SluiceError):
        pairing.claim(parse_claim(_claim(code=wrong)), "10.0.0.1")
    assert seen[-1]["triesLeft"] == 4
    code = pairing._state.view(trio.current_time()).value  # type: ignore[union-attr]
    pairing.claim(parse_claim(_claim(code=code)), "10.0.0.1")
    assert seen[-1]["state"] == "active"  # told once the key is saved
    pairing.paired("laptop", "ak-1")
    assert seen[-1] == {"active": False, "state": "claimed", "expiresAt": first["expiresAt"],
                        "triesLeft": 0, "name": "laptop"}
    [note] = notes.all()
    assert (note["code"], note["level"], note["message"]) == \
        ("pairing_claimed", "info", "laptop connected with a pairing code")
    assert pairing.cancel() is False


async def test_the_holders_rate_limit(autojump_clock: trio.testing.MockClock) -> None:
    pairing, _, _ = _holder()
    for _ in range(CLAIMS_PER_MINUTE):
        pairing.admit("10.0.0.7")
    with pytest.raises(SluiceError) as caught:
        pairing.admit("10.0.0.7")
    assert (caught.value.status, caught.value.headers) == (429, ((b"retry-after", b"12"),))
    pairing.admit("")  # a local client: a peer of its own
    await trio.sleep(12)
    pairing.admit("10.0.0.7")


# ----------------------------------------------------------------- sluice pair's text


def test_valid_until() -> None:
    expires = "2025-01-31T12:05:00Z"
    stamp = datetime(2025, 1, 31, 12, 5, tzinfo=UTC)
    local = stamp.astimezone().strftime("%H:%M")
    assert valid_until(expires, stamp.timestamp() - 300) == f"{local}, 5 minutes"
    assert valid_until(expires, stamp.timestamp() - 50) == f"{local}, 1 minute"
    assert valid_until(expires, stamp.timestamp() + 9) == f"{local}, 0 minutes"
    assert valid_until("soon", 0) == "soon"


@pytest.mark.parametrize(("api", "lan", "url", "noted"), [
    ({"enabled": True, "allowExternalAccess": True, "restartRequired": False}, "192.168.1.50",
     "http://192.168.1.50:39080", None),
    ({"enabled": True, "allowExternalAccess": False, "restartRequired": False}, "192.168.1.50",
     "http://127.0.0.1:39080", "external access is off"),
    ({"enabled": True, "allowExternalAccess": True, "restartRequired": True}, "192.168.1.50",
     "http://127.0.0.1:39080", "external access is off"),
    ({"enabled": False, "allowExternalAccess": True, "restartRequired": False}, None,
     "http://<this computer's address>:<port>", "TCP API is off"),
])
def test_where_the_other_computer_connects(monkeypatch: pytest.MonkeyPatch, api: dict[str, Any],
                                           lan: str | None, url: str, noted: str | None
                                           ) -> None:
    monkeypatch.setattr(cli_pair, "call", lambda *args, **kw: api)
    monkeypatch.setattr(cli_pair, "lan_address", lambda: lan)
    port = 39080 if api["enabled"] else None
    found, notes = cli_pair._where(Path("/nonexistent"), port)
    assert found == url
    if noted is None:
        assert notes == []
    else:
        assert noted in notes[0]


def test_without_a_default_route_the_command_names_host_local(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # <host>.local passes the other side's Host guard (SPEC §14) and mDNS resolves it.
    monkeypatch.setattr(cli_pair, "call", lambda *args, **kw: {
        "enabled": True, "allowExternalAccess": True, "restartRequired": False})
    monkeypatch.setattr(cli_pair, "lan_address", lambda: None)
    monkeypatch.setattr(cli_pair.socket, "gethostname", lambda: "studio.example.org")
    assert cli_pair._where(Path("/nonexistent"), 39080) == ("http://studio.local:39080", [])


def test_the_lan_address_is_never_loopback() -> None:
    address = cli_pair.lan_address()  # sends nothing: a UDP socket is only connected
    assert address is None or not address.startswith("127.")
