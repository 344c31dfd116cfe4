"""The exchange's phases (read, authorize, route, relay, settle) with a fake request source
and a fake downstream: no sockets. Each test drives one request through Exchange.run and
looks at what was written, what the response state became and what was recorded."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import attrs
import h11
import pytest
import trio

from protocol.access import hash_key, new_access_key
from protocol.config import BackendConfig, default_config
from protocol.errors import SluiceError, request_timeout
from protocol.headers import Header
from protocol.response import Response, State
from proxy.context import Clients, GatewayContext, Listening
from proxy.deadline import RequestScope
from proxy.errors import ClientGone
from proxy.exchange import Exchange
from proxy.link.listener import TCP, UNIX, Peer
from proxy.notifications import Notifications
from proxy.observe.hub import Hub
from proxy.observe.metrics import Metrics
from proxy.observe.request_log import RequestLog
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.settings.store import Settings
from proxy.upstream.pool import ConnectionPool
from tests.conftest import open_settings

CHAT = b"/v1/chat/completions"


class FakeSource:
    """The connection's read side: one prepared request."""

    def __init__(self, method: bytes, target: bytes, headers: list[Header], body: bytes = b"",
                 *, fail: SluiceError | None = None) -> None:
        self.request = h11.Request(method=method, target=target,
                                   headers=[(b"host", b"localhost"), *headers])
        self.headers: list[Header] = list(self.request.headers)
        self.body = body
        self.fail = fail
        self.body_read = False

    async def read_head(self) -> h11.Request:
        if self.fail is not None:
            raise self.fail
        return self.request

    async def read_body(self, limit: int, feed: Any = None) -> bytes:
        self.body_read = True
        if feed is not None:
            feed(self.body)
        return self.body


class FakeDownstream:
    """The Downstream interface, collecting the bytes instead of writing them."""

    def __init__(self) -> None:
        self.response = Response()
        self.gone = False
        self.sent = b""
        self.first_at: float | None = None
        self.bytes_sent = 0
        self.error_code: str | None = None

    def begin(self, response: Response) -> None:
        self.response = response

    @property
    def chunked(self) -> bool:
        return self.response.chunked

    def frame(self, data: bytes) -> bytes:
        return self.response.frame(data)

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"", *, cors: Any = ()) -> None:
        data = self.response.whole(status, headers, body, reason, cors=cors)
        self.sent += data
        self.bytes_sent += len(data)

    async def send_json(self, status: int, payload: Any) -> None:
        await self.send_whole(status, [(b"content-type", b"application/json")],
                              json.dumps(payload).encode())

    async def send_error(self, err: SluiceError) -> None:
        if self.response.started:
            self.response.broken()
            return
        self.error_code = err.code
        await self.send_whole(err.status, [(b"content-type", b"application/json")],
                              err.body())

    def status(self) -> int:
        return int(self.sent.split(b" ", 2)[1])

    def sent_error_code(self) -> Any:
        return json.loads(self.sent.split(b"\r\n\r\n", 1)[1])["error"]["code"]


def context(data_dir: Path, backends: tuple[BackendConfig, ...] = ()) -> GatewayContext:
    settings: Settings = open_settings(data_dir, attrs.evolve(default_config(),
                                                              backends=backends))
    registry = BackendRegistry(settings.config.backends, {})
    registry.ready.set()
    nodes = NodeIndex()
    nodes.round_done()
    hub = Hub()
    log = RequestLog(settings.config.observability.request_log_size)
    log.attach(hub)
    router = Router(settings, registry, nodes)
    clients = Clients()
    metrics = Metrics(router, clients.by_transport, "test")
    metrics.attach(hub)
    return GatewayContext(
        settings=settings, connections=ConnectionPool(), backends=registry, nodes=nodes,
        router=router, notifications=Notifications(),
        clients=clients, listening=Listening(socket_path="/nowhere.sock"), hub=hub,
        request_log=log, metrics=metrics)


async def run(ctx: GatewayContext, source: FakeSource, *, peer: Peer | None = None,
              scope: RequestScope | None = None,
              out: FakeDownstream | None = None) -> FakeDownstream:
    out = out or FakeDownstream()
    exchange = Exchange(ctx, source, out, scope or RequestScope(),  # type: ignore[arg-type]
                        peer or Peer(UNIX))
    await exchange.run()
    return out


