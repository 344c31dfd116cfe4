"""Who may call a path (SPEC §5, §13, §14, §16), decided once: the levels of the route table
(:func:`proxy.api.routes.access_level`) and the pure decision for a request at its level in
a listener's column of the access table (:func:`protocol.access.authorize`), the node
listener's included, without a gateway."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from protocol.access import (
    ADMIN_CHANGES,
    KEY_HOLDERS,
    TABLE,
    WRITES,
    Access,
    Column,
    Rule,
    Step,
    authorize,
    hash_key,
    key_matches,
    new_access_key,
)
from protocol.errors import SluiceError
from protocol.lan.pairing import MAX_CLAIM_BODY
from proxy.api.routes import PREFIXES, ROUTES, access_level, unlisted

ADMIN = "the-admin-token"
KEY_ID, KEY = new_access_key()
STORED = [{"id": "ak-other", "hash": hash_key("sk-sluice-other")},
          {"id": KEY_ID, "hash": hash_key(KEY)}]
FIND = functools.partial(key_matches, stored=STORED)
# Every method a request may name, served somewhere or not (501s are decided after this).
METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS", b"FOO")
LISTENERS = (("unix", True), ("local-tcp", True), ("tcp", True), ("tcp", False))
COLUMNS = {"unix": Column.LOCAL, "local-tcp": Column.LOCAL, "tcp": Column.API,
           "node": Column.NODE}


def decide(level: Access, transport: str, loopback: bool, credential: str | None, *,
           require_auth: bool = False, header: bytes = b"authorization",
           extra: list[tuple[bytes, bytes]] | None = None,
           bound: str | None = None) -> str:
    """``"pass"``, ``"key"`` (passes as our stored key) or the refusal's code."""
    headers = list(extra or [])
    if credential is not None:
        value = credential if header != b"authorization" else "Bearer " + credential
        headers.append((header, value.encode()))
    try:
        entry = authorize(level, COLUMNS[transport], headers, loopback=loopback,
                          require_auth=require_auth, admin_token=ADMIN, find_key=FIND,
                          bound_key_id=bound)
    except SluiceError as err:
        return f"{err.status} {err.code}"
    if entry is None:
        return "pass"
    assert entry["id"] == KEY_ID
    return "key"


NEEDS_KEY = {None: "401 missing_api_key", "nonsense": "401 invalid_api_key",
             "sk-sluice-unknown": "401 invalid_api_key", KEY: "key", ADMIN: "pass"}
NO_KEY_NEEDED = {None: "pass", "nonsense": "pass", "sk-sluice-unknown": "pass", KEY: "key",
                 ADMIN: "pass"}
ADMIN_NEEDED = {None: "401 admin_token_required", "nonsense": "403 invalid_admin_token",
                "sk-sluice-unknown": "403 invalid_admin_token",
                KEY: "403 invalid_admin_token", ADMIN: "pass"}
NOTHING_ASKED = {None: "pass", "nonsense": "pass", "sk-sluice-unknown": "pass", KEY: "pass",
                 ADMIN: "pass"}
NOT_HERE = dict.fromkeys(NOTHING_ASKED, "404 not_found")


def expected(level: Access, transport: str, loopback: bool, require_auth: bool) -> dict[
        str | None, str]:
    if level in (Access.OPEN, Access.CLAIM):
        return NOTHING_ASKED  # a claim's key is its code; an offered key is not even looked up
    if level is Access.PAIRING:
        return NOT_HERE  # served on the node listener only
    if level is Access.ADMIN:
        return ADMIN_NEEDED
    if transport == "tcp" and (not loopback or require_auth):
        return NEEDS_KEY
    return NO_KEY_NEEDED


@pytest.mark.parametrize("require_auth", [False, True])
@pytest.mark.parametrize(("transport", "loopback"), LISTENERS)
@pytest.mark.parametrize("level", list(Access))
def test_the_decision_by_listener_peer_level_and_credential(
        level: Access, transport: str, loopback: bool, require_auth: bool) -> None:
    for credential, outcome in expected(level, transport, loopback, require_auth).items():
        got = decide(level, transport, loopback, credential, require_auth=require_auth)
        assert got == outcome, (credential, got)
        if credential is not None:  # x-api-key (Anthropic's clients) counts the same
            assert decide(level, transport, loopback, credential, require_auth=require_auth,
                          header=b"x-api-key") == outcome


