"""Access control (SPEC §5): the DNS-rebinding guard and CORS, the admin token, access keys
from remote and loopback peers, and SO_PEERCRED on the Unix socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from protocol.access import (
    MAX_KEY_LENGTH,
    Access,
    _visible_ascii,
    bearer_token,
    check_api_key,
    hash_key,
    key_matches,
    new_access_key,
    token_equals,
)
from protocol.errors import ConfigError, SluiceError
from protocol.rebinding import host_allowed, is_loopback_ip, origin_allowed
from proxy.access import auth
from proxy.api.routes import access_level
from proxy.link import peer_checks
from proxy.link.listener import LOCAL_TCP, TCP, UNIX, Peer
from tests.client import Client, Reply, chat_body, raw, request
from tests.conftest import StartGateway, remote_request
from tests.fakeupstream import (
    LLAMA_JSON_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
)

# ------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(("host", "ok"), [
    (None, True),  # HTTP/1.0 without Host
    (b"localhost", True), (b"localhost:39080", True), (b"LOCALHOST:39080", True),
    (b"127.0.0.1", True), (b"127.0.0.1:39080", True), (b"127.3.4.5:1", True),
    (b"[::1]:39080", True), (b"[::1]", True), (b"localhost.:39080", True),
    (b":39080", False), (b"", False), (b"evil.example", False), (b"evil.example:39080", False),
    (b"localhost.evil.example", False), (b"127.0.0.1.nip.io", False), (b"::1", False),
    (b"[127.0.0.1]", False), (b"192.168.1.5:39080", False), (b"localhost:x", False),
    (b"user@localhost", False), (b"[::1]x", False), (b"0.0.0.0", False), (b"\xff", False),
])
def test_host_rule(host: bytes | None, ok: bool) -> None:
    assert host_allowed(host) is ok


def test_allowed_hosts_extend_the_rule() -> None:
    assert host_allowed(b"studio.lan:39080", ("studio.lan",))
    assert host_allowed(b"Studio.LAN", ("studio.lan",))
    assert not host_allowed(b"other.lan", ("studio.lan",))
    assert not host_allowed(b":39080", ("",))


@pytest.mark.parametrize(("origin", "ok"), [
    (b"http://localhost:3000", True), (b"http://localhost", True),
    (b"http://127.0.0.1:8080", True), (b"http://127.9.9.9:1", True),
    (b"http://[::1]:5173", True), (b"https://localhost:3000", True),
    (b"null", False), (b"http://evil.example", False), (b"http://localhost.evil.example", False),
    (b"file://", False), (b"http://localhost:3000/path", False), (b"ftp://localhost", False),
    (b"http://user@localhost", False), (b"http://:3000", False), (b"", False),
])
def test_origin_rule(origin: bytes, ok: bool) -> None:
    assert origin_allowed(origin) is ok


def test_allowed_origins_are_exact() -> None:
    listed = ("https://chat.example.com",)
    assert origin_allowed(b"https://chat.example.com", listed)
    assert not origin_allowed(b"http://chat.example.com", listed)
    assert not origin_allowed(b"https://chat.example.com.evil", listed)


def test_loopback_addresses() -> None:
    assert is_loopback_ip("127.0.0.1")
    assert is_loopback_ip("::1")
    assert is_loopback_ip("::ffff:127.0.0.1")  # a dual-stack socket's view of IPv4 loopback
    assert not is_loopback_ip("192.168.1.5")
    assert not is_loopback_ip("::ffff:10.0.0.1")
    assert not is_loopback_ip("localhost")
    assert not is_loopback_ip("")


def test_bearer_token_parsing() -> None:
    assert bearer_token([]) is None
    assert bearer_token([b"Basic abc"]) is None
    assert bearer_token([b"Bearer abc"]) == "abc"
    assert bearer_token([b"bearer   abc "]) == "abc"
    assert bearer_token([b"Bearer a b"]) == ""  # malformed: matches nothing
    assert bearer_token([b"Bearer \xff"]) == ""
    assert bearer_token([b"Bearer a", b"Bearer b"]) == ""


@pytest.mark.parametrize("bad", ["", "a b", "a\rb", "a\nb", "a\x00b", "a\tb", "ключ", 7, None])
def test_api_key_format_names_the_field_not_the_value(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        check_api_key("backend_keys.llama", bad)
    assert info.value.param == "backend_keys.llama"
    if isinstance(bad, str) and bad:
        assert bad not in info.value.message
    check_api_key("backend_keys.llama", "sk-abc_DEF.123")


def test_keys_are_stored_as_hashes_and_compared_in_full() -> None:
    key_id, key = new_access_key()
    assert key_id.startswith("ak-")
    assert key.startswith("sk-sluice-")
    assert len(key) > 40
    stored = [{"id": "other", "hash": hash_key("x")}, {"id": key_id, "hash": hash_key(key)}]
    assert key not in repr(stored)
    assert key_matches(key, stored) is stored[1]
    assert key_matches(key[:-1], stored) is None
    assert key_matches(key, [{"id": "broken", "hash": None}]) is None
    assert token_equals("same", "same")
    assert not token_equals("same", "Same")
    assert not token_equals("", "")  # an unset token matches nothing


def test_what_needs_the_admin_token() -> None:
    assert access_level(b"GET", "/admin/stats") is Access.ADMIN
    assert access_level(b"GET", "/admin") is Access.ADMIN
    for method in (b"POST", b"PUT", b"PATCH", b"DELETE"):
        assert access_level(method, "/api/v1/access-keys") is Access.ADMIN
    assert access_level(b"GET", "/api/v1/access-keys") is Access.KEY
    assert access_level(b"POST", "/v1/chat/completions") is Access.KEY  # relayed, not admin
    assert peer_checks.uid_allowed(0, 1000)
    assert peer_checks.uid_allowed(1000, 1000)
    assert not peer_checks.uid_allowed(12345, 1000)


async def test_authorize_decision_by_peer(start_gateway: StartGateway) -> None:
    """The decision for remote and loopback peers on each transport, without traffic."""
    gw = await start_gateway([])
    ctx = gw.gateway.ctx
    admin = ctx.settings.secrets.admin_token
    _, key = new_access_key()
    ctx.settings.keys.load([{"id": "ak-1", "name": "", "hash": hash_key(key),
                             "created_at": "x", "last_used_at": None}])

    kinds = {"unix": UNIX, "tcp": TCP, "local-tcp": LOCAL_TCP}

    def check(transport: str, loopback: bool, token: str | None, method: bytes = b"POST",
              path: str = "/v1/chat/completions") -> int:
        headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
        try:
            auth.authorize(ctx, Peer(kinds[transport], loopback), access_level(method, path),
                           headers)
        except SluiceError as err:
            return err.status
        return 200

    assert check("tcp", False, None) == 401
    assert check("tcp", False, "wrong") == 401
    assert check("tcp", False, key) == 200
    assert check("tcp", False, admin) == 200  # the admin token is the stronger credential
    assert check("tcp", False, None, b"GET", "/health") == 200
    assert check("tcp", False, None, b"OPTIONS") == 200
    assert check("tcp", True, None) == 200
    assert check("unix", True, None) == 200
    assert check("local-tcp", True, None) == 200
    for transport in ("unix", "tcp", "local-tcp"):
        assert check(transport, True, None, b"DELETE", "/api/v1/access-keys/x") == 401
        assert check(transport, True, key, b"DELETE", "/api/v1/access-keys/x") == 403
        assert check(transport, True, admin, b"DELETE", "/api/v1/access-keys/x") == 200
    # The key's use is the caller's to record (KeyStore.used): authorize names it.
    def used(token: str) -> str | None:
        grant = auth.authorize(ctx, Peer(TCP, loopback=False), Access.KEY,
                               [(b"authorization", f"Bearer {token}".encode())])
        return None if grant is None else grant.key_id

    assert used(key) == "ak-1"
    assert used(admin) is None
    assert ctx.settings.keys.all[0]["last_used_at"] is None
    await ctx.settings.keys.used("ak-1")
    assert ctx.settings.keys.all[0]["last_used_at"] is not None


# ------------------------------------------------------------------------- raw HTTP


def get(host: bytes | None, path: bytes = b"/health", extra: bytes = b"",
        version: bytes = b"1.1") -> bytes:
    host_line = b"" if host is None else b"Host: " + host + b"\r\n"
    return (b"GET " + path + b" HTTP/" + version + b"\r\n" + host_line + extra
            + b"Connection: close\r\n\r\n")


@pytest.mark.parametrize(("host", "status"), [
    (b":39080", 403), (b"evil.example", 403), (b"evil.example:39080", 403),
    (b"localhost:39080", 200), (b"127.0.0.1", 200), (b"[::1]:39080", 200),
    (b"studio.lan:39080", 200), (b"other.lan", 403),
])
async def test_host_guard_on_tcp(start_gateway: StartGateway, host: bytes, status: int) -> None:
    gw = await start_gateway([], allowed_hosts=("studio.lan",))
    reply = await raw(gw.tcp, get(host))
    assert reply.status == status
    if status == 403:
        assert reply.json()["error"]["code"] == "forbidden_host"
        assert reply.header("access-control-allow-origin") is None


async def test_host_guard_http10_and_unix(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    assert (await raw(gw.tcp, get(None, version=b"1.0"))).status == 200
    assert (await raw(gw.unix, get(b"evil.example"))).status == 200  # any Host on the socket
    assert (await raw(gw.unix, get(b":39080"))).status == 200
    two = get(b"localhost", extra=b"Host: evil.example\r\n")
    assert (await raw(gw.tcp, two)).status == 400


async def test_origin_guard_and_cors(start_gateway: StartGateway) -> None:
    gw = await start_gateway([], allowed_origins=("https://chat.example.com",))
    for origin in (b"http://localhost:3000", b"http://127.0.0.1:8080", b"http://[::1]:5173",
                   b"https://chat.example.com"):
        reply = await raw(gw.tcp, get(b"localhost", extra=b"Origin: " + origin + b"\r\n"))
        assert reply.status == 200
        assert reply.header("access-control-allow-origin") == origin.decode()
        assert reply.header("vary") == "Origin"
    for origin in (b"http://evil.example", b"null", b"http://localhost.evil.example:3000"):
        reply = await raw(gw.tcp, get(b"localhost", extra=b"Origin: " + origin + b"\r\n"))
        assert reply.status == 403
        assert reply.json()["error"]["code"] == "forbidden_origin"
        assert not [k for k, _ in reply.headers if k.startswith(b"access-control-")]
    # No Origin: no CORS headers at all.
    reply = await raw(gw.tcp, get(b"localhost"))
    assert not [k for k, _ in reply.headers if k.startswith(b"access-control-")]


async def test_preflight(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    preflight = (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost:39080\r\n"
                 b"Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n"
                 b"Access-Control-Request-Headers: authorization, content-type\r\n"
                 b"Connection: close\r\n\r\n")
    reply = await raw(gw.tcp, preflight)
    assert reply.status == 204
    assert reply.header("access-control-allow-origin") == "http://localhost:3000"
    assert "POST" in (reply.header("access-control-allow-methods") or "")
    assert reply.header("access-control-allow-headers") == "Authorization, Content-Type"
    assert reply.header("access-control-max-age")
    assert reply.body == b""
    evil = preflight.replace(b"http://localhost:3000", b"http://evil.example")
    reply = await raw(gw.tcp, evil)
    assert reply.status == 403
    assert not [k for k, _ in reply.headers if k.startswith(b"access-control-")]


async def _llama_with_cors(req: ReceivedRequest, w: ResponseWriter) -> None:
    # llama.cpp answers every request with an empty Access-Control-Allow-Origin.
    await w.json(200, {"object": "chat.completion", "choices": []},
                 [*LLAMA_JSON_HEADERS, ("Access-Control-Allow-Origin", ""),
                  ("Access-Control-Allow-Credentials", "true")])


async def test_upstream_cors_headers_never_pass(start_gateway: StartGateway,
                                                upstream: FakeUpstream) -> None:
    upstream.on("POST", "/v1/chat/completions", _llama_with_cors)
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body())
    assert reply.status == 200
    assert not [k for k, _ in reply.headers if k.startswith(b"access-control-")]
    reply = await request(gw.tcp, "POST", "/v1/chat/completions", chat_body(),
                          [("origin", "http://localhost:3000")])
    assert reply.status == 200
    acao = [v for k, v in reply.headers if k == b"access-control-allow-origin"]
    assert acao == [b"http://localhost:3000"]
    assert reply.header("access-control-allow-credentials") is None


# ------------------------------------------------------------------------- admin token


async def test_admin_token_matrix(start_gateway: StartGateway, transport: str) -> None:
    gw = await start_gateway([])
    address = gw.address(transport)
    admin = gw.gateway.settings.secrets.admin_token
    path = "/api/v1/access-keys"

    async def post(token: str | None) -> Reply:
        headers = [] if token is None else [("authorization", f"Bearer {token}")]
        return await request(address, "POST", path, b"{}", headers)

    missing = await post(None)
    assert missing.status == 401
    assert missing.header("www-authenticate") == "Bearer"
    assert missing.json()["error"]["code"] == "admin_token_required"
    assert (await post("wrong")).status == 403
    made = await post(admin)
    assert made.status == 201
    key = made.json()["key"]
    as_admin = await post(key)  # an access key never counts as the admin token
    assert as_admin.status == 403
    assert as_admin.json()["error"]["code"] == "invalid_admin_token"
    assert key not in as_admin.body.decode()
    # /admin/* needs it for reads too; a GET under /api/v1/ does not.
    assert (await request(address, "GET", "/admin/stats")).status == 401
    stats = await request(address, "GET", "/admin/stats", None,
                          [("authorization", f"Bearer {admin}")])
    assert stats.status == 200
    assert stats.json() == (await request(address, "GET", "/api/v1/pool/routing-stats")).json()
    assert (await request(address, "GET", "/admin/stats", None,
                          [("authorization", f"Bearer {key}")])).status == 403
    assert (await request(address, "GET", path)).status == 200
    # A relayed call is not an admin write.
    assert (await request(address, "POST", "/v1/chat/completions", chat_body())).status == 503


# ------------------------------------------------------------------------- remote peers


@pytest.mark.usefixtures("remote_seam")
async def test_remote_clients_need_a_key(start_gateway: StartGateway,
                                         upstream: FakeUpstream) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)])
    admin = gw.gateway.settings.secrets.admin_token
    made = await request(gw.unix, "POST", "/api/v1/access-keys", b'{"name": "laptop"}',
                         [("authorization", f"Bearer {admin}")])
    key, key_id = made.json()["key"], made.json()["id"]

    async def chat(token: str | None) -> Reply:
        headers = [] if token is None else [("authorization", f"Bearer {token}")]
        return await remote_request(gw, "POST", "/v1/chat/completions", chat_body(), headers)

    missing = await chat(None)
    assert missing.status == 401
    assert missing.header("www-authenticate") == "Bearer"
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert (await chat("sk-sluice-wrong")).status == 401
    good = await chat(key)
    assert good.status == 200, good.body
    # The client's Authorization never reaches the model server.
    assert all(k != b"authorization" for k, _ in upstream.requests[-1].headers)
    assert (await remote_request(gw, "GET", "/health")).status == 200
    assert (await remote_request(gw, "GET", "/v1/models")).status == 401
    # Loopback clients still need nothing.
    assert (await request(gw.tcp, "POST", "/v1/chat/completions", chat_body())).status == 200
    revoked = await request(gw.unix, "DELETE", f"/api/v1/access-keys/{key_id}", None,
                            [("authorization", f"Bearer {admin}")])
    assert revoked.status == 200
    assert (await chat(key)).status == 401


async def test_require_auth_covers_loopback_tcp(start_gateway: StartGateway,
                                                upstream: FakeUpstream) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", upstream.url)], require_auth=True)
    admin = gw.gateway.settings.secrets.admin_token
    made = await request(gw.unix, "POST", "/api/v1/access-keys", None,
                         [("authorization", f"Bearer {admin}")])
    key = made.json()["key"]
    assert (await request(gw.tcp, "POST", "/v1/chat/completions", chat_body())).status == 401
    assert (await request(gw.tcp, "GET", "/v1/models")).status == 401
    assert (await request(gw.tcp, "POST", "/v1/chat/completions", chat_body(), [
        ("authorization", f"Bearer {key}")])).status == 200
    assert (await request(gw.tcp, "GET", "/health")).status == 200
    # The Unix socket never needs a key.
    assert (await request(gw.unix, "POST", "/v1/chat/completions", chat_body())).status == 200


# ------------------------------------------------------------------------- SO_PEERCRED

def _connect_as(uid: int, path: str) -> bytes:
    """Fork a child that takes ``uid``, asks ``path`` for /health and reports (through a
    pipe) the first bytes of the answer; b"" when the gateway closed without one."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            data = b""
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(path)
                try:  # a refused peer may see a reset instead of an orderly close
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
                                 b"Connection: close\r\n\r\n")
                    while chunk := sock.recv(65536):
                        data += chunk
                except (ConnectionResetError, BrokenPipeError):
                    pass
            os.write(write_end, b"ok:" + data[:12])
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            got = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got.startswith(b"ok:")
    return got[3:]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another uid")