def chat(model: str = "m", stream: bool = False) -> bytes:
    return json.dumps({"model": model, "stream": stream, "messages": []}).encode()


async def test_an_endpoint_of_ours(tmp_path: Path) -> None:
    out = await run(context(tmp_path), FakeSource(b"GET", b"/health", []))
    assert out.status() == 200
    assert out.sent.endswith(b'{"status": "ok", "identity": null, "nodePort": null}')
    assert out.response.state is State.DONE
    assert out.response.reusable  # keep-alive: the connection may carry another request


async def test_read_phase_error_answers_and_closes(tmp_path: Path) -> None:
    source = FakeSource(b"GET", b"/health", [], fail=request_timeout("slow head"))
    out = await run(context(tmp_path), source)
    assert out.status() == 408
    assert b"connection: close" in out.sent
    assert not out.response.reusable


async def test_each_request_starts_a_fresh_answer(tmp_path: Path) -> None:
    """A second request on a kept connection whose head cannot be read still gets its error
    (the first answer's state does not carry over)."""
    ctx = context(tmp_path)
    out = await run(ctx, FakeSource(b"GET", b"/health", []))
    assert out.response.reusable
    out.sent = b""
    source = FakeSource(b"GET", b"/health", [], fail=request_timeout("slow head"))
    await run(ctx, source, out=out)
    assert out.status() == 408
    assert not out.response.reusable


async def test_http10_gets_one_answer(tmp_path: Path) -> None:
    source = FakeSource(b"GET", b"/health", [])
    source.request = h11.Request(method=b"GET", target=b"/health", headers=[],
                                 http_version=b"1.0")
    out = await run(context(tmp_path), source)
    assert out.status() == 200
    assert b"connection: close" in out.sent
    assert not out.response.reusable


