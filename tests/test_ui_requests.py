"""The console's Requests screen (SPEC §10, §9.1) in real Chromium against a real gateway:
finished requests arrive live from the events feed (no reload, no polling), newest first,
with who served them, TTFB, TTFT, duration, tokens per second where usage is known and failovers
marked; the filters by model and by who served it; axe on light, dark and 360 px."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import ConsoleGateway, restyle
from tests.client import CHAT
from tests.fakenode import chat_answer
from tests.fakeupstream import json_completion, status

pytestmark = pytest.mark.usefixtures("local_answers")



@pytest.fixture
def local_answers(console_gateway: ConsoleGateway) -> None:
    """The local fake model answers chats (whole, with usage) while a test runs."""
    console_gateway.model.on("POST", CHAT, json_completion("hello from local", "local-m"))


def entries(gateway: ConsoleGateway, **filters: str) -> list[dict[str, Any]]:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    body = gateway.get(f"/api/v1/requests?{query}" if query else "/api/v1/requests")
    result: list[dict[str, Any]] = body["requests"]
    return result


def row(page: Any, request_id: str) -> Any:
    return page.locator(f'[data-id="{request_id}"]')


def test_requests_arrive_live_newest_first_and_filter(
        console_gateway: ConsoleGateway, console_page: Any, axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    page = console_page(gw, "/requests")
    expect(page.get_by_role("heading", name="Requests", level=1)).to_be_visible()
    assert gw.chat("local-m") == 200
    assert gw.chat("shared-m") == 200  # no local holder: the top node (studio) serves it
    assert gw.chat("no-such-model") == 503
    newest = entries(gw, limit="3")
    assert [e["model"] for e in newest] == ["no-such-model", "shared-m", "local-m"]
    for entry in newest:  # each came from the feed: the page was not reloaded
        expect(row(page, entry["id"])).to_be_visible()
    ids = page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert ids[:3] == [e["id"] for e in newest]  # newest first, as the log

    local, node, refused = (row(page, e["id"]) for e in reversed(newest))
    expect(local).to_contain_text("local:local")
    expect(local).to_contain_text("200")
    expect(local).to_contain_text("success")
    expect(local.locator("td").nth(8)).to_contain_text("tok/s")  # usage: 1 completion token
    expect(local.locator("td").nth(6)).to_have_text("—")  # a whole answer has no TTFT
    expect(node).to_contain_text(f"node:{gw.fingerprint('studio')}")
    expect(refused).to_contain_text("503")
    expect(refused).to_contain_text("model_not_available")
    expect(refused.locator("td").nth(8)).to_have_text("—")  # no usage, no rate

    page.get_by_label("Model").select_option("local-m")
    expect(page.locator("tbody tr")).not_to_have_count(0)
    models = page.locator("tbody tr td:nth-child(3)").all_inner_texts()
    assert set(models) == {"local-m"}
    page.get_by_label("Served by").select_option(f"node:{gw.fingerprint('studio')}")
    expect(page.locator("tbody tr")).to_have_count(0)
    expect(page.get_by_text("0 of")).to_be_visible()
    page.get_by_label("Model").select_option("")
    expect(node).to_be_visible()
    expect(local).to_be_hidden()
    page.get_by_label("Served by").select_option("")

    assert gw.chat("local-m") == 200  # a new one shows while the page is open, on top
    latest = entries(gw, limit="1")[0]
    expect(page.locator("tbody tr").first).to_have_attribute("data-id", latest["id"])
    axe(page, "requests")
    screenshot(page, "requests")


def test_a_failover_is_marked(console_gateway: ConsoleGateway, console_page: Any,
                              screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    studio = gw.nodes["studio"]
    page = console_page(gw, "/requests")
    studio.answer(status(500))
    try:
        assert gw.chat("shared-m") == 200  # studio's 500 fails over to laptop
    finally:
        studio.answer(chat_answer(f"from {studio.fingerprint}"))
    entry = entries(gw, limit="1")[0]
    assert entry["failover"] == gw.fingerprint("studio")
    assert entry["servedBy"] == f"node:{gw.fingerprint('laptop')}"
    line = row(page, entry["id"])
    expect(line).to_contain_text(f"failover from {gw.fingerprint('studio')}")
    expect(line).to_contain_text(f"node:{gw.fingerprint('laptop')}")
    screenshot(page, "requests-failover")


def test_a_refresh_rereads_the_log(console_gateway: ConsoleGateway, console_page: Any) -> None:
    """What finished while the feed was away shows after it reconnects (the hello's
    refresh re-reads GET /api/v1/requests)."""
    from playwright.sync_api import expect

    gw = console_gateway
    page = console_page(gw, "/requests")
    # The feed is up first (its socket open, the hello read): the socket closed below is the
    # live one, not one still connecting
    expect(page.locator("#connection")).to_have_text("live", timeout=15_000)
    page.context.set_offline(True)  # no reconnect gets through meanwhile
    page.evaluate("async () => { (await import('/ui/js/feed.js')).feed.socket.close(); }")
    expect(page.locator("#connection")).to_have_text("reconnecting", timeout=15_000)
    assert gw.chat("local-m") == 200
    missed = entries(gw, limit="1")[0]
    expect(row(page, missed["id"])).to_have_count(0)
    page.context.set_offline(False)
    expect(page.locator("#connection")).to_have_text("live", timeout=15_000)
    expect(row(page, missed["id"])).to_be_visible()


def test_requests_narrow_and_dark(console_gateway: ConsoleGateway, console_page: Any, axe: Any,
                                  screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    assert gw.chat("local-m") == 200
    page = console_page(gw, "/requests", width=360, color_scheme="light")
    for width, scheme in [(360, "light"), (1280, "dark")]:  # one page, both variants
        restyle(page, width=width, color_scheme=scheme)
        first = page.locator("[data-id]").first
        expect(first).to_be_visible()
        expect(first).to_contain_text("local-m")
        if width < 600:  # cards, not a table that would scroll sideways
            expect(page.locator("table")).to_be_hidden()
            assert page.evaluate("document.documentElement.scrollWidth") <= width
        axe(page, f"requests {width}px {scheme}")
        screenshot(page, f"requests-{width}-{scheme}")


def test_tokens_per_second_for_anthropic_and_responses_streams(
        console_gateway: ConsoleGateway, console_page: Any) -> None:
    """The rate comes from output_tokens as well (SPEC §12: three stream grammars)."""
    from http.client import HTTPConnection

    from playwright.sync_api import expect

    from tests.fakeupstream import sse_stream
    from tests.test_dialects import anthropic_stream, responses_stream

    gw = console_gateway
    gw.model.on("POST", "/v1/messages", sse_stream(anthropic_stream("a b c", "local-m")))
    gw.model.on("POST", "/v1/responses", sse_stream(responses_stream("local-m")))
    page = console_page(gw, "/requests")
    for path in ("/v1/messages", "/v1/responses"):
        conn = HTTPConnection("127.0.0.1", gw.gw.port, timeout=30)
        try:
            conn.request("POST", path, b'{"model": "local-m", "stream": true}',
                         {"Host": "localhost", "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        finally:
            conn.close()
    for entry in entries(gw, limit="2"):
        assert entry["usage"]["output_tokens"] > 0
        expect(row(page, entry["id"]).locator("td").nth(8)).to_contain_text("tok/s")
        expect(row(page, entry["id"]).locator("td").nth(6)).to_contain_text("ms")  # TTFT
