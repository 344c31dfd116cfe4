"""The Nodes screen's LAN parts (SPEC §14, §10) in Chromium against a real gateway: the
switch "Find computers on this network" saved as flipped (browse and announce together) and
following a change made through the API (also one whose event comes before the switch's own
PUT's answer: the answer is not drawn over it); the line beside it saying what is missing (load
balancing, external access); "Found on this network" empty with what to do; "Let another
computer connect": a 6-digit code with a countdown that decreases, Cancel (the server then
has no code), a wrong try's "4 tries left", a claim made over HTTP shown as "<name>
connected", the expiry (a fake page clock) offering a new code; axe with a code shown, light
and dark; a read-only console can do neither.

Discovery is never switched on here with load balancing on: that would browse on this
machine's real interfaces (SPEC §14: only inside namespaces a test made); and were it
switched on, the gateway would refuse to open the mDNS socket (``SLUICE_NO_MDNS``, set by
tests/conftest.py for every gateway outside a test's namespaces). The found list and
Connect are in tests/test_ui_discovery_lan.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import (
    ConsoleGateway,
    OpenPage,
    holding_puts,
    missing,
    restyle,
    running_gateway,
    wait_held,
)

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Page, expect

DISCOVERY = "/api/v1/settings/discovery"
PAIRING = "/api/v1/pairing"
LOAD_BALANCING = "/api/v1/settings/load-balancing"
SWITCH = "Find computers on this network"

Shot = Callable[[Page, str], Any]


@pytest.fixture(scope="module")
def discovery_gateway() -> Iterator[ConsoleGateway]:
    """One gateway for the module, no nodes, load balancing on (each test turns off what it
    needs off, and the ``gateway`` fixture puts back discovery, load balancing and the
    pairing code)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    with running_gateway(()) as gateway:
        yield gateway


@pytest.fixture
def gateway(discovery_gateway: ConsoleGateway) -> Iterator[ConsoleGateway]:
    """The module's gateway as each test expects it: discovery off, no pairing code."""
    gw = discovery_gateway
    yield gw
    gw.api("DELETE", PAIRING)
    for path, doc in ((DISCOVERY, {"browse": False, "announce": False}),
                      (LOAD_BALANCING, {"enabled": True})):
        status, body = gw.api("PUT", path, doc)
        assert status == 200, body
    assert gw.get(PAIRING)["active"] is False


def load_balancing_off(gateway: ConsoleGateway) -> None:
    status, body = gateway.api("PUT", LOAD_BALANCING, {"enabled": False})
    assert status == 200, body


def shown_code(page: Page) -> str:
    """The digits of the code on the screen (shown as "123 456")."""
    code = page.locator(".pairing-code [aria-hidden=true]")
    expect(code).to_have_text(re.compile(r"^\d{3} \d{3}$"))
    return code.inner_text().replace(" ", "")


def test_switch_saves_both_and_says_what_is_missing(gateway: ConsoleGateway,
                                                    console_page: OpenPage,
                                                    screenshot: Shot) -> None:
    load_balancing_off(gateway)
    page = console_page(gateway)
    switch = page.get_by_role("switch", name=SWITCH)
    effect = page.locator(".discovery-effect")
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(effect).to_contain_text("Off")
    found = page.locator(".found-empty")
    expect(found).to_contain_text('turn on "Find computers on this network"')
    switch.click()
    expect(switch).to_have_attribute("aria-checked", "true")
    expect(switch).not_to_have_attribute("aria-busy", "true")
    saved = gateway.get(DISCOVERY)
    assert (saved["browse"], saved["announce"]) == (True, True), saved
    assert (saved["browsing"], saved["announcing"]) == (False, False), saved
    # Load balancing is off and so is external access: the line names both, with links.
    expect(effect).to_contain_text("needs load balancing on")
    expect(effect).to_contain_text("needs external access on")
    expect(effect.get_by_role("link", name="API > General")).to_have_attribute(
        "href", "#/api/general")
    expect(found).to_contain_text("only while load balancing is on")
    screenshot(page, "nodes-discovery")
    # A change made elsewhere (the API, another console) shows up live.
    status, body = gateway.api("PUT", DISCOVERY, {"browse": False, "announce": False})
    assert status == 200, body
    expect(switch).to_have_attribute("aria-checked", "false")
    expect(effect).to_contain_text("Off")
    status, body = gateway.api("PUT", DISCOVERY, {"browse": False, "announce": True})
    assert status == 200, body
    expect(switch).to_have_attribute("aria-checked", "true")
    expect(effect).to_contain_text("Not looking for other computers.")
    expect(effect).to_contain_text("needs external access on")
    page.reload()  # read back from the server
    expect(page.get_by_role("switch", name=SWITCH)).to_have_attribute("aria-checked", "true")
    page.get_by_role("switch", name=SWITCH).click()  # off: both
    expect(page.get_by_role("switch", name=SWITCH)).to_have_attribute("aria-checked", "false")
    expect(page.get_by_role("switch", name=SWITCH)).not_to_have_attribute("aria-busy", "true")
    saved = gateway.get(DISCOVERY)
    assert (saved["browse"], saved["announce"]) == (False, False), saved


