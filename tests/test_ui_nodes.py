"""The Nodes and Distributed pool screens in Chromium (SPEC §10) against a real gateway with
three fake nodes: the node order changed by dragging, by the keyboard (with its aria-live
announcements) and by the Move buttons, each time saved as the server's priorities; load
balancing switched on from the pool's banner and off from its section; the strategy, the
health-check interval and the loaded-first switch saved as they change; a node's circuit
opening and the node going offline shown without a reload; a save's answer (the order, load
balancing, a computer's routing, the banner) that comes after a newer change's event not
drawn over it; axe at desktop width and at 360 px; the dark scheme."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import ConsoleGateway, OpenPage, holding_puts, restyle, wait_held

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Page, expect

ORDER = ["studio", "laptop", "den"]


def set_order(gateway: ConsoleGateway, names: list[str]) -> None:
    status, _ = gateway.api("PUT", "/api/v1/nodes/order",
                            {"order": [gateway.fingerprint(n) for n in names]})
    assert status == 200


@pytest.fixture
def gateway(console_gateway: ConsoleGateway) -> Iterator[ConsoleGateway]:
    """The module's gateway, put back as the tests found it (order, load balancing)."""
    set_order(console_gateway, ORDER)
    yield console_gateway
    set_order(console_gateway, ORDER)
    for name in ORDER:
        console_gateway.api("PATCH", f"/api/v1/nodes/{console_gateway.fingerprint(name)}",
                            {"enabled": True})
    console_gateway.api("PUT", "/api/v1/settings/load-balancing",
                        {"enabled": True, "strategy": "priority", "healthCheckInterval": "1s",
                         "failoverEnabled": True, "preferLoaded": True})


def shown_order(page: Page) -> list[str]:
    return page.locator("ol.order > li .node-name").all_text_contents()


def announcement(page: Page) -> Any:
    return page.locator('.ordered-list [aria-live="assertive"]')


def expect_order(page: Page, gateway: ConsoleGateway, names: list[str]) -> None:
    """The order was saved: the status says so, the server has it (priorities N..1) and the
    list shows it."""
    expect(page.locator(".order-status")).to_have_text("Order saved")
    nodes = gateway.get("/api/v1/nodes")
    assert [n["name"] for n in nodes] == names
    assert [n["priority"] for n in nodes] == [3, 2, 1]
    expect(page.locator("ol.order > li .node-name")).to_have_text(names)
    places = page.locator("ol.order > li .place")
    expect(places).to_have_text([f"{i} of 3" for i in (1, 2, 3)])


def test_reorder_by_keyboard(gateway: ConsoleGateway, console_page: OpenPage,
                             screenshot: Callable[[Page, str], Any]) -> None:
    page = console_page(gateway)
    expect(page.locator("ol.order > li .node-name")).to_have_text(ORDER)
    handle = page.get_by_role("button", name="Reorder studio")
    handle.focus()
    page.keyboard.press("Space")
    expect(announcement(page)).to_have_text("studio lifted, position 1 of 3")
    expect(handle).to_have_attribute("aria-pressed", "true")
    page.keyboard.press("ArrowDown")
    expect(announcement(page)).to_have_text("studio moved, position 2 of 3")
    screenshot(page, "node-order-lifted")
    page.keyboard.press("Space")
    expect(announcement(page)).to_have_text("studio dropped, position 2 of 3")
    expect_order(page, gateway, ["laptop", "studio", "den"])
    expect(handle).to_be_focused()
    # Escape puts it back where it was, and nothing is saved.
    page.keyboard.press("Space")
    page.keyboard.press("ArrowDown")
    expect(announcement(page)).to_have_text("studio moved, position 3 of 3")
    page.keyboard.press("Escape")
    expect(announcement(page)).to_have_text("studio reorder cancelled, back at position 2 of 3")
    expect(page.locator("ol.order > li .node-name")).to_have_text(["laptop", "studio", "den"])
    assert gateway.order() == ["laptop", "studio", "den"]


def test_reorder_by_dragging(gateway: ConsoleGateway, console_page: OpenPage,
                             screenshot: Callable[[Page, str], Any]) -> None:
    page = console_page(gateway)
    expect(page.locator("ol.order > li .node-name")).to_have_text(ORDER)
    page.get_by_role("button", name="Reorder den").drag_to(page.locator("ol.order > li").first)
    expect(announcement(page)).to_have_text("den dropped, position 1 of 3")
    expect_order(page, gateway, ["den", "studio", "laptop"])
    page.get_by_role("button", name="Reorder den").drag_to(page.locator("ol.order > li").nth(1))
    expect(announcement(page)).to_have_text("den dropped, position 2 of 3")
    expect_order(page, gateway, ["studio", "den", "laptop"])
    page.get_by_role("heading", name="Computers in priority order").scroll_into_view_if_needed()
    screenshot(page, "node-order")


