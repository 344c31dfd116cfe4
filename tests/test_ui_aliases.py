"""The console's Aliases screen (SPEC §12) in real Chromium against a real gateway process:
the table as the API has it (exact names, patterns in file order, whether each target is
available); add, edit (a refused value shows the server's message beside its field and
changes nothing), remove, and reorder the patterns (buttons and keyboard), each saved as the
whole table; a change made elsewhere shows up live, and a save's answer that comes after
a newer change's event does not draw over it; a request for an alias is served as its
target; read-only without the token; axe on light, dark and 360 px."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import pytest

from tests.browser import (
    ConsoleGateway,
    OpenPage,
    holding_puts,
    missing,
    restyle,
    running_gateway,
)

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import expect

ALIASES = "/api/v1/settings/aliases"
START = {"gpt-4o": "local-m", "claude-3-*": "studio-m", "ghost": "nobody",
         "claude-*": "shared-m"}


def status_of(control: Any) -> Any:
    """The saved/error line of a field (made by the field component)."""
    return control.locator("xpath=ancestor::div[contains(@class, 'field')][1]").locator(
        ".save-status")


def table(gw: ConsoleGateway) -> list[tuple[str, str]]:
    return list(gw.get(ALIASES)["aliases"].items())


def chat(gw: ConsoleGateway, model: str) -> tuple[int, str | None]:
    conn = HTTPConnection("127.0.0.1", gw.gw.port, timeout=30)
    try:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        conn.request("POST", "/v1/chat/completions", body,
                     {"Host": "localhost", "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("x-sluice-served-by")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def aliases_gateway() -> Iterator[ConsoleGateway]:
    """One gateway for the module (one node): each test starts from START's table."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    with running_gateway(("studio",)) as gw:
        yield gw


@pytest.fixture
def gateway(aliases_gateway: ConsoleGateway) -> ConsoleGateway:
    gw = aliases_gateway
    status, body = gw.api("PUT", ALIASES, {"aliases": START})
    assert status == 200, body
    assert table(gw) == list(START.items())
    return gw


def test_the_table_and_every_change(gateway: ConsoleGateway, console_page: OpenPage,
                                    axe: Any, screenshot: Any) -> None:
    gw = gateway
    page = console_page(gw, "/aliases")
    expect(page.get_by_role("heading", name="Aliases", level=1)).to_be_visible()
    exact = page.get_by_role("list", name="Exact names")
    expect(exact.get_by_role("listitem")).to_have_count(2)
    expect(page.get_by_label("Name of alias gpt-4o")).to_have_value("gpt-4o")
    expect(page.get_by_label("Target of gpt-4o")).to_have_value("local-m")
    gpt = exact.get_by_role("listitem").filter(has=page.get_by_label("Name of alias gpt-4o"))
    expect(gpt).to_contain_text("available")
    ghost = exact.get_by_role("listitem").filter(has=page.get_by_label("Name of alias ghost"))
    expect(ghost).to_contain_text("not available now")
    patterns = page.get_by_role("list", name="Patterns in the order they are tried")
    expect(patterns.get_by_role("button", name="Reorder claude-3-*")).to_be_visible()
    first = patterns.locator(".handle").first
    expect(first).to_have_attribute("aria-label", "Reorder claude-3-*")  # the file's order
    axe(page, "aliases")
    screenshot(page, "aliases")

    # A request for an alias is served by its target (studio-m is on the node "studio").
    assert chat(gw, "claude-3-opus") == (200, f"node:{gw.fingerprint('studio')}")

    # Add one; it goes last in the file.
    page.get_by_label("Name or pattern").fill("o1")
    page.get_by_label("Target model").fill("local-m")
    page.get_by_role("button", name="Add alias").click()
    expect(page.get_by_label("Name of alias o1")).to_have_value("o1")
    assert table(gw) == [*START.items(), ("o1", "local-m")]
    expect(page.get_by_label("Name or pattern")).to_have_value("")

    # A name the server refuses: its message, naming the field, and nothing changes.
    before = table(gw)
    page.get_by_label("Name or pattern").fill("bad name")
    page.get_by_label("Target model").fill("local-m")
    page.get_by_role("button", name="Add alias").click()
    alert = page.locator("#aliases-add-error")
    expect(alert).to_contain_text("aliases.bad name")
    expect(alert).to_contain_text("without spaces")
    expect(page.get_by_label("Name or pattern")).to_have_attribute("aria-invalid", "true")
    assert table(gw) == before
    screenshot(page, "aliases-refused-add")

    # Edit a target where it is shown; a refused one says why beside it.
    target = page.get_by_label("Target of gpt-4o")
    target.fill("shared-m")
    target.press("Enter")
    expect(status_of(target)).to_have_text("Saved")
    assert dict(table(gw))["gpt-4o"] == "shared-m"
    target.fill("two words")
    target.press("Enter")
    expect(status_of(target)).to_contain_text("aliases.gpt-4o")
    expect(status_of(target)).to_contain_text("not a model id")
    expect(target).to_have_attribute("aria-invalid", "true")
    assert dict(table(gw))["gpt-4o"] == "shared-m"
    screenshot(page, "aliases-refused-target")

    # Rename: the entry keeps its place in the file.
    name = page.get_by_label("Name of alias o1")
    name.fill("o3-mini")
    name.press("Enter")
    expect(page.get_by_label("Name of alias o3-mini")).to_be_visible()
    assert [n for n, _ in table(gw)] == ["gpt-4o", "claude-3-*", "ghost", "claude-*", "o3-mini"]

    # Reorder the patterns: by the buttons, then by the keyboard; exact names stay put.
    announced = page.locator('.ordered-list [aria-live="assertive"]')
    saved = page.locator(".order-status")
    page.get_by_role("button", name="Move claude-* up").click()
    expect(announced).to_have_text("claude-* moved, position 1 of 2")  # saving from now
    expect(saved).to_have_text("Order saved")
    expect(first).to_have_attribute("aria-label", "Reorder claude-*")
    assert [n for n, _ in table(gw)] == ["gpt-4o", "claude-*", "ghost", "claude-3-*", "o3-mini"]
    handle = page.get_by_role("button", name="Reorder claude-3-*")
    handle.focus()
    page.keyboard.press("Space")
    expect(announced).to_have_text("claude-3-* lifted, position 2 of 2")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("Space")
    expect(announced).to_have_text("claude-3-* dropped, position 1 of 2")
    expect(saved).to_have_text("Order saved")
    expect(first).to_have_attribute("aria-label", "Reorder claude-3-*")
    expect(handle).to_be_focused()
    assert [n for n, _ in table(gw)] == ["gpt-4o", "claude-3-*", "ghost", "claude-*", "o3-mini"]

    # Remove one.
    page.get_by_role("button", name="Remove ghost").click()
    expect(page.get_by_label("Name of alias ghost")).to_have_count(0)
    # Its save has ended (the next change is expected to be its own, not in a race with it).
    expect(page.get_by_role("status").filter(has_text="Alias ghost removed.")).to_be_attached()
    assert "ghost" not in dict(table(gw))

    # A change made elsewhere shows up live.
    status, _ = gw.api("PUT", ALIASES, {"aliases": {**dict(table(gw)), "o1": "local-m"}})
    assert status == 200
    expect(page.get_by_label("Name of alias o1")).to_have_value("o1")
    # (by model: the screen's own GET /v1/models after each change are logged too)
    entries = gw.get("/api/v1/requests?model=claude-3-opus")["requests"]
    served = [(e["model"], e["servedModel"]) for e in entries if e["path"].startswith("/v1/chat")]
    assert ("claude-3-opus", "studio-m") in served


