"""The console's Playground (SPEC §10) in real Chromium against a real gateway and a fake
model server: a reply streams in token by token from the model the user picks, then shows
who served it, the time to first token and tokens per second; the Requests screen (open in
another tab) shows that request live; Stop ends a stream and the gateway sees the client
go; axe on light, dark and 360 px."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser import ConsoleGateway, restyle
from tests.client import CHAT
from tests.fakeupstream import CREATED, sse_stream

WORDS = ["Hello", " from", " the", " fake", " model", ",", " one", " token", " at", " a",
         " time", "."]
GAP = 0.15  # seconds between chunks: slow enough to see a reply grow


def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
    obj: dict[str, Any] = {
        "id": "chatcmpl-ui", "object": "chat.completion.chunk", "created": CREATED,
        "model": "local-m",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def story(words: list[str]) -> list[bytes]:
    """A llama.cpp-like stream: role, one chunk per word, finish, usage, [DONE]."""
    usage = {"prompt_tokens": 7, "completion_tokens": len(words),
             "total_tokens": 7 + len(words)}
    return [chunk({"role": "assistant", "content": None}),
            *(chunk({"content": w}) for w in words),
            chunk({}, "stop"), chunk({}, usage=usage), b"data: [DONE]\n\n"]


@pytest.fixture
def streaming_model(console_gateway: ConsoleGateway) -> ConsoleGateway:
    console_gateway.model.on("POST", CHAT, sse_stream(story(WORDS), gap=GAP))
    return console_gateway


def send(page: Any, model: str, text: str) -> None:
    page.get_by_label("Model").select_option(model)
    page.get_by_label("Message").fill(text)
    page.get_by_role("button", name="Send").click()


def figure(page: Any, name: str) -> Any:
    """The value shown for one of the figures under the reply."""
    return page.locator("dl.facts div", has=page.locator("dt", has_text=name)).locator("dd")


def test_reply_streams_token_by_token_and_shows_who_served_it(
        streaming_model: ConsoleGateway, console_page: Any, axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = streaming_model
    log_page = console_page(gw, "/requests")  # another tab: the request shows there live
    page = console_page(gw, "/playground")
    expect(page.get_by_role("heading", name="Playground", level=1)).to_be_visible()
    listed = {m["id"] for m in gw.get("/v1/models")["data"]}
    options = page.get_by_label("Model").locator("option")
    assert set(options.evaluate_all("os => os.map(o => o.value)")) == listed
    assert "shared-m (remote)" in options.all_inner_texts()  # who holds it, in the label
    send(page, "local-m", "Say hello")
    reply = page.locator('[data-role="assistant"] p').last
    conversation = page.get_by_role("log", name="Conversation")
    expect(conversation).to_have_attribute("aria-live", "polite")
    # Part of it first, while the rest is still coming: token by token, not all at once.
    expect(reply).to_contain_text("Hello from")
    partial = reply.inner_text()
    assert partial != "".join(WORDS), partial
    expect(page.get_by_role("button", name="Stop")).to_be_enabled()
    expect(conversation).to_have_attribute("aria-busy", "true")
    expect(figure(page, "Served by")).to_have_text("local:local")
    expect(reply).to_have_text("".join(WORDS), timeout=10_000)
    expect(page.get_by_role("status").filter(has_text="Done in")).to_be_visible()
    expect(conversation).to_have_attribute("aria-busy", "false")
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    expect(figure(page, "Completion tokens")).to_have_text(str(len(WORDS)))
    expect(figure(page, "Tokens per second")).to_contain_text("tok/s")
    ttft = figure(page, "Time to first token").inner_text()
    assert ttft.endswith("ms") or ttft.endswith("s"), ttft
    request_id = figure(page, "Request id").inner_text()

    entry = gw.get("/api/v1/requests?limit=1")["requests"][0]
    assert entry["id"] == request_id
    assert entry["stream"] is True
    assert entry["outcome"] == "success"
    assert entry["usage"]["completion_tokens"] == len(WORDS)
    sent = json.loads(gw.model.requests_to(CHAT)[-1].body)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [{"role": "user", "content": "Say hello"}]
    logged = log_page.locator(f'[data-id="{request_id}"]')
    expect(logged).to_contain_text("local:local")
    expect(logged).to_contain_text("stream")
    expect(logged).to_contain_text("tok/s")
    axe(page, "playground")
    screenshot(page, "playground")
    screenshot(log_page, "playground-request-log")

    # The conversation goes on: the next request carries the history.
    send(page, "local-m", "Again")
    expect(page.locator('[data-role="assistant"] p')).to_have_count(2)
    expect(page.locator('[data-role="assistant"] p').last).to_have_text("".join(WORDS),
                                                                         timeout=10_000)
    sent = json.loads(gw.model.requests_to(CHAT)[-1].body)
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]


def test_stop_ends_the_stream(streaming_model: ConsoleGateway, console_page: Any,
                              screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = streaming_model
    gw.model.on("POST", CHAT, sse_stream(story(WORDS * 20), gap=GAP))
    page = console_page(gw, "/playground")
    send(page, "local-m", "Talk for a while")
    reply = page.locator('[data-role="assistant"] p').last
    expect(reply).to_contain_text("Hello from")
    page.get_by_role("button", name="Stop").click()
    expect(page.get_by_role("status").filter(has_text="Stopped")).to_be_visible()
    expect(reply).to_contain_text("[stopped]")
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    # The gateway saw the client go: the request is logged as aborted, quickly.
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    for _ in range(50):
        entry = gw.get("/api/v1/requests?limit=1")["requests"][0]
        if entry["model"] == "local-m" and entry["outcome"] == "aborted":
            break
        page.wait_for_timeout(100)
    assert entry["outcome"] == "aborted", entry
    screenshot(page, "playground-stopped")


def test_an_unknown_model_shows_the_gateway_error(streaming_model: ConsoleGateway,
                                                  console_page: Any) -> None:
    from playwright.sync_api import expect

    gw = streaming_model
    page = console_page(gw, "/playground")
    page.get_by_label("Model").evaluate(
        "s => { s.append(new Option('gone-m', 'gone-m')); }")  # a model that left the list
    send(page, "gone-m", "Anyone?")
    expect(page.get_by_role("status").filter(has_text="not available")).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_enabled()


def test_playground_narrow_and_dark(streaming_model: ConsoleGateway, console_page: Any,
                                    axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = streaming_model
    page = console_page(gw, "/playground", width=360, color_scheme="light")
    send(page, "local-m", "Hello there")
    expect(page.locator('[data-role="assistant"] p').last).to_have_text("".join(WORDS),
                                                                         timeout=10_000)
    expect(page.get_by_role("status").filter(has_text="Done in")).to_be_visible()
    for width, scheme in [(360, "light"), (1280, "dark")]:  # the reply, in both variants
        restyle(page, width=width, color_scheme=scheme)
        expect(page.locator('[data-role="assistant"] p').last).to_have_text("".join(WORDS))
        axe(page, f"playground {width}px {scheme}")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        screenshot(page, f"playground-{width}-{scheme}")