def test_reorder_by_buttons(gateway: ConsoleGateway, console_page: OpenPage) -> None:
    page = console_page(gateway)
    expect(page.locator("ol.order > li .node-name")).to_have_text(ORDER)
    page.get_by_role("button", name="Move laptop up").click()
    expect(announcement(page)).to_have_text("laptop moved, position 1 of 3")
    expect_order(page, gateway, ["laptop", "studio", "den"])
    up = page.get_by_role("button", name="Move laptop up")
    expect(up).to_have_attribute("aria-disabled", "true")  # at the top; still focusable
    up.focus()
    page.keyboard.press("Enter")  # nothing happens
    expect(announcement(page)).to_have_text("laptop moved, position 1 of 3")
    assert gateway.order() == ["laptop", "studio", "den"]
    page.get_by_role("button", name="Move studio down").click()
    expect_order(page, gateway, ["laptop", "den", "studio"])


def test_an_order_changed_elsewhere_shows_up_live(gateway: ConsoleGateway,
                                                  console_page: OpenPage) -> None:
    page = console_page(gateway)
    expect(page.locator("ol.order > li .node-name")).to_have_text(ORDER)
    set_order(gateway, ["den", "laptop", "studio"])
    expect(page.locator("ol.order > li .node-name")).to_have_text(["den", "laptop", "studio"])


def test_an_order_answer_older_than_the_feed_is_not_drawn(gateway: ConsoleGateway,
                                                          console_page: OpenPage) -> None:
    """Our order PUT is applied, then an order set elsewhere lands and its `nodes` event
    reaches the page before our PUT's answer: the screen keeps the newer order."""
    page = console_page(gateway)
    expect(page.locator("ol.order > li .node-name")).to_have_text(ORDER)
    connected = page.locator('ul[aria-label="Connected computers"] li.connected strong')
    expect(connected).to_have_text(ORDER)
    held = holding_puts(page, "/api/v1/nodes/order")
    page.get_by_role("button", name="Move laptop up").click()
    expect(connected).to_have_text(["laptop", "studio", "den"])  # our write's own event
    wait_held(page, held)
    newer = ["den", "laptop", "studio"]
    set_order(gateway, newer)
    expect(connected).to_have_text(newer)  # its event came (the order list keeps ours)

    route, response = held.pop()
    route.fulfill(response=response)
    expect(page.locator(".order-status")).to_have_text("Order saved")  # the answer was handled
    assert shown_order(page) == newer, "the older answer drew over"
    assert connected.all_text_contents() == newer
    assert gateway.order() == newer
    page.unroute("**/api/v1/nodes/order")


def test_a_load_balancing_answer_older_than_the_feed_is_not_drawn(
        gateway: ConsoleGateway, console_page: OpenPage) -> None:
    """Our load-balancing PUT is applied, then a change made elsewhere lands and its
    `loadBalancing` event reaches the page before our PUT's answer: the screen keeps it."""
    lb = "/api/v1/settings/load-balancing"
    before = gateway.get(lb)
    page = console_page(gateway)
    strategy = page.get_by_label("Strategy")
    expect(strategy).to_have_value(before["strategy"])
    switch = page.get_by_role("switch", name="Prefer computers that have the model loaded")
    expect(switch).to_have_attribute("aria-checked", "true" if before["preferLoaded"] else "false")
    held = holding_puts(page, lb)
    switch.click()
    expect(switch).to_have_attribute("aria-busy", "true")  # its answer is held
    wait_held(page, held)
    other = "fastest" if before["strategy"] != "fastest" else "round-robin"
    status, body = gateway.api("PUT", lb, {"strategy": other})
    assert status == 200, body
    expect(strategy).to_have_value(other)  # its event came

    route, response = held.pop()
    route.fulfill(response=response)
    expect(switch).not_to_have_attribute("aria-busy", "true")  # the answer was handled
    assert strategy.input_value() == other, "the older answer drew over"
    mine = "false" if before["preferLoaded"] else "true"
    expect(switch).to_have_attribute("aria-checked", mine)
    assert gateway.get(lb)["strategy"] == other
    assert gateway.get(lb)["preferLoaded"] is (mine == "true")
    page.unroute(f"**{lb}")