async def test_unix_peer_with_another_uid_is_refused(start_gateway: StartGateway,
                                                     short_tmp: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    gw = await start_gateway([])
    path = gw.gateway.ctx.socket_path
    assert path is not None
    # Let uid 12345 reach the socket file at all (the folders are private to root).
    for part in (short_tmp, short_tmp / "g1", Path(path).parent):
        os.chmod(part, 0o711)
    os.chmod(path, 0o666)
    with caplog.at_level("INFO", logger="sluice.auth"):
        assert await trio.to_thread.run_sync(_connect_as, 12345, path) == b""
        assert await trio.to_thread.run_sync(_connect_as, 0, path) == b"HTTP/1.1 200"
    refused = [r.getMessage() for r in caplog.records if r.name == "sluice.auth"]
    assert len(refused) == 1
    assert "uid 12345" in refused[0]


async def test_malformed_header_value_is_not_echoed(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    secret = "sk-sluice-SECRETVALUE123"
    head = (b"GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
            + secret.encode() + b"\x00\r\nConnection: close\r\n\r\n")
    reply = await raw(gw.tcp, head)
    assert reply.status == 400
    assert b"SECRETVALUE" not in reply.body
    assert reply.json()["error"]["message"] == "malformed HTTP request: illegal header line"


def test_error_bodies_never_hold_the_key() -> None:
    assert hash_key("k") != "k"
    with pytest.raises(ConfigError) as info:
        check_api_key("node_keys.node-1", "abc def")
    assert "abc" not in str(info.value)
    assert "abc" not in repr(info.value)


async def test_refusals_keep_or_close_the_connection(start_gateway: StartGateway) -> None:
    """A refused request with a small body is read whole and the connection kept; one with
    a large body is answered at once and the connection closed."""
    gw = await start_gateway([], require_auth=True)
    client = await Client.open(gw.tcp)
    try:
        for _ in range(2):
            reply = await client.request("POST", "/v1/chat/completions", chat_body())
            assert reply.status == 401
            assert reply.header("connection") is None
        big = b"x" * (2 << 20)
        stream = client.stream
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(big))
        data = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
        assert data.startswith(b"HTTP/1.1 401")
        assert b"connection: close" in data.lower()
    finally:
        await client.aclose()


@given(st.one_of(st.text(), st.text(st.characters(min_codepoint=0x1F, max_codepoint=0x80)),
                 st.integers(MAX_KEY_LENGTH - 1, MAX_KEY_LENGTH + 1).map(lambda n: "k" * n)))
def test_a_key_is_visible_ascii_exactly_by_the_rule(value: str) -> None:
    """The regex check is the rule as written: 1 to MAX_KEY_LENGTH characters, each
    U+0021..U+007E."""
    rule = 0 < len(value) <= MAX_KEY_LENGTH and all(0x21 <= ord(ch) <= 0x7E for ch in value)
    assert _visible_ascii(value) is rule