def test_axe_and_narrow(gateway: ConsoleGateway, console_page: OpenPage, axe: Any,
                        screenshot: Any) -> None:
    page = console_page(gateway, "/aliases", width=1280, color_scheme="dark")
    for width, scheme in [(1280, "dark"), (360, "light")]:
        restyle(page, width=width, color_scheme=scheme)
        expect(page.get_by_label("Name of alias gpt-4o")).to_have_value("gpt-4o")
        expect(page.get_by_role("button", name="Reorder claude-*")).to_be_visible()
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth > window.innerWidth")
        assert not overflow, f"the screen scrolls sideways at {width} px"
        axe(page, f"aliases at {width} px, {scheme}")
        screenshot(page, f"aliases-{width}-{scheme}")


def test_read_only_without_the_token(gateway: ConsoleGateway, console_page: OpenPage) -> None:
    page = console_page(gateway, "/aliases", token=False)
    expect(page.get_by_label("Name of alias gpt-4o")).to_be_disabled()
    expect(page.get_by_label("Target of gpt-4o")).to_be_disabled()
    expect(page.get_by_role("button", name="Add alias")).to_be_disabled()
    expect(page.get_by_role("button", name="Remove gpt-4o")).to_be_disabled()
    expect(page.get_by_role("note")).to_contain_text("changing aliases")


def test_an_answer_older_than_the_feed_is_not_drawn(gateway: ConsoleGateway,
                                                    console_page: OpenPage) -> None:
    """The feed is authoritative: our PUT is applied, then a change made elsewhere lands and
    its event reaches the page before our PUT's answer; the screen keeps the newer table."""
    gw = gateway
    page = console_page(gw, "/aliases")
    expect(page.get_by_label("Name of alias gpt-4o")).to_have_value("gpt-4o")
    held = holding_puts(page, ALIASES)  # applied by the server, answers held
    page.get_by_label("Name or pattern").fill("o1")
    page.get_by_label("Target model").fill("local-m")
    page.get_by_role("button", name="Add alias").click()
    # The answer is held: the new row comes from our write's own feed event.
    expect(page.get_by_label("Name of alias o1")).to_have_value("o1")
    assert len(held) == 1
    assert table(gw) == [*START.items(), ("o1", "local-m")]

    outside = {**START, "o1": "local-m", "o2": "shared-m"}
    status, body = gw.api("PUT", ALIASES, {"aliases": outside})
    assert status == 200, body
    expect(page.get_by_label("Name of alias o2")).to_have_value("o2")  # its event came

    route, response = held.pop()
    route.fulfill(response=response)
    # The save has ended (add() clears the form and says so after drawing, or not, the answer).
    expect(page.get_by_role("status").filter(has_text="Alias o1 added.")).to_be_attached()
    expect(page.get_by_label("Name or pattern")).to_have_value("")
    assert page.get_by_label("Name of alias o2").count() == 1, "the older answer drew over"
    expect(page.get_by_label("Target of o2")).to_have_value("shared-m")

    # A rename whose own event comes before its answer keeps its row (the same element).
    name = page.get_by_label("Name of alias o1")
    name.evaluate("input => { input.dataset.mark = 'o1'; }")
    name.fill("o3")
    name.press("Enter")
    renamed = page.get_by_label("Name of alias o3")
    expect(renamed).to_have_count(1)  # drawn from the feed (the answer is held)
    route, response = held.pop()
    route.fulfill(response=response)
    expect(status_of(renamed)).to_have_text("Saved")
    expect(renamed).to_have_attribute("data-mark", "o1")
    page.unroute(f"**{ALIASES}")
    assert table(gw) == [*START.items(), ("o3", "local-m"), ("o2", "shared-m")]