def test_the_refusals_are_the_same_errors() -> None:
    def error(level: Access, credential: str | None) -> SluiceError:
        headers = [] if credential is None else [(b"authorization",
                                                  f"Bearer {credential}".encode())]
        with pytest.raises(SluiceError) as info:
            authorize(level, Column.API, headers, loopback=False, require_auth=False,
                      admin_token=ADMIN, find_key=FIND)
        return info.value

    missing = error(Access.KEY, None)
    assert (missing.status, dict(missing.headers)) == (401, {b"www-authenticate": b"Bearer"})
    assert "sluice keys create" in missing.message
    assert error(Access.KEY, "x").message == "the access key is not valid (unknown or revoked)"
    assert dict(error(Access.ADMIN, None).headers) == {b"www-authenticate": b"Bearer"}
    wrong = error(Access.ADMIN, KEY)  # a key never counts as the admin token
    assert (wrong.status, wrong.message, tuple(wrong.headers)) == (
        403, "the admin token is not valid", ())


def test_a_malformed_or_repeated_credential_matches_nothing() -> None:
    twice = [(b"authorization", f"Bearer {ADMIN}".encode())] * 2
    assert decide(Access.ADMIN, "unix", True, None, extra=twice) == "403 invalid_admin_token"
    assert decide(Access.KEY, "tcp", False, None, extra=twice) == "401 invalid_api_key"
    basic = [(b"authorization", b"Basic abc")]  # not a bearer token: no credential at all
    assert decide(Access.KEY, "tcp", False, None, extra=basic) == "401 missing_api_key"


def test_a_claim_needs_only_a_small_body() -> None:
    small = [(b"content-length", str(MAX_CLAIM_BODY).encode())]
    assert decide(Access.CLAIM, "tcp", False, None, extra=small) == "pass"
    large = [(b"content-length", str(MAX_CLAIM_BODY + 1).encode())]
    chunked = [(b"transfer-encoding", b"chunked")]
    for transport, loopback in LISTENERS:
        for headers in (large, chunked):
            assert decide(Access.CLAIM, transport, loopback, ADMIN, extra=headers) == \
                "413 request_too_large"


# ------------------------------------------------------------------------- the node column


NODE_KEY_ID, NODE_KEY = "ak-node", "sk-sluice-bound-to-a-certificate"
NODE_STORED = [*STORED, {"id": NODE_KEY_ID, "hash": hash_key(NODE_KEY), "pin": "sha256:a"}]
NODE_FIND = functools.partial(key_matches, stored=NODE_STORED)


def on_node(level: Access, credential: str | None, bound: str | None,
            extra: list[tuple[bytes, bytes]] | None = None) -> str:
    headers = list(extra or [])
    if credential is not None:
        headers.append((b"authorization", f"Bearer {credential}".encode()))
    try:
        entry = authorize(level, Column.NODE, headers, loopback=False, require_auth=False,
                          admin_token=ADMIN, find_key=NODE_FIND, bound_key_id=bound)
    except SluiceError as err:
        return f"{err.status} {err.code}"
    return "pass" if entry is None else str(entry["id"])


CREDENTIALS = (None, "nonsense", KEY, NODE_KEY, ADMIN)


@pytest.mark.parametrize("level", list(Access))
def test_the_node_column_without_a_paired_certificate(level: Access) -> None:
    """SPEC §16: a client without a paired certificate may call the pairing exchange only,
    whatever it shows."""
    for credential in CREDENTIALS:
        got = on_node(level, credential, None)
        assert got == ("pass" if level is Access.PAIRING else "401 unpaired_certificate")


def test_the_node_column_for_a_paired_peer() -> None:
    """A paired peer is served as on the API port with the key bound to its certificate as
    its only key (the admin token does not stand in for it); the admin token where the
    admin's is asked."""
    bound = {None: "401 missing_api_key", "nonsense": "401 invalid_api_key",
             KEY: "401 invalid_api_key", NODE_KEY: NODE_KEY_ID, ADMIN: "401 invalid_api_key"}
    anything = dict.fromkeys(CREDENTIALS, "pass")
    admin = {**ADMIN_NEEDED, NODE_KEY: "403 invalid_admin_token"}
    expected = {Access.OPEN: anything, Access.PAIRING: anything, Access.KEY: bound,
                Access.CLAIM: bound, Access.ADMIN: admin}
    for level, outcomes in expected.items():
        for credential in CREDENTIALS:
            want = outcomes[credential]
            assert on_node(level, credential, NODE_KEY_ID) == want, (level, credential)
    # A key bound to a certificate counts nowhere else (SPEC §16), not even where no key
    # is needed (it is not looked up as one of ours).
    assert decide(Access.KEY, "tcp", False, NODE_KEY) == "401 invalid_api_key"
    assert decide(Access.KEY, "unix", True, NODE_KEY) == "pass"