async def test_route_phase_refusal_is_a_503_and_nothing_is_counted(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    out = await run(ctx, FakeSource(b"POST", CHAT, [], chat("nowhere")))
    assert (out.status(), out.sent_error_code()) == (503, "model_not_available")
    assert out.response.reusable  # a refusal keeps the connection
    assert ctx.router.local.total == 0


def remote_key(ctx: GatewayContext) -> str:
    _, key = new_access_key()
    ctx.settings.keys.load(
        [{"id": "ak-1", "name": "", "hash": hash_key(key), "created_at": "x",
          "last_used_at": None}])
    return key


@pytest.mark.parametrize(("length", "reads_body", "keeps"), [
    pytest.param(10, True, True, id="small_body_read_then_denied"),
    pytest.param(10**6, False, False, id="large_body_denied_and_closed"),
])
async def test_authorize_phase(tmp_path: Path, length: int, reads_body: bool,
                               keeps: bool) -> None:
    ctx = context(tmp_path)
    remote_key(ctx)
    source = FakeSource(b"POST", CHAT, [(b"content-length", b"%d" % length)], b"x" * 10)
    out = await run(ctx, source, peer=Peer(TCP, loopback=False))
    assert (out.status(), out.sent_error_code()) == (401, "missing_api_key")
    assert source.body_read is reads_body
    assert out.response.reusable is keeps


async def test_authorize_phase_records_the_key_used(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    key = remote_key(ctx)
    source = FakeSource(b"GET", b"/v1/models", [(b"authorization", f"Bearer {key}".encode())])
    out = await run(ctx, source, peer=Peer(TCP, loopback=False))
    assert out.status() == 200
    assert json.loads(out.sent.split(b"\r\n\r\n", 1)[1]) == {"object": "list", "data": []}
    assert ctx.settings.keys.all[0]["last_used_at"] is not None
    assert "ak-1" in (tmp_path / "secrets.yaml").read_text()


async def test_relay_failure_before_commit_is_settled_once(tmp_path: Path) -> None:
    """A local backend that just went down: the relay fails before anything was sent, the
    exchange answers 502 and settle records one failure."""
    ctx = context(tmp_path, (BackendConfig("here", "http://127.0.0.1:9"),))
    backend = ctx.backends.backends[0]
    ctx.backends.checked(backend, [{"id": "m"}], None, 1.0)
    backend.address = None  # as a managed server's is between its death and the index update
    out = await run(ctx, FakeSource(b"POST", CHAT, [], chat()))
    assert (out.status(), out.sent_error_code()) == (502, "upstream_connection_error")
    local = ctx.router.local
    assert (local.total, local.failure, local.active, local.aborted) == (1, 1, 0, 0)


async def test_client_gone_before_the_relay_is_aborted(tmp_path: Path) -> None:
    ctx = context(tmp_path, (BackendConfig("here", "http://127.0.0.1:9"),))
    ctx.backends.checked(ctx.backends.backends[0], [{"id": "m"}], None, 1.0)
    scope = RequestScope()
    scope.cancel()  # the connection's reader saw the client close
    with pytest.raises(ClientGone):
        await run(ctx, FakeSource(b"POST", CHAT, [], chat()), scope=scope)
    local = ctx.router.local
    assert (local.total, local.aborted, local.failure, local.active) == (1, 1, 0, 0)


async def test_preflight_on_any_path(tmp_path: Path) -> None:
    out = await run(context(tmp_path), FakeSource(b"OPTIONS", b"/anything", []))
    assert out.status() == 204
    assert b"allow: GET, POST" in out.sent


async def test_settle_waits_for_nothing(tmp_path: Path) -> None:
    """Settle records synchronously: no checkpoint between the relay's end and the record."""
    ctx = context(tmp_path, (BackendConfig("here", "http://127.0.0.1:9"),))
    ctx.backends.checked(ctx.backends.backends[0], [{"id": "m"}], None, 1.0)
    ctx.backends.backends[0].address = None
    with trio.fail_after(1):
        await run(ctx, FakeSource(b"POST", CHAT, [], chat()))
    assert ctx.router.local.active == 0


# ------------------------------------------------------------------ one outcome per request

async def outcome_of(ctx: GatewayContext, source: FakeSource, caplog: pytest.LogCaptureFixture,
                     *, scope: RequestScope | None = None) -> tuple[str, str]:
    """The outcome the exchange decided, and the one its access-log line says."""
    caplog.set_level(logging.INFO, logger="sluice.access")
    caplog.clear()
    exchange = Exchange(ctx, source, FakeDownstream(),  # type: ignore[arg-type]
                        scope or RequestScope(), Peer(UNIX))
    with contextlib.suppress(ClientGone):
        await exchange.run()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    return exchange.outcome, line.rsplit(" outcome=", 1)[1]


async def test_outcome_of_our_own_endpoints(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    ctx = context(tmp_path)
    assert await outcome_of(ctx, FakeSource(b"GET", b"/health", []), caplog) == (
        "success", "success")
    assert await outcome_of(ctx, FakeSource(b"GET", b"/nowhere", []), caplog) == (
        "refused", "refused")  # our 404
    assert await outcome_of(ctx, FakeSource(b"POST", CHAT, [], chat("nowhere")), caplog) == (
        "refused", "refused")  # our 503: no upstream was asked


async def test_outcome_of_a_relay_that_failed_or_whose_client_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctx = context(tmp_path, (BackendConfig("here", "http://127.0.0.1:9"),))
    backend = ctx.backends.backends[0]
    ctx.backends.checked(backend, [{"id": "m"}], None, 1.0)
    scope = RequestScope()
    scope.cancel()
    assert await outcome_of(ctx, FakeSource(b"POST", CHAT, [], chat()), caplog,
                            scope=scope) == ("aborted", "aborted")
    backend.address = None  # a 502 before anything was sent
    assert await outcome_of(ctx, FakeSource(b"POST", CHAT, [], chat()), caplog) == (
        "failure", "failure")


async def test_outcome_of_a_client_gone_before_any_answer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No upstream asked (as when the client leaves while its model loads): aborted."""
    async def leaves(exchange: Exchange, *args: Any) -> None:
        exchange.scope.cancel()
        raise ClientGone

    monkeypatch.setattr(Exchange, "answer", leaves)
    assert await outcome_of(context(tmp_path), FakeSource(b"POST", CHAT, [], chat()),
                            caplog) == ("aborted", "aborted")
