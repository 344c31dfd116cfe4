"""The console's static files (SPEC §10): ``/ui/`` and ``/ui/<file>`` on the TCP listener
with their content types and security headers, HEAD, the redirect from ``/ui``, 404 (in the
OpenAI shape) for a missing file or any path that tries to leave the static folder, the
Unix socket's 404, the access rule of GETs, and the files being package data."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest

from protocol.console import CSP, asset_parts
from proxy.console import STATIC_DIR
from tests.client import raw, request
from tests.conftest import RunningGateway, StartGateway, remote_request

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_CSP = ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                "img-src 'self' data:", "connect-src 'self'", "base-uri 'none'",
                "form-action 'none'", "frame-ancestors 'none'")


@pytest.fixture
async def gw(start_gateway: StartGateway) -> RunningGateway:
    return await start_gateway([])


@pytest.mark.parametrize(("path", "content_type"), [
    ("/ui/", "text/html; charset=utf-8"),
    ("/ui/index.html", "text/html; charset=utf-8"),
    ("/ui/app.css", "text/css; charset=utf-8"),
    ("/ui/js/app.js", "text/javascript; charset=utf-8"),
    ("/ui/js/components/ordered-list.js", "text/javascript; charset=utf-8"),
    ("/ui/js/screens/nodes.js", "text/javascript; charset=utf-8"),
])
async def test_files_have_their_type_and_the_security_headers(
        gw: RunningGateway, path: str, content_type: str) -> None:
    reply = await request(gw.tcp, "GET", path)
    assert reply.status == 200
    assert reply.header("content-type") == content_type
    assert reply.header("cache-control") == "no-cache"
    assert reply.header("x-content-type-options") == "nosniff"
    assert reply.header("referrer-policy") == "no-referrer"
    csp = reply.header("content-security-policy") or ""
    assert [part.strip() for part in csp.split(";")] == list(EXPECTED_CSP)
    name = "index.html" if path == "/ui/" else path.removeprefix("/ui/")
    assert reply.body == (STATIC_DIR / name).read_bytes()


async def test_the_page_has_no_inline_script_or_style(gw: RunningGateway) -> None:
    page = (await request(gw.tcp, "GET", "/ui/")).body.decode()
    assert re.search(r"<script(?![^>]*\bsrc=)", page) is None
    for inline in ("<style", " style=", "onclick=", "onload="):
        assert inline not in page
    assert 'type="module" src="js/app.js"' in page


async def test_head_gives_the_head_only(gw: RunningGateway) -> None:
    reply = await raw(gw.tcp, b"HEAD /ui/app.css HTTP/1.1\r\nHost: localhost\r\n"
                              b"Connection: close\r\n\r\n")
    assert reply.status == 200
    assert reply.header("content-type") == "text/css; charset=utf-8"
    assert reply.header("content-length") == str((STATIC_DIR / "app.css").stat().st_size)
    assert reply.body == b""


async def test_ui_without_slash_redirects(gw: RunningGateway) -> None:
    reply = await request(gw.tcp, "GET", "/ui")
    assert reply.status == 308
    assert reply.header("location") == "/ui/"


@pytest.mark.parametrize("path", [
    "/ui/missing.js", "/ui/js/nothing-here.js", "/ui/../secrets.yaml", "/ui/js/../../x.js",
    "/ui/%2e%2e/%2e%2e/etc/passwd", "/ui/..%2fapp.css", "/ui/.hidden.js", "/ui//etc/passwd",
    "/ui/js/", "/ui/js", "/ui/app.css/", "/ui/README", "/ui/app.py", "/ui/js\\app.js",
    "/ui/" + "a/" * 6 + "x.js",
])
async def test_a_missing_file_or_a_way_out_is_404(gw: RunningGateway, path: str) -> None:
    reply = await raw(gw.tcp, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n"
                              f"Connection: close\r\n\r\n".encode())
    assert reply.status in (400, 404), (path, reply.status)
    if reply.status == 404:
        error = json.loads(reply.body)["error"]
        assert error["code"] == "not_found" or error["type"]
        assert reply.header("content-type") == "application/json"


def test_a_symlink_out_of_the_static_folder_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.api import console

    static = tmp_path / "static"
    static.mkdir()
    (tmp_path / "secret.js").write_text("secret")
    (static / "link.js").symlink_to(tmp_path / "secret.js")
    (static / "ok.js").write_text("ok")
    monkeypatch.setattr(console, "STATIC_DIR", static.resolve())
    assert console._read(("ok.js",)) == b"ok"
    assert console._read(("link.js",)) is None


def test_asset_parts_rules() -> None:
    assert asset_parts("/ui/") == (("index.html",), b"text/html; charset=utf-8")
    assert asset_parts("/ui/js/screens/pool.js") == (("js", "screens", "pool.js"),
                                                     b"text/javascript; charset=utf-8")
    for bad in ("/ui/..", "/ui/a/../b.js", "/ui/.x.css", "/ui/a%2fb.js", "/x/app.css",
                "/ui/a b.js", "/ui/app", "/ui/app.css\x00.js"):
        assert asset_parts(bad) is None, bad
    assert "connect-src 'self'" in CSP.decode()


async def test_the_unix_socket_says_where_the_console_is(gw: RunningGateway) -> None:
    reply = await request(gw.unix, "GET", "/ui/")
    assert reply.status == 404
    message = json.loads(reply.body)["error"]["message"]
    assert f"http://localhost:{gw.gateway.ctx.tcp_port}/ui/" in message


async def test_same_access_rule_as_other_gets(start_gateway: StartGateway,
                                              remote_seam: None) -> None:
    gw = await start_gateway([])
    assert (await remote_request(gw, "GET", "/ui/")).status == 401  # a remote peer needs a key
    assert (await remote_request(gw, "GET", "/v1/models")).status == 401
    strict = await start_gateway([], require_auth=True)
    assert (await request(strict.tcp, "GET", "/ui/app.css")).status == 401
    reply = await request(strict.tcp, "GET", "/ui/app.css", headers=[
        ("authorization", f"Bearer {strict.gateway.ctx.settings.secrets.admin_token}")])
    assert reply.status == 200


async def test_a_foreign_origin_is_refused(gw: RunningGateway) -> None:
    reply = await request(gw.tcp, "GET", "/ui/", headers=[("origin", "http://evil.example")])
    assert reply.status == 403
    reply = await raw(gw.tcp, b"GET /ui/ HTTP/1.1\r\nHost: evil.example\r\n"
                              b"Connection: close\r\n\r\n")
    assert reply.status == 403  # DNS rebinding


def test_every_static_file_is_package_data() -> None:
    """setup.cfg's package_data patterns cover each file under the static folder."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = cfg["options.package_data"]["proxy.console"].split()
    package = STATIC_DIR.parent
    for path in STATIC_DIR.rglob("*"):
        if path.is_file():
            relative = path.relative_to(package)
            assert any(relative.match(p) for p in patterns), f"{relative} is not package data"
