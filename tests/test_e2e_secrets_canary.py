"""Secrets hygiene (SPEC §2, §5): with canary secrets in secrets.yaml and every logger at
DEBUG, a scenario touching every access path must leave no 8-character piece of any secret
in the logs, the CLI's output, any GET endpoint's body or headers, any frame of the live
events feed (watched all along, with the admin token, an access key and none), any
``repr()``, or config.yaml."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import trio
import trio_websocket
import yaml

from protocol.access import KEY_PREFIX, hash_key
from proxy.server import Gateway
from tests.client import chat_body, connect, raw, request
from tests.conftest import REMOTE, RunningGateway, gateway_config, open_settings, remote_request
from tests.fakeupstream import FakeUpstream, json_completion
from tests.figures import Figures
from tests.waits import settled

ADMIN = "CanaryAdm1nT0ken-Qx7vWz9Lp2Rk5Ty8Nb4Mf6Hd3"
BACKEND_KEY = "CanaryBackendK3y-Jh2Gf5Sd8Ap1Lk4Zx7Cv0Bn3"
ACCESS_RANDOM = "CanaryAccessK3y-Uy6Tr9Ew2Qa5Sd8Fg1Hj4Kl7"
ACCESS_KEY = KEY_PREFIX + ACCESS_RANDOM  # the prefix is public; the rest is the secret
SECRETS = (ADMIN, BACKEND_KEY, ACCESS_RANDOM)

GET_PATHS = ("/health", "/v1/models", "/v1/models/fake-model", "/api/v1/inference/models",
             "/api/v1/inference/status", "/api/v1/notifications", "/api/v1/access-keys",
             "/api/v1/settings/api", "/metrics", "/api/v1/requests")


def leaks(text: str) -> list[str]:
    """Every 8-character piece of a canary found in ``text``."""
    return sorted({secret[i:i + 8] for secret in SECRETS for i in range(len(secret) - 7)
                   if secret[i:i + 8] in text})


@pytest.mark.usefixtures("remote_seam")
async def test_no_secret_escapes(nursery: trio.Nursery, short_tmp: Path,
                                 caplog: pytest.LogCaptureFixture, figures: Figures) -> None:
    caplog.set_level(logging.DEBUG)
    upstream = FakeUpstream()
    upstream.on("POST", "/v1/chat/completions", json_completion())
    await nursery.start(upstream.serve)
    data = short_tmp / "data"
    cfg = gateway_config([("fake", upstream.url)], socket_dir=short_tmp / "s")
    data.mkdir(mode=0o700)
    (data / "secrets.yaml").write_text(yaml.safe_dump({
        "admin_token": ADMIN, "backend_keys": {"fake": BACKEND_KEY},
        "access_keys": [{"id": "ak-canary", "name": "canary", "hash": hash_key(ACCESS_KEY),
                         "created_at": "2024-01-01T00:00:00Z", "last_used_at": None}]}))
    settings = open_settings(data, cfg)
    gateway = Gateway(settings, drain_timeout=1)
    await nursery.start(gateway.run)
    await gateway.backends.ready.wait()
    gw = RunningGateway(gateway)
    seen: list[str] = []

    def note(*parts: object) -> None:
        seen.extend(str(p) for p in parts)

    frames: list[str] = []  # every frame of the events feed, from three subscribers
    watching: list[trio.Event] = []

    async def watch(stream: trio.SocketStream, headers: list[tuple[bytes, bytes]], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        done = trio.Event()
        watching.append(done)
        try:
            async with trio.open_nursery() as inner:
                ws = await trio_websocket.wrap_client_stream(inner, stream, "localhost",
                                                             "/api/v1/events",
                                                             extra_headers=headers)
                frames.append(str(await ws.get_message()))  # hello: subscribed
                task_status.started()
                try:
                    while True:
                        frames.append(str(await ws.get_message()))
                except trio_websocket.ConnectionClosed:
                    pass
                inner.cancel_scope.cancel()
        finally:
            await stream.aclose()
            done.set()

    # A remote subscriber, with the access key.
    await nursery.start(watch, await connect(gw.tcp, source=REMOTE),
                        [(b"authorization", f"Bearer {ACCESS_KEY}".encode())])
    await nursery.start(watch, await connect(gw.tcp),
                        [(b"authorization", f"Bearer {ADMIN}".encode())])
    await nursery.start(watch, await connect(gw.unix), [])

    # The backend key goes upstream (that is its purpose) and nowhere else.
    bearer = [("authorization", f"Bearer {ACCESS_KEY}")]
    reply = await remote_request(gw, "POST", "/v1/chat/completions", chat_body(), bearer)
    assert reply.status == 200
    assert (b"authorization", f"Bearer {BACKEND_KEY}".encode()) in upstream.requests[-1].headers
    note(reply.headers, reply.body)
    for token in (ACCESS_KEY[:-1], ADMIN[:-1] + "x", "bad token", ADMIN + "\x01"):
        for transport in ("tcp", "unix"):
            for method, path in (("POST", "/api/v1/access-keys"), ("GET", "/admin/stats"),
                                 ("POST", "/v1/chat/completions")):
                r = await request(gw.address(transport), method, path, chat_body(),
                                  [("authorization", f"Bearer {token}")])
                note(r.status, r.headers, r.body)
        r = await remote_request(gw, "GET", "/v1/models", None,
                                 [("authorization", f"Bearer {token}")])
        note(r.status, r.headers, r.body)
    # A malformed head quoting a secret.
    bad = await raw(gw.tcp, b"GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
                    b"Bearer " + ADMIN.encode() + b"\x00\r\nConnection: close\r\n\r\n")
    assert bad.status == 400
    note(bad.headers, bad.body)
    admin = [("authorization", f"Bearer {ADMIN}")]
    made = await request(gw.unix, "POST", "/api/v1/access-keys", b'{"name": "x"}', admin)
    assert made.status == 201
    changed = await request(gw.tcp, "PUT", "/api/v1/settings/api", b'{"requireAuth": true}',
                            admin)
    assert changed.status == 200
    note(changed.body)
    refused = await request(gw.tcp, "PUT", "/api/v1/settings/api", b'{"port": "x"}', admin)
    assert refused.status == 422
    note(refused.body)
    for path in GET_PATHS:
        for transport in ("unix", "tcp"):
            r = await request(gw.address(transport), "GET", path, None, admin)
            assert r.status == 200, (path, r.body)
            note(r.headers, r.body)
        r = await remote_request(gw, "GET", path, None, bearer)
        assert r.status == 200, (path, r.body)
        note(r.body)
    cli = [await trio.run_process([sys.executable, "-m", "proxy", *args, "--data-dir", str(data)],
                                  capture_stdout=True, capture_stderr=True, check=False)
           for args in (["status"], ["status", "--json"], ["keys", "list"])]
    assert all(result.returncode == 0 for result in cli)
    note(*(result.stdout.decode() + result.stderr.decode() for result in cli))
    note(repr(gateway), repr(settings), repr(settings.secrets), str(settings.secrets),
         repr(gateway.ctx), repr(settings.config))
    note((data / "config.yaml").read_text())
    gateway.shutdown()
    await settled(lambda: not (data / "state.json").exists(), "the gateway stopped")
    with trio.fail_after(5):
        for done in watching:  # each subscriber got its close frame
            await done.wait()
    assert len(frames) > 3
    assert any('"type":"request"' in f for f in frames)
    note(*frames)
    logs = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records  # DEBUG capture was on and the gateway logged
    hits = leaks(logs) + leaks("\n".join(seen))
    figures.count("secret_canary_hits", len(hits))
    figures.count("secret_canary_places_checked", len(seen) + len(caplog.records))
    assert leaks(logs) == []
    assert leaks("\n".join(seen)) == []
    # The secrets file itself does hold them (so the check above is meaningful).
    assert leaks((data / "secrets.yaml").read_text().replace(ACCESS_RANDOM, "")) != []


def test_canary_helper_finds_pieces() -> None:
    assert leaks(f"x{ADMIN[3:11]}y") == [ADMIN[3:11]]
    assert leaks(KEY_PREFIX) == []
