"""Node weights and the weighted strategy in the console (SPEC §10, §13), in Chromium against
a real gateway with three fake nodes: each computer's "Weight for <name>" field, reached by
keyboard, saved on Enter and on leaving it (a PATCH the server then has), the server's
refusal shown beside it, a weight changed elsewhere shown live; "weighted" picked in the
strategy select on the Nodes and Distributed pool screens, and then used for routing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import ConsoleGateway, OpenPage

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Page, expect

NAMES = ["studio", "laptop", "den"]
LB = "/api/v1/settings/load-balancing"


def weights(gateway: ConsoleGateway) -> dict[str, int]:
    return {n["name"]: n["weight"] for n in gateway.get("/api/v1/nodes")}


def set_weight(gateway: ConsoleGateway, name: str, weight: int) -> None:
    status, body = gateway.api("PATCH", f"/api/v1/nodes/{gateway.fingerprint(name)}",
                               {"weight": weight})
    assert status == 200, body


@pytest.fixture
def gateway(console_gateway: ConsoleGateway) -> Iterator[ConsoleGateway]:
    """The module's gateway, put back as the tests found it (weights 1, priority)."""
    yield console_gateway
    for name in NAMES:
        set_weight(console_gateway, name, 1)
    console_gateway.api("PUT", LB, {"strategy": "priority"})


def status_of(page: Page, control: Any) -> Any:
    return page.locator(".field").filter(has=control).get_by_role("status")


def test_weight_saved_on_enter_and_on_blur_with_errors_beside_it(
        gateway: ConsoleGateway, console_page: OpenPage,
        screenshot: Callable[[Page, str], Any]) -> None:
    page = console_page(gateway)
    studio = page.get_by_label("Weight for studio")
    expect(studio).to_have_value("1")
    expect(studio).to_have_attribute("min", "1")
    expect(studio).to_have_attribute("max", "100")
    # Reached by keyboard: Tab from the computer's routing switch.
    page.get_by_role("switch", name="Route requests to studio").focus()
    page.keyboard.press("Tab")
    expect(studio).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("3")
    page.keyboard.press("Enter")
    expect(status_of(page, studio)).to_have_text("Saved")
    assert weights(gateway) == {"studio": 3, "laptop": 1, "den": 1}
    # Leaving a field saves it too.
    laptop = page.get_by_label("Weight for laptop")
    laptop.fill("2")
    page.get_by_label("Weight for den").focus()
    expect(status_of(page, laptop)).to_have_text("Saved")
    assert weights(gateway)["laptop"] == 2
    # Out of range: the server's message beside the field, nothing saved.
    den = page.get_by_label("Weight for den")
    for bad, says in (("0", "must be between 1 and 100, got 0"),
                      ("101", "must be between 1 and 100, got 101")):
        den.fill(bad)
        den.press("Enter")
        expect(status_of(page, den)).to_contain_text(says)
        expect(den).to_have_attribute("aria-invalid", "true")
        expect(den).to_have_value(bad)  # what the user typed stays to be corrected
    assert weights(gateway)["den"] == 1
    den.scroll_into_view_if_needed()
    screenshot(page, "node-weight-refused")
    den.fill("4")
    den.press("Enter")
    expect(status_of(page, den)).to_have_text("Saved")
    expect(den).not_to_have_attribute("aria-invalid", "true")
    assert weights(gateway) == {"studio": 3, "laptop": 2, "den": 4}
    # A weight changed elsewhere (the CLI, another console) shows up live.
    set_weight(gateway, "studio", 9)
    expect(studio).to_have_value("9")
    page.reload()  # read back from the server
    expect(page.get_by_label("Weight for laptop")).to_have_value("2")


@pytest.mark.parametrize("route", ["/nodes", "/pool"])
def test_weighted_can_be_picked(gateway: ConsoleGateway, console_page: OpenPage,
                                route: str, screenshot: Callable[[Page, str], Any]) -> None:
    page = console_page(gateway, route)
    strategy = page.get_by_label("Strategy")
    expect(strategy.locator("option[value=weighted]")).to_have_text(
        "Weighted: by each computer's weight")
    strategy.select_option("weighted")
    expect(status_of(page, strategy)).to_have_text("Saved")
    assert gateway.get(LB)["strategy"] == "weighted"
    if route == "/nodes":
        # Routing follows: studio 2, laptop 1, den 1 -> 2 of every 4 to studio.
        set_weight(gateway, "studio", 2)
        expect(page.get_by_label("Weight for studio")).to_have_value("2")
        before = {n["fingerprint"]: n["successCount"]
                  for n in gateway.get("/api/v1/pool/routing-stats")["nodes"]}
        assert [gateway.chat("shared-m") for _ in range(8)] == [200] * 8
        after = {n["fingerprint"]: n["successCount"]
                 for n in gateway.get("/api/v1/pool/routing-stats")["nodes"]}
        served = {name: after[gateway.fingerprint(name)] - before[gateway.fingerprint(name)]
                  for name in NAMES}
        assert served == {"studio": 4, "laptop": 2, "den": 2}
        page.get_by_role("heading", name="Computers in priority order").scroll_into_view_if_needed()
        screenshot(page, "nodes-weighted")
    # Changed elsewhere: the select follows.
    gateway.api("PUT", LB, {"strategy": "round-robin"})
    expect(strategy).to_have_value("round-robin")
