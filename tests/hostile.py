"""The harness of the hostile-input suites (tests/test_hostile_*.py): one hostile request
sent over a raw connection while a well-behaved client waits on another, and the checks
that follow every case (SPEC §6.1): the status, the close, nothing forwarded that should not
be, no ERROR record or traceback in the log, the bystander served, a health check answered.
Each case is recorded in the run's figures (``bad_inputs_tried``, ``crashes``,
``smuggled_requests``)."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from tests.client import chat_body
from tests.conftest import RunningGateway
from tests.fakeupstream import FakeUpstream, ReceivedRequest, json_completion
from tests.figures import Figures
from tests.rawhttp import Raw, RawResponse, T, assert_openai_error

CHAT = chat_body()
# The path a smuggled request aims at: nothing else in these suites ever asks for it.
SMUGGLED_PATH = "/v1/completions"
SMUGGLED = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%b"
            % (len(CHAT), CHAT))
# The bystander's path: its one request is counted apart from the hostile ones.
BYSTANDER_PATH = "/v1/embeddings"
BYSTANDER_BODY = json.dumps({"model": "fake-model", "input": "hello"}).encode()
MAX_BODY = 4096  # the gateways of these suites: small enough to hit the limit cheaply


def chunked(body: bytes) -> bytes:
    """``body`` as one chunk and the last chunk."""
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


def serve_everything(upstream: FakeUpstream) -> None:
    for path in ("/v1/chat/completions", SMUGGLED_PATH, BYSTANDER_PATH):
        upstream.on("POST", path, json_completion())


class Bystander:
    """A well-behaved client on its own connection: half its request is sent before the
    hostile case, the rest after; it must be answered as if nothing happened."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw

    @classmethod
    async def start(cls, address: str) -> Bystander:
        raw = await Raw.open(address)
        await raw.send(b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\n"
                       b"Content-Type: application/json\r\n")
        return cls(raw)

    async def finish(self) -> RawResponse:
        try:
            with trio.fail_after(T):
                await self.raw.send(b"Content-Length: %d\r\n\r\n%b"
                                    % (len(BYSTANDER_BODY), BYSTANDER_BODY))
                return await self.raw.response()
        finally:
            await self.raw.aclose()


def log_problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """ERROR records and tracebacks the gateway logged."""
    problems = [f"{r.name}: {r.getMessage()}" for r in caplog.records
                if r.levelno >= logging.ERROR]
    if "Traceback" in caplog.text:
        problems.append("a traceback in the log")
    return problems


def tally(figures: Figures, caplog: pytest.LogCaptureFixture, inputs: int = 1) -> list[str]:
    """Count ``inputs`` bad inputs tried and, if the log shows a problem, one crash; the
    problems (for the caller to assert on after its other checks)."""
    figures.count("bad_inputs_tried", inputs)
    problems = log_problems(caplog)
    figures.count("crashes", 1 if problems else 0)
    return problems


def forwarded_headers_clean(requests: list[ReceivedRequest]) -> None:
    """What reached the upstream carries no hop-by-hop framing or control bytes."""
    for req in requests:
        for name, value in req.headers:
            assert name not in (b"transfer-encoding", b"upgrade", b"te", b"trailer"), req
            assert not any(c in value for c in b"\r\n\x00"), req


class Outcome:
    """What one hostile case produced."""

    def __init__(self, responses: list[RawResponse], rest: bytes, closed: bool) -> None:
        self.responses = responses
        self.rest = rest
        self.closed = closed

    @property
    def first(self) -> RawResponse:
        assert self.responses, "no response at all"
        return self.responses[0]


async def send_hostile(address: str, data: bytes, *, answers: int = 1,
                       until_close: bool = True, head_only: int = 0) -> Outcome:
    """Send ``data``, read up to ``answers`` responses, then (``until_close``) whatever
    comes until the gateway closes (bounded by T: a connection left open counts as not
    closed). The first ``head_only`` answers are to HEAD requests: no body is read."""
    raw = await Raw.open(address)
    responses: list[RawResponse] = []
    closed = False
    rest = b""
    try:
        with trio.move_on_after(T):
            await raw.send(data)
            for i in range(answers):
                try:
                    responses.append(await raw.response(head_only=i < head_only))
                except AssertionError:  # closed before (another) response
                    break
            if until_close:
                rest = await raw.rest()
                closed = True
    finally:
        await raw.aclose()
    return Outcome(responses, rest, closed)


async def check_aftermath(gw: RunningGateway, upstream: FakeUpstream, transport: str,
                          bystander: Bystander, caplog: pytest.LogCaptureFixture,
                          figures: Figures, *, forwarded: int = 0, tried: int = 1) -> None:
    """The checks every hostile case ends with (see the module docstring); ``forwarded``:
    how many chat requests the case may have passed on."""
    answer = await bystander.finish()
    smuggled = len(upstream.requests_to(SMUGGLED_PATH))
    chats = upstream.requests_to("/v1/chat/completions")
    smuggled += max(len(chats) - forwarded, 0)
    healthy = True
    try:
        with trio.fail_after(T):
            probe = await send_hostile(gw.address(transport),
                                       b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
                                       b"Connection: close\r\n\r\n")
        healthy = probe.first.status == 200
    except (AssertionError, OSError, trio.TooSlowError):
        healthy = False
    problems = log_problems(caplog)
    figures.count("bad_inputs_tried", tried)
    figures.count("smuggled_requests", smuggled)
    figures.count("crashes", 1 if problems or not healthy else 0)
    assert not problems, problems
    assert healthy, "the gateway stopped answering /health"
    assert smuggled == 0, (upstream.requests_to(SMUGGLED_PATH), chats)
    assert answer.status == 200, answer
    assert len(upstream.requests_to(BYSTANDER_PATH)) == 1
    forwarded_headers_clean(upstream.requests_to("/v1/chat/completions"))


def assert_refusal(outcome: Outcome, status: int, *, closes: bool = True) -> None:
    resp = outcome.first
    assert resp.status == status, resp
    assert resp.header("content-type") == "application/json", resp
    assert_openai_error(resp.body)
    if closes:
        assert resp.header("connection") == "close", resp
        assert outcome.closed, "the connection stayed open"
        assert outcome.rest == b"", outcome.rest