def test_an_answer_older_than_the_feed_is_not_drawn(gateway: ConsoleGateway,
                                                   console_page: OpenPage) -> None:
    """Our PUT turns discovery on; it is turned off elsewhere and that `discovery` event
    reaches the page before our PUT's answer: the switch and its line say off."""
    load_balancing_off(gateway)
    page = console_page(gateway)
    switch = page.get_by_role("switch", name=SWITCH)
    effect = page.locator(".discovery-effect")
    expect(switch).to_have_attribute("aria-checked", "false")
    held = holding_puts(page, DISCOVERY)  # applied by the server, answers held
    switch.click()
    expect(effect).to_contain_text("needs load balancing on")  # our write's own event
    wait_held(page, held)
    status, body = gateway.api("PUT", DISCOVERY, {"browse": False, "announce": False})
    assert status == 200, body
    expect(effect).to_contain_text("Off")  # its event came

    route, response = held.pop()
    route.fulfill(response=response)
    expect(switch).not_to_have_attribute("aria-busy", "true")  # the answer was handled
    expect(effect).to_contain_text("Off")
    assert switch.get_attribute("aria-checked") == "false", "the older answer drew over"
    page.unroute(f"**{DISCOVERY}")


def test_pairing_code_counts_down_and_cancel_clears_it(gateway: ConsoleGateway,
                                                       console_page: OpenPage) -> None:
    page = console_page(gateway)
    section = page.get_by_role("region", name="Let another computer connect")
    section.get_by_role("button", name="Show a pairing code").click()
    shown_code(page)
    # Focus stays on the button, which now offers another code.
    expect(section.get_by_role("button", name="Show a new code")).to_be_focused()
    timer = section.get_by_role("timer")
    expect(timer).to_have_text(re.compile(r"^[45]:\d\d$"))
    first = timer.inner_text()
    expect(timer).not_to_have_text(first, timeout=3000)  # it counts down, every second
    assert timer.inner_text() < first
    expect(section.locator(".pairing-state")).to_have_text(
        "Pairing code shown. It expires in 5 minutes.")
    assert gateway.get(PAIRING)["active"] is True
    section.get_by_role("button", name="Cancel pairing code").click()
    expect(section.locator(".pairing-state")).to_have_text("Pairing code cancelled.")
    expect(page.locator(".pairing-code")).to_be_hidden()
    expect(timer).to_be_hidden()
    assert gateway.get(PAIRING)["active"] is False
    expect(section.get_by_role("button", name="Show a pairing code")).to_be_focused()


def test_a_claimed_code_says_who_connected(gateway: ConsoleGateway,
                                           console_page: OpenPage,
                                           axe: Callable[[Page, str], None],
                                           screenshot: Shot) -> None:
    page = console_page(gateway)
    section = page.get_by_role("region", name="Let another computer connect")
    section.get_by_role("button", name="Show a pairing code").click()
    code = shown_code(page)
    expect(section.get_by_role("timer")).to_be_visible()
    for scheme in ("light", "dark"):  # the same code on the same page, in both schemes
        restyle(page, color_scheme=scheme)
        axe(page, f"nodes with a pairing code ({scheme})")
        section.scroll_into_view_if_needed()
        screenshot(page, "pairing-code" if scheme == "light" else "pairing-code-dark")
    # A wrong try shows how many are left; then another computer claims it (no admin
    # token: the claim is the other gateway's call).
    wrong = "000000" if code != "000000" else "111111"
    status, body = gateway.gw.call_sync("POST", f"{PAIRING}/claim",
                                        {"code": wrong, "fingerprint": "node-guess-0001"})
    assert status == 401, body
    expect(section.get_by_text("4 tries left")).to_be_visible()
    status, body = gateway.gw.call_sync("POST", f"{PAIRING}/claim",
                                        {"code": code, "fingerprint": "node-workshop-0001",
                                         "name": "workshop"})
    assert status == 200, body
    expect(section.locator(".pairing-state")).to_have_text("workshop connected")
    expect(page.locator(".pairing-code")).to_be_hidden()
    assert gateway.get(PAIRING)["active"] is False


def test_an_expired_code_offers_a_new_one(gateway: ConsoleGateway,
                                          console_page: OpenPage) -> None:
    page = console_page(gateway, own_context=True)  # a fake clock stays with its context
    page.clock.install()  # the page's clock from here: the countdown's timers are made after
    section = page.get_by_role("region", name="Let another computer connect")
    section.get_by_role("button", name="Show a pairing code").click()
    shown_code(page)
    page.clock.fast_forward("04:00")
    expect(section.get_by_role("timer")).to_have_text(re.compile(r"^[01]:\d\d$"))
    expect(section.locator(".pairing-state")).to_have_text("1 minute left on the pairing code.")
    page.clock.fast_forward("01:05")
    expect(section.locator(".pairing-state")).to_contain_text("The code expired")
    expect(page.locator(".pairing-code")).to_be_hidden()
    again = section.get_by_role("button", name="Show a new code")
    again.click()
    expect(section.locator(".pairing-state")).to_contain_text("Pairing code shown")
    shown_code(page)
    assert gateway.get(PAIRING)["active"] is True
    expect(section.get_by_role("timer")).to_have_text(re.compile(r"^[45]:\d\d$"))


def test_read_only_console_cannot_switch_or_make_codes(gateway: ConsoleGateway,
                                                       console_page: OpenPage) -> None:
    load_balancing_off(gateway)
    page = console_page(gateway, token=False)
    expect(page.get_by_role("switch", name=SWITCH)).to_be_disabled()
    expect(page.get_by_role("button", name="Show a pairing code")).to_be_disabled()