def test_a_routing_answer_older_than_the_feed_is_not_drawn(gateway: ConsoleGateway,
                                                            console_page: OpenPage) -> None:
    """Our PATCH turns a computer's routing off; it is turned back on elsewhere and that
    `nodes` event reaches the page before our PATCH's answer: the switch shows it on."""
    page = console_page(gateway)
    routing = page.get_by_role("switch", name="Route requests to laptop")
    expect(routing).to_have_attribute("aria-checked", "true")
    url = f"/api/v1/nodes/{gateway.fingerprint('laptop')}"
    held = holding_puts(page, url, "PATCH")
    routing.click()
    wait_held(page, held)
    assert {n["name"]: n["enabled"] for n in gateway.get("/api/v1/nodes")}["laptop"] is False
    row = page.locator("ol.order > li").filter(has_text="laptop")
    expect(row.locator(".node-status")).to_contain_text("not routed")  # its own event
    status, body = gateway.api("PATCH", url, {"enabled": True})
    assert status == 200, body
    expect(row.locator(".node-status")).not_to_contain_text("not routed")  # this event came

    route, response = held.pop()
    route.fulfill(response=response)
    expect(routing).not_to_have_attribute("aria-busy", "true")  # the answer was handled
    expect(row.locator(".node-status")).not_to_contain_text("not routed")
    assert routing.get_attribute("aria-checked") == "true", "the older answer drew over"
    page.unroute(f"**{url}")


def test_the_banners_answer_older_than_the_feed_is_not_drawn(gateway: ConsoleGateway,
                                                              console_page: OpenPage) -> None:
    """The pool's banner turns load balancing on; it is turned off elsewhere and that event
    reaches the page before the PUT's answer: the screen still says off."""
    lb = "/api/v1/settings/load-balancing"
    gateway.api("PUT", lb, {"enabled": False})
    page = console_page(gateway, "/pool")
    switch = page.get_by_role("switch", name="Load balancing")
    banner = page.get_by_role("region", name="Load balancing is off")
    expect(banner).to_be_visible()
    held = holding_puts(page, lb)
    saving = page.locator(".banner .form-status")  # found hidden too (not by its role)
    banner.get_by_role("button", name="Turn load balancing on").click()
    expect(saving).to_have_text("Saving…")
    expect(switch).to_have_attribute("aria-checked", "true")  # our write's own event
    wait_held(page, held)
    status, body = gateway.api("PUT", lb, {"enabled": False})
    assert status == 200, body
    expect(switch).to_have_attribute("aria-checked", "false")  # its event came

    route, response = held.pop()
    route.fulfill(response=response)
    expect(saving).to_have_text("")  # the answer was handled
    assert switch.get_attribute("aria-checked") == "false", "the older answer drew over"
    expect(banner).to_be_visible()
    page.unroute(f"**{lb}")


def test_load_balancing_on_from_the_pool_banner_and_off_from_the_section(
        gateway: ConsoleGateway, console_page: OpenPage,
        screenshot: Callable[[Page, str], Any]) -> None:
    gateway.api("PUT", "/api/v1/settings/load-balancing", {"enabled": False})
    page = console_page(gateway, "/pool")
    switch = page.get_by_role("switch", name="Load balancing")
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(page.get_by_label("Strategy")).to_be_hidden()  # the rest shows only while on
    banner = page.get_by_role("region", name="Load balancing is off")
    expect(banner).to_be_visible()
    screenshot(page, "pool-off")
    banner.get_by_role("button", name="Turn load balancing on").click()
    expect(switch).to_have_attribute("aria-checked", "true")
    expect(banner).to_be_hidden()
    expect(page.get_by_label("Strategy")).to_be_visible()
    assert gateway.get("/api/v1/settings/load-balancing")["enabled"] is True
    # The endpoints come back from "paused" to online, live.
    expect(page.locator("table").filter(has_text="Loaded models").get_by_text("online")
           ).to_have_count(3)
    switch.click()
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(switch).not_to_have_attribute("aria-busy", "true")
    assert gateway.get("/api/v1/settings/load-balancing")["enabled"] is False
    expect(banner).to_be_visible()
    expect(page.get_by_label("Strategy")).to_be_hidden()


def test_strategy_and_interval_are_saved_as_changed(gateway: ConsoleGateway,
                                                    console_page: OpenPage) -> None:
    page = console_page(gateway)
    strategy = page.get_by_label("Strategy")
    strategy.select_option("round-robin")
    field = page.locator(".field").filter(has=strategy)
    expect(field.get_by_role("status")).to_have_text("Saved")
    assert gateway.get("/api/v1/settings/load-balancing")["strategy"] == "round-robin"
    interval = page.get_by_label("Health-check interval")
    interval.fill("2s")
    interval.press("Enter")
    status = page.locator(".field").filter(has=interval).get_by_role("status")
    expect(status).to_have_text("Saved")
    assert gateway.get("/api/v1/settings/load-balancing")["healthCheckInterval"] == "2s"
    interval.fill("soon")
    page.get_by_label("Strategy").focus()  # leaving the field saves it
    expect(status).not_to_have_text("Saved")
    expect(status).not_to_have_text("Saving…")
    expect(interval).to_have_attribute("aria-invalid", "true")
    assert gateway.get("/api/v1/settings/load-balancing")["healthCheckInterval"] == "2s"
    # A change made elsewhere shows up live.
    gateway.api("PUT", "/api/v1/settings/load-balancing", {"strategy": "fastest"})
    expect(strategy).to_have_value("fastest")


