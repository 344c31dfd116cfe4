"""Certificate pins (SPEC §16), pure (protocol/lan/pinning.py): ``sha256:`` and the lowercase
hex of the certificate DER's SHA-256; the written form, uppercase accepted and normalized;
the match against a certificate."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.lan.pinning import PIN_PREFIX, fingerprint_of, is_pin, normalize_pin, pin_matches

DER = b"0\x82\x01\x0a not really a certificate, any bytes hash the same way"
PIN = "sha256:" + hashlib.sha256(DER).hexdigest()


def test_fingerprint_is_the_prefix_and_the_lowercase_hex_of_the_sha256() -> None:
    assert PIN_PREFIX == "sha256:"
    assert fingerprint_of(DER) == PIN
    assert fingerprint_of(b"") == ("sha256:e3b0c44298fc1c149afbf4c8996fb924"
                                   "27ae41e4649b934ca495991b7852b855")
    assert is_pin(fingerprint_of(DER))


@pytest.mark.parametrize("value", [
    PIN.upper(), PIN[:7] + PIN[7:].upper(), "SHA256:" + PIN[7:], PIN[:-1], PIN + "0",
    PIN[7:], "sha1:" + PIN[7:], "sha256:" + "g" * 64, "sha256: " + PIN[8:], " " + PIN,
    "sha256:" + "٣" * 64, None, 1, b"sha256:" + PIN[7:].encode(), "",
])
def test_is_pin_holds_to_the_written_form(value: object) -> None:
    assert not is_pin(value)


@pytest.mark.parametrize("value", [
    PIN, PIN.upper(), PIN[:7] + PIN[7:].upper(), "SHA256:" + PIN[7:], f"  {PIN}\n",
])
def test_normalize_pin_takes_any_case_and_blanks_around(value: str) -> None:
    assert normalize_pin(value) == PIN


@pytest.mark.parametrize("value", [
    PIN[:-1], PIN + "0", PIN[7:], "sha256:" + "g" * 64, "sha256:" + "٣" * 64,
    "sha256: " + PIN[8:], None, 1, "", PIN + " " * 200,
])
def test_normalize_pin_refuses_what_is_not_a_pin(value: object) -> None:
    assert normalize_pin(value) is None


def test_pin_matches_its_certificate_only() -> None:
    assert pin_matches(DER, PIN)
    assert pin_matches(DER, PIN.upper())
    assert not pin_matches(DER + b"\x00", PIN)
    assert not pin_matches(DER, fingerprint_of(b"another"))
    assert not pin_matches(DER, PIN[7:])  # the bare hex is not a pin
    assert not pin_matches(DER, "")


@given(st.binary(max_size=512))
def test_every_certificate_has_a_pin_that_matches_it(der: bytes) -> None:
    pin = fingerprint_of(der)
    assert is_pin(pin)
    assert normalize_pin(pin) == pin
    assert pin_matches(der, pin)


@given(st.text(max_size=100))
def test_normalize_pin_gives_a_pin_or_none(text: str) -> None:
    pin = normalize_pin(text)
    assert pin is None or is_pin(pin)