def test_every_cap_holds_in_every_column_that_serves_it() -> None:
    """Issue 39/40: a level with a body cap (a claim's, the pairing exchange's) refuses a
    large body in every column of the access table where the level is served, so the
    node port cannot skip it: 413 before a byte of the body is read."""
    large = [(b"content-length", str(MAX_CLAIM_BODY + 1).encode())]
    chunked = [(b"transfer-encoding", b"chunked")]
    capped = [level for level in Access if any(Step.SMALL_BODY in steps
                                               for steps in TABLE[level].values())]
    assert capped == [Access.CLAIM, Access.PAIRING]
    for level in capped:
        for column, steps in TABLE[level].items():
            served = Step.ELSEWHERE not in steps
            if served:
                assert Step.SMALL_BODY in steps, (level, column)
            for headers in (large, chunked):
                for bound in (None, NODE_KEY_ID):
                    with pytest.raises(SluiceError) as refused:
                        authorize(level, column, headers, loopback=False, require_auth=False,
                                  admin_token=ADMIN, find_key=NODE_FIND, bound_key_id=bound)
                    if served and (bound is not None or Step.PAIRED not in steps):
                        assert refused.value.status == 413, (level, column, bound)


# ------------------------------------------------------------------------- the table


def _old_rule(method: bytes, path: str) -> Access:
    """The rules as proxy/access/auth.py spelled them before the route table held them (OPTIONS
    first, the pairing claim, ``needs_admin``, ``OPEN_PATHS``): the table must say the same
    for every path and method."""
    if method == b"OPTIONS":
        return Access.OPEN
    if method == b"POST" and path == "/api/v1/pairing/claim":
        return Access.CLAIM
    if method == b"POST" and path == "/api/v1/pairing/exchange":
        return Access.PAIRING  # SPEC §16: a claim's kind, on the node listener only
    if path == "/admin" or path.startswith("/admin/") or (path.startswith("/api/v1/") and (
            method in WRITES or path in ("/api/v1/pairing", "/api/v1/queue")
            or path.startswith("/api/v1/pairing/peers"))):  # SPEC §16, §18: the admin's
        return Access.ADMIN
    return Access.OPEN if path == "/health" else Access.KEY


def _paths() -> list[str]:
    paths = list(ROUTES)
    paths += [prefix + "x" for prefix in PREFIXES]
    paths += ["/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/v1/", "/v1",
              "/admin", "/admin/", "/admin/nope", "/administrator", "/api/v1", "/api/v1/",
              "/api/v1/nope", "/api/v1/pairing/", "/api/v1/pairing/claim/x", "/health/",
              "/nope", "/", "", "/api/nope", "/ui/x/y", "/api/v1/access-keys/"]
    return paths


@pytest.mark.parametrize("method", METHODS)
def test_the_table_keeps_every_rule(method: bytes) -> None:
    for path in _paths():
        assert access_level(method, path) is _old_rule(method, path), (method, path)


def _under_admin_rule(path: str) -> bool:
    return path.startswith(("/api/v1/", "/admin/")) or path == "/admin"


def test_every_route_has_a_level_and_every_admin_write_is_admin() -> None:
    """A new route cannot forget: each entry names a Rule, every method has a level, and
    under ``/api/v1/`` and ``/admin/`` every write is the admin's (the pairing claim's
    POST, open to strangers with its code, is the one exception, SPEC §14)."""
    tables: list[tuple[str, Any]] = [(path, e) for path, e in ROUTES.items()]
    tables += [(prefix + "x", e) for prefix, e in PREFIXES.items()]
    claims = []
    for path, endpoint in tables:
        assert isinstance(endpoint.access, Rule), path
        for method in METHODS:
            level = endpoint.access.level(method)
            assert isinstance(level, Access)
            if method == b"OPTIONS":
                assert level is Access.OPEN
            elif _under_admin_rule(path) and method in WRITES:
                if level in (Access.CLAIM, Access.PAIRING):
                    claims.append((method, path))
                else:
                    assert level is Access.ADMIN, (method, path)
            elif path.startswith("/admin"):
                assert level is Access.ADMIN, (method, path)
    assert claims == [(b"POST", "/api/v1/pairing/claim"), (b"POST", "/api/v1/pairing/exchange")]
    open_paths = {path for path, e in tables if e.access.level(b"GET") is Access.OPEN}
    assert open_paths == {"/health"}


def test_paths_outside_the_table() -> None:
    assert unlisted("/v1/chat/completions") is KEY_HOLDERS  # relayed: the model API
    assert unlisted("/api/v1/nope") is ADMIN_CHANGES
    assert unlisted("/nope").level(b"DELETE") is Access.KEY
    for path in ("/admin", "/admin/nope"):
        assert {unlisted(path).level(m) for m in METHODS if m != b"OPTIONS"} == {Access.ADMIN}


def test_a_rule_by_method() -> None:
    rule = ADMIN_CHANGES.but(b"POST", Access.CLAIM)
    assert rule.level(b"POST") is Access.CLAIM
    assert rule.level(b"PUT") is Access.ADMIN
    assert rule.level(b"GET") is Access.KEY
    assert rule.level(b"OPTIONS") is Access.OPEN  # a preflight carries no credentials
    assert ADMIN_CHANGES.level(b"POST") is Access.ADMIN  # the rule it came from is unchanged
