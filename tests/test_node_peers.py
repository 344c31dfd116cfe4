"""The node listener's rules, pure and in memory (SPEC §16): who may ask what on the node
port (the node column of protocol.access's table), and the paired peers it trusts
(NodePeers: pins that must be their certificates', changes counted and told, the pins that
left)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.access import (
    PAIRING_EXCHANGE_PATH,
    Access,
    Column,
    authorize,
    hash_key,
    key_matches,
)
from protocol.errors import SluiceError
from protocol.upstream_url import parse_upstream_url
from proxy.api.routes import access_level
from proxy.lan.node_peers import NodePeers
from tests.tls_certs import identities

ADMIN = "admin-token-1234567890"
KEYS = [{"id": "ak-peer", "hash": hash_key("sk-sluice-peer")},
        {"id": "ak-phone", "hash": hash_key("sk-sluice-phone")}]


def decide(level: Access, token: str | None = None,
           bound: str | None = "ak-peer") -> dict[str, Any] | None:
    headers = [] if token is None else [(b"authorization", b"Bearer " + token.encode())]
    return authorize(level, Column.NODE, headers, loopback=False, require_auth=False,
                     admin_token=ADMIN, bound_key_id=bound,
                     find_key=lambda presented: key_matches(presented, KEYS))


def refused(level: Access, **kwargs: Any) -> SluiceError:
    with pytest.raises(SluiceError) as caught:
        decide(level, **kwargs)
    return caught.value


def test_a_paired_peer_with_its_key() -> None:
    assert decide(Access.KEY, token="sk-sluice-peer") is KEYS[0]
    assert decide(Access.KEY, token="sk-sluice-phone", bound="ak-phone") is KEYS[1]


@pytest.mark.parametrize("token", [None, "sk-sluice-phone", ADMIN, "sk-sluice-unknown", "x"])
def test_a_paired_peer_has_one_key(token: str | None) -> None:
    err = refused(Access.KEY, token=token)
    assert err.status == 401
    assert err.code in {"missing_api_key", "invalid_api_key"}


def test_a_claim_on_the_node_port_needs_the_bound_key_too() -> None:
    assert refused(Access.CLAIM).status == 401
    assert decide(Access.CLAIM, token="sk-sluice-peer") is KEYS[0]


def test_open_paths_and_admin_paths() -> None:
    assert decide(Access.OPEN) is None
    assert decide(Access.ADMIN, token=ADMIN) is None  # the admin token, as everywhere
    assert refused(Access.ADMIN).status == 401
    assert refused(Access.ADMIN, token="sk-sluice-peer").status == 403


def test_without_a_paired_certificate_only_the_exchange() -> None:
    for method, path in [(b"GET", "/v1/models"), (b"GET", PAIRING_EXCHANGE_PATH),
                         (b"POST", "/api/v1/pairing/claim"), (b"OPTIONS", "/v1/models"),
                         (b"POST", PAIRING_EXCHANGE_PATH + "/"), (b"GET", "/health"),
                         (b"DELETE", "/api/v1/access-keys/x")]:
        err = refused(access_level(method, path), token="sk-sluice-peer", bound=None)
        assert (err.status, err.code) == (401, "unpaired_certificate")
        assert PAIRING_EXCHANGE_PATH in err.message
    exchange = access_level(b"POST", PAIRING_EXCHANGE_PATH)
    assert decide(exchange, bound=None) is None
    assert decide(exchange) is None


# ------------------------------------------------------------------------- NodePeers


def test_peers_set_and_read(tmp_path: Path) -> None:
    a, b = identities(tmp_path, "a", "b")
    peers = NodePeers()
    assert (len(peers), peers.version) == (0, 0)
    told: list[frozenset[str]] = []
    peers.subscribe(told.append)
    peers.set({a.fingerprint: (a.der, "ak-a"), b.fingerprint.upper(): (b.der, "ak-b")})
    assert peers.version == 1
    assert told == [frozenset()]
    assert peers.key_id_for(a.fingerprint) == "ak-a"
    assert peers.key_id_for(b.fingerprint) == "ak-b"
    assert peers.key_id_for(None) is None
    assert peers.key_id_for("sha256:" + "0" * 64) is None
    assert sorted(peers.certificates()) == sorted([a.der, b.der])
    assert peers.pins() == {a.fingerprint, b.fingerprint}
    peers.set({a.fingerprint: (a.der, "ak-a"), b.fingerprint: (b.der, "ak-b")})
    assert peers.version == 1  # the same set: no change
    peers.set({b.fingerprint: (b.der, "ak-b2")})
    assert peers.version == 2
    assert told[-1] == {a.fingerprint}
    assert peers.key_id_for(b.fingerprint) == "ak-b2"
    assert "der" not in repr(peers).lower()
    assert a.fingerprint not in repr(peers)


def test_a_pin_must_be_its_certificates(tmp_path: Path) -> None:
    a, b = identities(tmp_path, "a", "b")
    peers = NodePeers({a.fingerprint: (a.der, "ak-a")})
    for wrong in ({b.fingerprint: (a.der, "ak-a")}, {"sha256:nope": (a.der, "ak-a")},
                  {a.fingerprint: (a.der, "")}):
        with pytest.raises(ValueError, match=r"pin|key id"):
            peers.set(wrong)
    assert peers.version == 1
    assert peers.key_id_for(a.fingerprint) == "ak-a"


def test_a_pinned_address() -> None:
    plain = parse_upstream_url("http://studio.lan:39080/base")
    pin = "sha256:" + "ab" * 32
    link = plain.pinned(pin, 39443)
    assert (link.host, link.port, link.base_path, link.pin) == ("studio.lan", 39443, "/base", pin)
    assert link.authority == b"studio.lan:39443"
    assert link.key != plain.pinned("sha256:" + "cd" * 32, 39443).key
    assert link.key != parse_upstream_url("http://studio.lan:39443/base").key
    assert plain.pinned(pin).port == 39080
    with pytest.raises(ValueError, match="Unix"):
        parse_upstream_url("unix:/s.sock").pinned(pin)
