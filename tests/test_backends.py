"""Local backends: the health poll keeps the model index current; upstream connections are
pooled, and a pooled connection the server has dropped is retried once on a fresh one."""

from __future__ import annotations

from pathlib import Path

import trio

from protocol.config import default_config
from tests.client import CHAT, chat_body, request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
    sse_events,
    sse_stream,
)
from tests.waits import settled

INTERVAL = default_config().health_checks.interval


async def model_ids(address: str) -> list[str]:
    return [m["id"] for m in (await request(address, "GET", "/v1/models")).json()["data"]]


# Under the autojump clock every hop is a Unix socket (no bytes in flight when it jumps).


async def test_health_poll_follows_the_backend(autojump_clock: trio.testing.MockClock,
                                               unix_upstream: FakeUpstream,
                                               start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", unix_upstream.url)])
    assert await model_ids(gw.unix) == ["fake-model"]
    polls = len(unix_upstream.requests_to("/v1/models"))
    await trio.sleep(INTERVAL * 3 + 0.1)
    assert len(unix_upstream.requests_to("/v1/models")) == polls + 3  # once per interval
    unix_upstream.models = ["other"]
    await trio.sleep(INTERVAL)
    assert await model_ids(gw.unix) == ["other"]
    reply = await request(gw.unix, "POST", CHAT, chat_body("fake-model"))
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "model_not_available"


async def test_offline_backend_leaves_the_list(autojump_clock: trio.testing.MockClock,
                                               start_gateway: StartGateway,
                                               nursery: trio.Nursery, short_tmp: Path) -> None:
    up = FakeUpstream(models=["m"], unix_path=str(short_tmp / "m.sock"))

    # Serve in a scope we can cancel: the server "dies".
    async def serve_until(scope: trio.CancelScope, task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await up.serve(task_status=task_status)

    scope = trio.CancelScope()
    await nursery.start(serve_until, scope)
    gw = await start_gateway([("fake", up.url)])
    assert await model_ids(gw.unix) == ["m"]
    scope.cancel()
    await trio.sleep(INTERVAL + 0.1)
    assert await model_ids(gw.unix) == []
    backend = gw.gateway.backends.backends[0]
    assert not backend.online
    assert backend.last_error


async def test_health_check_timeout(autojump_clock: trio.testing.MockClock,
                                    unix_upstream: FakeUpstream,
                                    start_gateway: StartGateway) -> None:
    async def slow_models(req: ReceivedRequest, w: ResponseWriter) -> None:
        await trio.sleep(60)

    gw = await start_gateway([("fake", unix_upstream.url)])
    unix_upstream.on("GET", "/v1/models", slow_models)
    await trio.sleep(INTERVAL + default_config().timeouts.health_check.timeout + 0.1)
    assert await model_ids(gw.unix) == []
    assert "did not answer" in str(gw.gateway.backends.backends[0].last_error)


async def test_a_written_post_is_never_sent_twice(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """A reused connection that the server closes after reading the request: the POST may
    already be running there, so it is that upstream's failure (502 for a local backend),
    never a silent second send (UPSTREAMS.md)."""
    served: list[int] = []
    dropped: list[int] = []

    async def flaky(req: ReceivedRequest, w: ResponseWriter) -> None:
        if req.conn_id in served:  # a reused connection: read the request, then close
            dropped.append(req.conn_id)
            await w.close()
            return
        served.append(req.conn_id)
        await json_completion()(req, w)

    upstream.on("POST", CHAT, flaky)
    gw = await start_gateway([("fake", upstream.url)])
    statuses = [(await request(gw.tcp, "POST", CHAT, chat_body())).status for _ in range(4)]
    # Fresh connection: 200; the pooled one then closes unanswered: 502; fresh again...
    assert statuses == [200, 502, 200, 502]
    assert len(upstream.requests_to(CHAT)) == 4  # each request reached the server once
    assert len(served) == 2
    assert len(dropped) == 2


async def test_a_connection_found_closed_before_writing_is_replaced(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """An idle pooled connection the server has closed (llama.cpp closes after a stream) is
    noticed before the request is written, and a fresh one is used, silently."""

    async def answer_then_close(req: ReceivedRequest, w: ResponseWriter) -> None:
        await json_completion()(req, w)
        await w.close()  # after the answer: the pooled connection is dead when reused

    upstream.on("POST", CHAT, answer_then_close)
    gw = await start_gateway([("fake", upstream.url)])
    for _ in range(3):
        assert (await request(gw.tcp, "POST", CHAT, chat_body())).status == 200
        conn_id = upstream.requests_to(CHAT)[-1].conn_id  # idles in the pool, closed by it:
        await settled(lambda c=conn_id: c in upstream.ended_at, "the server's close")
    assert len(upstream.requests_to(CHAT)) == 3


async def test_connection_closed_after_stream_is_not_reused(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    upstream.on("POST", CHAT, sse_stream(sse_events(2), then_close=True))
    gw = await start_gateway([("fake", upstream.url)])
    for _ in range(3):
        reply = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
        assert reply.complete
        assert reply.body == b"".join(sse_events(2))


async def test_keep_alive_to_upstream(upstream: FakeUpstream,
                                      start_gateway: StartGateway) -> None:
    upstream.on("POST", CHAT, json_completion())
    gw = await start_gateway([("fake", upstream.url)])
    for _ in range(5):
        assert (await request(gw.tcp, "POST", CHAT, chat_body())).status == 200
    conns = {r.conn_id for r in upstream.requests_to(CHAT)}
    assert len(conns) == 1  # one pooled connection served them all


async def test_backend_key_is_sent_and_client_auth_is_not(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    upstream.on("POST", CHAT, json_completion())
    gw = await start_gateway([("fake", upstream.url)])
    settings = gw.gateway.settings
    settings.secrets.backend_keys["fake"] = "backend-secret"
    await settings.save_secrets()
    # The registry reads keys at start; rebuild it the way a restart would.
    from proxy.registry.backends import LocalBackend

    old = gw.gateway.backends.backends[0]
    fresh = LocalBackend(settings.config.backends[0], "backend-secret")
    gw.gateway.backends.backends[0] = fresh
    gw.gateway.backends.checked(fresh, old.models, None, None)
    await request(gw.tcp, "POST", CHAT, chat_body(),
                  headers=[("authorization", "Bearer client-token")])
    seen = upstream.requests_to(CHAT)[-1]
    assert seen.header("authorization") == "Bearer backend-secret"
    assert "backend-secret" not in repr(fresh)
    assert "backend-secret" not in (settings.data_dir / "config.yaml").read_text()