def test_prefer_loaded_is_saved_as_flipped(gateway: ConsoleGateway,
                                           console_page: OpenPage) -> None:
    page = console_page(gateway)
    switch = page.get_by_role("switch", name="Prefer computers that have the model loaded")
    expect(switch).to_have_attribute("aria-checked", "true")  # the default
    expect(switch).to_contain_text("Prefer computers that have the model loaded")
    switch.click()
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(switch).not_to_have_attribute("aria-busy", "true")
    assert gateway.get("/api/v1/settings/load-balancing")["preferLoaded"] is False
    # A change made elsewhere shows up live.
    gateway.api("PUT", "/api/v1/settings/load-balancing", {"preferLoaded": True})
    expect(switch).to_have_attribute("aria-checked", "true")
    switch.click()
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(switch).not_to_have_attribute("aria-busy", "true")
    page.reload()  # read back from the server
    expect(page.get_by_role("switch", name="Prefer computers that have the model loaded")
           ).to_have_attribute("aria-checked", "false")


def test_a_circuit_opening_and_a_node_going_offline_show_live(
        make_console_gateway: Callable[..., ConsoleGateway], console_page: OpenPage,
        screenshot: Callable[[Page, str], Any]) -> None:
    from tests.fakenode import reset_now

    gateway = make_console_gateway(failure_threshold=2, reset_timeout=60.0)
    page = console_page(gateway, "/pool")
    stats = page.locator("table").filter(has_text="Failures in a row")
    den = stats.get_by_role("row").filter(has_text="den")
    expect(den).to_contain_text("circuit closed")
    gateway.nodes["den"].answer(reset_now())
    assert [gateway.chat("den-m") for _ in range(2)] == [502, 502]
    expect(den).to_contain_text("circuit open")
    endpoints = page.locator("table").filter(has_text="Loaded models")
    den_endpoint = endpoints.get_by_role("row").filter(has_text="den")
    expect(den_endpoint).to_contain_text("online")
    gateway.stop_node("den")
    expect(den_endpoint).to_contain_text("offline")
    screenshot(page, "pool-den-offline")
    page.get_by_role("link", name="Nodes").click()
    row = page.locator("ol.order > li").filter(has_text="den")
    expect(row).to_contain_text("offline")
    expect(row).to_contain_text("circuit open")


def test_axe_on_nodes_and_pool_wide_narrow_and_dark(
        gateway: ConsoleGateway, console_page: OpenPage, axe: Callable[[Page, str], None],
        screenshot: Callable[[Page, str], Any]) -> None:
    """Both screens at 1280 px and 360 px (light) and in the dark scheme, on one page."""
    variants = [(1280, 800, "light"), (360, 800, "light"), (1280, 900, "dark")]

    def check(screen: str) -> None:
        for width, height, scheme in variants:
            restyle(page, width=width, height=height, color_scheme=scheme)
            background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
            assert background == ("rgb(17, 20, 24)" if scheme == "dark" else
                                  "rgb(246, 247, 249)"), (scheme, background)
            name = f"{screen}, dark" if scheme == "dark" else f"{screen} at {width}px"
            axe(page, name)
            screenshot(page, f"{screen}-dark" if scheme == "dark" else f"{screen}-{width}")
            assert page.evaluate("() => document.documentElement.scrollWidth") <= width

    page = console_page(gateway, width=1280, height=800)
    expect(page.locator("ol.order > li")).to_have_count(3)
    check("nodes")
    page.get_by_role("link", name="Distributed pool").click()
    expect(page.get_by_role("heading", name="Distributed pool", level=1)).to_be_visible()
    expect(page.locator("table").first).to_be_visible()
    # some traffic, for the figures (they arrive live, at most once a second)
    before = gateway.get("/api/v1/pool/routing-stats")["totalRequests"]
    assert [gateway.chat(m) for m in ("shared-m", "shared-m", "laptop-m", "local-m")
            ] == [200] * 4
    expect(page.locator("section").filter(has_text="Routing stats").locator("p.muted")
           ).to_contain_text(f"{before + 4} requests")
    check("pool")
