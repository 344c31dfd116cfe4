"""The pairing exchange of SPEC §16, pure (protocol/lan/pake.py): SPAKE2 over the code with
both certificates' pins as identities, then a key confirmation each way. The same code on
both sides confirms both ways; a wrong code, or a man in the middle with his own
certificate, fails at the host's check; the joiner checks the host's confirmation; calls out
of order and malformed messages raise PairingProtocolError and nothing else; the exchange
body is checked naming the field; no repr or error shows the code or a key."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import SluiceError
from protocol.lan.pake import (
    CONFIRMATION_SIZE,
    SPAKE2_MESSAGE_SIZE,
    Exchange,
    HostSession,
    Joiner,
    PairingProtocolError,
    Welcome,
    parse_exchange,
    parse_welcome,
)
from protocol.lan.pinning import fingerprint_of

CERT_A = b"joiner's certificate"  # stands in for a DER: only its hash matters here
FP_A = fingerprint_of(CERT_A)
FP_B = fingerprint_of(b"host's certificate")
FP_M = fingerprint_of(b"the man in the middle's certificate")
CODE = "402913"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def run(joiner: Joiner, host: HostSession) -> tuple[str | None, bool | None]:
    """The two round trips: the host's confirmation (None: refused) and the joiner's verdict
    on it (None when there was none to check)."""
    reply = host.answer(joiner.start())
    confirmation = host.check(joiner.finish(reply))
    if confirmation is None:
        return None, None
    return confirmation, joiner.confirm(confirmation)


def test_the_same_code_confirms_both_ways() -> None:
    joiner, host = Joiner("402 913", FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    confirmation, trusted = run(joiner, host)
    assert confirmation is not None
    assert len(base64.b64decode(confirmation)) == CONFIRMATION_SIZE
    assert trusted is True


def test_the_pins_are_normalized_before_they_are_used() -> None:
    joiner = Joiner(CODE, FP_A.upper(), FP_B.upper())
    assert run(joiner, HostSession(CODE, FP_B, FP_A))[1] is True


def test_a_wrong_code_fails_the_hosts_check() -> None:
    assert run(Joiner("402914", FP_A, FP_B), HostSession(CODE, FP_B, FP_A)) == (None, None)


def test_a_man_in_the_middle_with_his_own_certificate_fails_the_hosts_check() -> None:
    # He relays every message, but the joiner saw his certificate in the TLS handshake, so it
    # computes with his pin while the host uses its own: same code, different keys.
    joiner = Joiner(CODE, FP_A, FP_M)
    host = HostSession(CODE, FP_B, FP_A)
    assert run(joiner, host) == (None, None)


def test_a_joiner_lying_about_its_pin_fails_the_hosts_check() -> None:
    joiner = Joiner(CODE, FP_M, FP_B)
    host = HostSession(CODE, FP_B, FP_A)
    assert run(joiner, host) == (None, None)


def test_the_joiner_checks_the_hosts_confirmation() -> None:
    joiner, host = Joiner(CODE, FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    confirmation = host.check(joiner.finish(host.answer(joiner.start())))
    assert confirmation is not None
    forged = bytearray(base64.b64decode(confirmation))
    forged[0] ^= 1
    assert joiner.confirm(b64(bytes(forged))) is False


def test_the_joiners_confirmation_is_not_the_hosts() -> None:
    # A host that echoes the joiner's own confirmation back is not trusted.
    joiner, host = Joiner(CODE, FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    mine = joiner.finish(host.answer(joiner.start()))
    assert joiner.confirm(mine) is False


def test_a_malformed_host_confirmation_raises_and_spends_the_joiner() -> None:
    joiner, host = Joiner(CODE, FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    joiner.finish(host.answer(joiner.start()))
    with pytest.raises(PairingProtocolError):
        joiner.confirm("not base64!")
    with pytest.raises(PairingProtocolError, match="out of order"):
        joiner.confirm(b64(bytes(CONFIRMATION_SIZE)))


def test_a_reflected_message_is_refused() -> None:
    host = HostSession(CODE, FP_B, FP_A)
    other = HostSession(CODE, FP_B, FP_A)
    with pytest.raises(PairingProtocolError):
        host.answer(other.answer(Joiner(CODE, FP_A, FP_B).start()))  # a B message to a B


def test_each_exchange_is_fresh() -> None:
    one, two = Joiner(CODE, FP_A, FP_B), Joiner(CODE, FP_A, FP_B)
    assert one.start() != two.start()


def test_calls_out_of_order_raise_and_spend_the_object() -> None:
    joiner = Joiner(CODE, FP_A, FP_B)
    with pytest.raises(PairingProtocolError, match=r"finish\(\) called out of order"):
        joiner.finish(b64(bytes(SPAKE2_MESSAGE_SIZE)))
    with pytest.raises(PairingProtocolError, match="out of order"):
        joiner.start()  # spent by the call before

    joiner, host = Joiner(CODE, FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    message = joiner.start()
    with pytest.raises(PairingProtocolError, match=r"start\(\) called out of order"):
        joiner.start()
    reply = host.answer(message)
    with pytest.raises(PairingProtocolError, match=r"answer\(\) called out of order"):
        host.answer(message)  # a replayed step 1
    with pytest.raises(PairingProtocolError, match="out of order"):
        host.check(b64(bytes(CONFIRMATION_SIZE)))
    with pytest.raises(PairingProtocolError, match="out of order"):
        joiner.finish(reply)

    host = HostSession(CODE, FP_B, FP_A)
    with pytest.raises(PairingProtocolError, match=r"check\(\) called out of order"):
        host.check(b64(bytes(CONFIRMATION_SIZE)))

    joiner, host = Joiner(CODE, FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    assert run(joiner, host)[1] is True
    with pytest.raises(PairingProtocolError, match="out of order"):
        joiner.confirm(b64(bytes(CONFIRMATION_SIZE)))
    assert isinstance(PairingProtocolError("x"), ValueError)


def test_a_failed_check_spends_the_host() -> None:
    joiner, host = Joiner("000000", FP_A, FP_B), HostSession(CODE, FP_B, FP_A)
    confirmation = joiner.finish(host.answer(joiner.start()))
    assert host.check(confirmation) is None
    with pytest.raises(PairingProtocolError, match="out of order"):
        host.check(confirmation)


@pytest.mark.parametrize(("code", "fp_a", "fp_b"), [
    ("12345", FP_A, FP_B), ("abcdef", FP_A, FP_B), ("", FP_A, FP_B),
    (CODE, "node-a", FP_B), (CODE, FP_A, FP_B[:-1]), (CODE, FP_A, ""),
])
def test_bad_arguments_raise_pairing_protocol_error(code: str, fp_a: str, fp_b: str) -> None:
    with pytest.raises(PairingProtocolError):
        Joiner(code, fp_a, fp_b)
    with pytest.raises(PairingProtocolError):
        HostSession(code, fp_b, fp_a)


@pytest.mark.parametrize("message", [
    "", "====", "not base64!", b64(bytes(SPAKE2_MESSAGE_SIZE - 1)),
    b64(bytes(SPAKE2_MESSAGE_SIZE + 1)), b64(b"A" + bytes(32)), b64(b"B" + bytes(32)),
    b64(b"C" + bytes(32)), b64(b"A" + b"\xff" * 32), b64(bytes(SPAKE2_MESSAGE_SIZE)) + "\n",
    b64(bytes(SPAKE2_MESSAGE_SIZE)).replace("A", "-"), "é" * 44, "A" * 10_000,
])
def test_malformed_spake2_messages_raise_pairing_protocol_error(message: str) -> None:
    with pytest.raises(PairingProtocolError):
        HostSession(CODE, FP_B, FP_A).answer(message)
    joiner = Joiner(CODE, FP_A, FP_B)
    joiner.start()
    with pytest.raises(PairingProtocolError):
        joiner.finish(message)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=80), st.binary(min_size=33, max_size=33).map(b64),
                 st.binary(max_size=40).map(b64)))
def test_fuzz_the_host_raises_only_pairing_protocol_error(message: str) -> None:
    host = HostSession(CODE, FP_B, FP_A)
    try:
        reply = host.answer(message)
    except PairingProtocolError:
        return
    assert len(base64.b64decode(reply)) == SPAKE2_MESSAGE_SIZE
    try:  # a random point on the curve: the check answers, it does not confirm
        assert host.check(message[:44]) is None
    except PairingProtocolError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=80), st.binary(min_size=33, max_size=33).map(b64)),
       st.one_of(st.text(max_size=80), st.binary(min_size=32, max_size=32).map(b64)))
def test_fuzz_the_joiner_raises_only_pairing_protocol_error(reply: str, confirm: str) -> None:
    joiner = Joiner(CODE, FP_A, FP_B)
    joiner.start()
    try:
        joiner.finish(reply)
        assert joiner.confirm(confirm) is False
    except PairingProtocolError:
        pass


@settings(max_examples=200)
@given(st.text(max_size=20), st.text(max_size=80), st.text(max_size=80))
def test_fuzz_the_constructors_raise_only_pairing_protocol_error(
        code: str, fp_a: str, fp_b: str) -> None:
    for make in (lambda: Joiner(code, fp_a, fp_b), lambda: HostSession(code, fp_b, fp_a)):
        try:
            make()
        except PairingProtocolError:
            pass


# ----------------------------------------------------------------------- secrets stay in


def test_no_repr_or_error_shows_the_code_or_a_key() -> None:
    code = "937461"
    joiner, host = Joiner(code, FP_A, FP_B), HostSession(code, FP_B, FP_A)
    shown = [repr(joiner), repr(host)]
    message = joiner.start()
    reply = host.answer(message)
    shown += [repr(joiner), repr(host)]
    mine = joiner.finish(reply)
    assert joiner._key is not None
    assert host._key is not None
    keys = [joiner._key, host._key]
    shown += [repr(joiner), repr(host)]
    theirs = host.check(mine)
    assert theirs is not None
    shown += [repr(joiner), repr(host)]
    for call in (lambda: joiner.finish(reply), lambda: host.answer(message),
                 lambda: host.check(mine), lambda: Joiner("93746", FP_A, FP_B),
                 lambda: HostSession(code, FP_B, "x")):
        with pytest.raises(PairingProtocolError) as caught:
            call()
        shown += [str(caught.value), repr(caught.value)]
    exchange = parse_exchange({"step": 2, "message": mine, "fingerprint": FP_A})
    shown.append(repr(exchange))
    for doc in ({"step": 2, "message": code, "fingerprint": FP_A},
                {"step": 1, "message": mine, "fingerprint": code, "certificate": b64(CERT_A)},
                {"step": 2, "message": message, "fingerprint": FP_A}):
        with pytest.raises(SluiceError) as error:
            parse_exchange(doc)
        shown += [str(error.value), repr(error.value), error.value.body().decode()]
    text = "\n".join(shown)
    assert code not in text
    assert "937 461" not in text
    for secret in (*keys, base64.b64decode(mine), base64.b64decode(theirs)):
        assert secret.hex() not in text
        assert b64(secret) not in text
        assert repr(secret) not in text
    assert mine not in text
    assert theirs not in text


# ----------------------------------------------------------------------- the body


def test_parse_exchange_reads_both_steps() -> None:
    message = Joiner(CODE, FP_A, FP_B).start()
    exchange = parse_exchange({"step": 1, "message": message, "fingerprint": FP_A.upper(),
                               "name": "  laptop ", "certificate": b64(CERT_A)})
    assert exchange == Exchange(1, message, FP_A, "laptop", CERT_A)
    assert exchange.key_name == "laptop"
    confirmation = b64(bytes(CONFIRMATION_SIZE))
    exchange = parse_exchange({"step": 2, "message": confirmation, "fingerprint": FP_A})
    assert exchange == Exchange(2, confirmation, FP_A, "")
    assert exchange.key_name == FP_A


GOOD: dict[str, Any] = {"step": 1, "message": b64(bytes(SPAKE2_MESSAGE_SIZE)),
                        "fingerprint": FP_A, "name": "laptop", "certificate": b64(CERT_A)}


@pytest.mark.parametrize(("change", "param"), [
    ({"step": 3}, "step"), ({"step": "1"}, "step"), ({"step": True}, "step"),
    ({"step": None}, "step"), ({"step": 1.0}, "step"),
    ({"message": None}, "message"), ({"message": 33}, "message"),
    ({"message": "not base64"}, "message"), ({"message": b64(bytes(32))}, "message"),
    ({"step": 2}, "message"),  # a step-1 message is not a confirmation
    ({"fingerprint": None}, "fingerprint"), ({"fingerprint": "node-a"}, "fingerprint"),
    ({"fingerprint": FP_A[:-1]}, "fingerprint"),
    ({"name": 7}, "name"), ({"name": "a\nb"}, "name"), ({"name": "x" * 101}, "name"),
    ({"code": CODE}, "code"), ({"accessKey": "k"}, "accessKey"),
    ({"certificate": None}, "certificate"), ({"certificate": "not base64!"}, "certificate"),
    ({"certificate": ""}, "certificate"), ({"certificate": b64(b"another one")}, "certificate"),
    ({"certificate": b64(bytes(4096))}, "certificate"),
    ({"step": 2, "message": b64(bytes(CONFIRMATION_SIZE))}, "certificate"),  # step 1 only
])
def test_parse_exchange_refuses_naming_the_field(change: dict[str, Any], param: str) -> None:
    doc = {**GOOD, **change}
    with pytest.raises(SluiceError) as caught:
        parse_exchange(doc)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.message.startswith(f"{param}: ")


def test_parse_exchange_missing_fields() -> None:
    for field in ("step", "message", "fingerprint", "certificate"):
        doc = {k: v for k, v in GOOD.items() if k != field}
        with pytest.raises(SluiceError) as caught:
            parse_exchange(doc)
        assert caught.value.param == field
    assert parse_exchange({k: v for k, v in GOOD.items() if k != "name"}).name == ""


def test_parse_welcome_reads_the_hosts_answer_to_step_2() -> None:
    doc = {"message": b64(bytes(CONFIRMATION_SIZE)), "fingerprint": "node-desk",
           "name": "desk", "accessKey": "sk-sluice-abc"}
    assert parse_welcome(doc) == Welcome(doc["message"], "node-desk", "desk", "sk-sluice-abc")
    assert "sk-sluice-abc" not in repr(parse_welcome(doc))
    assert parse_welcome({**doc, "name": None}) == Welcome(doc["message"], "node-desk", "",
                                                           "sk-sluice-abc")
    for bad in ({"message": 1}, {"fingerprint": "a b"}, {"accessKey": ""}, {"accessKey": None},
                {"name": "a\nb"}):
        assert parse_welcome({**doc, **bad}) is None
    assert parse_welcome([doc]) is None
