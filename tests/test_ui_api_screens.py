"""The console's API screens (SPEC §10) in real Chromium against a real gateway: General
(switches and fields saved when changed; restart-only fields say so), Health (a refused
timeout shows the server's message beside the field it names and changes nothing; the idle
first_byte values are marked) and Access keys (created and shown once, used from another
HTTP client, revoked after an in-page confirmation); axe on light, dark and 360 px.

Each test puts back what it changed on the module's shared gateway."""

from __future__ import annotations

from http.client import HTTPConnection
from typing import Any

from tests.browser import ConsoleGateway, holding_puts, restyle

TIMEOUTS = "/api/v1/settings/timeouts"
API = "/api/v1/settings/api"


def status_of(field: Any) -> Any:
    """The saved/error line of a field (made by the field component)."""
    return field.locator("xpath=ancestor::div[contains(@class, 'field')][1]").locator(
        ".save-status")


def switch_status(switch: Any) -> Any:
    """The saved/error line right after a switch."""
    return switch.locator("xpath=following-sibling::*[contains(@class, 'save-status')][1]")


def models_with_key(gw: ConsoleGateway, key: str | None) -> int:
    """GET /v1/models from another HTTP client (not the browser), with this access key."""
    conn = HTTPConnection("127.0.0.1", gw.gw.port, timeout=10)
    try:
        headers = {"Host": "localhost"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("GET", "/v1/models", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# -- General ---------------------------------------------------------------------------------


def test_general_saves_each_change(console_gateway: ConsoleGateway, console_page: Any,
                                   axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    before = gw.get(API)
    page = console_page(gw, "/api/general")
    expect(page.get_by_role("heading", name="General", level=1)).to_be_visible()
    status = gw.get("/api/v1/inference/status")
    expect(page.get_by_text(status["socketPath"])).to_be_visible()
    require = page.get_by_role("switch", name="Require auth")
    expect(require).to_have_attribute("aria-checked", "false")
    require.click()
    expect(require).to_have_attribute("aria-checked", "true")
    expect(switch_status(require)).to_have_text("Saved")
    assert gw.get(API)["requireAuth"] is True
    require.press("Space")  # keyboard: back off
    expect(require).to_have_attribute("aria-checked", "false")
    expect(switch_status(require)).to_have_text("Saved")
    assert gw.get(API)["requireAuth"] is False

    port = page.get_by_label("API port")
    expect(port).to_have_value(str(before["port"]))
    field = port.locator("xpath=..")
    expect(field).to_contain_text("needs a restart")
    port.fill("not-a-port")
    port.press("Enter")
    expect(status_of(port)).to_contain_text("api.port")
    expect(port).to_have_attribute("aria-invalid", "true")
    assert gw.get(API) == before  # refused: nothing changed
    for switch in ("API server", "External access"):
        expect(page.get_by_role("switch", name=switch).locator("xpath=../..")).to_contain_text(
            "needs a restart")
    axe(page, "general")
    screenshot(page, "general")


def test_general_says_a_restart_is_needed(make_console_gateway: Any, console_page: Any,
                                          screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = make_console_gateway(nodes=())
    page = console_page(gw, "/api/general")
    port = page.get_by_label("API port")
    port.fill("39999")
    port.press("Tab")
    expect(status_of(port)).to_have_text("Saved")
    saved = gw.get(API)
    assert saved["port"] == 39999
    assert saved["restartRequired"] is True
    # The gateway's notification says so, in the notifications area of every screen.
    expect(page.locator("#notification-list")).to_contain_text("restart sluice")
    screenshot(page, "general-restart")


# -- Health ----------------------------------------------------------------------------------


def test_a_refused_timeout_names_the_field_and_the_limit_and_changes_nothing(
        console_gateway: ConsoleGateway, console_page: Any, axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    before = gw.get(TIMEOUTS)
    page = console_page(gw, "/api/health")
    expect(page.get_by_role("heading", name="Health", level=1)).to_be_visible()
    total = page.get_by_label("Streaming total")
    expect(total).to_have_value(before["request"]["streaming"]["total"])
    total.fill("30m")
    total.press("Enter")
    message = status_of(total)
    expect(message).to_contain_text("timeouts.request.streaming.total")
    expect(message).to_contain_text("20m")
    expect(total).to_have_attribute("aria-invalid", "true")
    assert gw.get(TIMEOUTS) == before
    screenshot(page, "health-refused")

    chunk = page.get_by_label("Chunk interval")
    chunk.fill("45")  # a bare number is seconds; the server answers its own form
    chunk.press("Enter")
    expect(status_of(chunk)).to_have_text("Saved")
    expect(chunk).to_have_value("45s")
    assert gw.get(TIMEOUTS)["request"]["streaming"]["chunk_interval"] == "45s"
    gw.api("PUT", TIMEOUTS, {"request": {"streaming": {
        "chunk_interval": before["request"]["streaming"]["chunk_interval"]}}})
    expect(chunk).to_have_value(before["request"]["streaming"]["chunk_interval"])  # live

    for idle in ("Standard first byte", "Image generation first byte"):
        expect(page.get_by_label(idle).locator("xpath=..")).to_contain_text("does nothing")
    expect(page.get_by_label("Streaming first byte").locator("xpath=..")).not_to_contain_text(
        "does nothing")
    axe(page, "health")
    screenshot(page, "health")


def test_health_check_interval_and_timeout(console_gateway: ConsoleGateway,
                                           console_page: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    before = gw.get(TIMEOUTS)["health_check"]
    page = console_page(gw, "/api/health")
    interval = page.get_by_label("Health-check interval")
    timeout = page.get_by_label("Health-check timeout")
    expect(interval).to_have_value(before["interval"])
    timeout.fill(before["interval"])  # not below the interval: the server makes it interval - 1s
    timeout.press("Enter")
    expect(status_of(timeout)).to_have_text("Saved")
    kept = gw.get(TIMEOUTS)["health_check"]
    assert kept["interval"] == before["interval"]
    assert kept["timeout"] != before["interval"]
    expect(timeout).to_have_value(kept["timeout"])
    gw.api("PUT", TIMEOUTS, {"health_check": before})
    expect(timeout).to_have_value(before["timeout"])


def test_a_timeouts_answer_older_than_the_feed_is_not_drawn(console_gateway: ConsoleGateway,
                                                            console_page: Any) -> None:
    """Our PUT is applied, then a change made elsewhere lands and its event reaches the page
    before our PUT's answer: the screen keeps the newer value (the feed is authoritative)."""
    from playwright.sync_api import expect

    gw = console_gateway
    before = gw.get(TIMEOUTS)
    page = console_page(gw, "/api/health")
    chunk = page.get_by_label("Chunk interval")
    standard = page.get_by_label("Standard total")
    expect(standard).to_have_value(before["request"]["standard"]["total"])
    held = holding_puts(page, TIMEOUTS)  # applied by the server, answers held
    ours = "44s" if before["request"]["streaming"]["chunk_interval"] != "44s" else "43s"
    chunk.fill(ours.removesuffix("s"))
    chunk.press("Tab")  # saved on blur; the field is not focused, so the feed's value shows
    expect(chunk).to_have_value(ours)  # our write's own event (its answer is held)
    assert len(held) == 1
    other = "7m" if before["request"]["standard"]["total"] != "7m" else "6m"
    status, body = gw.api("PUT", TIMEOUTS, {"request": {"standard": {"total": other}}})
    assert status == 200, body
    expect(standard).to_have_value(other)  # its event came

    route, response = held.pop()
    route.fulfill(response=response)
    expect(status_of(chunk)).to_have_text("Saved")  # the answer was handled
    assert standard.input_value() == other, "the older answer drew over"
    assert chunk.input_value() == ours
    page.unroute(f"**{TIMEOUTS}")
    status, body = gw.api("PUT", TIMEOUTS, before)
    assert status == 200, body
    assert gw.get(TIMEOUTS) == before


# -- Access keys -----------------------------------------------------------------------------


def test_create_use_and_revoke_an_access_key(console_gateway: ConsoleGateway,
                                             console_page: Any, axe: Any,
                                             screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    page = console_page(gw, "/api/keys")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gw.url)
    expect(page.get_by_role("heading", name="Access keys", level=1)).to_be_visible()
    page.get_by_label("Key name").fill("laptop")
    page.get_by_role("button", name="Create key").click()
    shown = page.get_by_label("New key")
    expect(shown).to_be_visible()
    key = shown.input_value()
    assert key.startswith("sk-sluice-")
    page.get_by_role("button", name="Copy key").click()
    expect(page.get_by_text("Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == key
    listed = [k for k in gw.get("/api/v1/access-keys") if k["name"] == "laptop"]
    assert len(listed) == 1
    assert "key" not in listed[0]
    row = page.get_by_role("row").filter(has_text="laptop")
    expect(row.locator("td").nth(1)).to_have_text("never")  # not used yet
    axe(page, "access keys, new key shown")
    screenshot(page, "keys-created")
    page.get_by_role("button", name="Done").click()
    expect(page.get_by_label("New key")).to_have_count(0)  # shown once: gone for good

    gw.api("PUT", API, {"requireAuth": True})  # loopback TCP clients now need a key
    try:
        assert models_with_key(gw, None) == 401
        assert models_with_key(gw, key) == 200
        last_used = row.locator("td").nth(1)  # after the name (a row header) and created
        expect(last_used).not_to_have_text("never", timeout=10_000)  # live, from the feed

        revoke = page.get_by_role("button", name="Revoke laptop")
        revoke.click()
        dialog = page.get_by_role("dialog", name="Revoke this access key?")
        expect(dialog).to_be_visible()
        expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
        page.keyboard.press("Escape")  # cancelled: nothing happens
        expect(dialog).to_be_hidden()
        expect(revoke).to_be_focused()
        assert models_with_key(gw, key) == 200
        revoke.click()
        axe(page, "access keys, confirm revoke")
        screenshot(page, "keys-confirm")
        dialog.get_by_role("button", name="Revoke").click()
        expect(page.get_by_role("row").filter(has_text="laptop")).to_have_count(0)
        assert [k for k in gw.get("/api/v1/access-keys") if k["name"] == "laptop"] == []
        assert models_with_key(gw, key) == 401
    finally:
        gw.api("PUT", API, {"requireAuth": False})
    assert key not in gw.log()


def test_read_only_disables_changes(console_gateway: ConsoleGateway,
                                    console_page: Any) -> None:
    from playwright.sync_api import expect

    page = console_page(console_gateway, "/api/keys", token=False)
    page.evaluate("() => { location.hash = '#/api/keys'; }")
    expect(page.get_by_role("heading", name="Access keys", level=1)).to_be_visible()
    expect(page.get_by_role("button", name="Create key")).to_be_disabled()
    page.evaluate("() => { location.hash = '#/api/health'; }")
    expect(page.get_by_label("Chunk interval")).to_be_disabled()
    page.evaluate("() => { location.hash = '#/api/general'; }")
    expect(page.get_by_role("switch", name="Require auth")).to_be_disabled()


def test_api_screens_narrow_and_dark(console_gateway: ConsoleGateway, console_page: Any,
                                     axe: Any, screenshot: Any) -> None:
    """Each API screen at 360 px light and 1280 px dark, on one page."""
    from playwright.sync_api import expect

    gw = console_gateway
    status, made = gw.api("POST", "/api/v1/access-keys", {"name": "studio-mac"})
    assert status == 201  # a listed key, so the keys table is drawn too
    try:
        page = console_page(gw, "/api/general", width=360, color_scheme="light")
        for route in ["/api/general", "/api/health", "/api/keys"]:
            page.evaluate("route => { location.hash = route; }", f"#{route}")
            name = route.rsplit("/", 1)[1]
            expect(page.locator(f'.screen[data-screen="{name}"] h1')).to_be_visible()
            for width, scheme in [(360, "light"), (1280, "dark")]:
                restyle(page, width=width, color_scheme=scheme)
                expect(page.locator(".screen h1")).to_be_visible()
                expect(page.locator(".screen input, .screen button").first).to_be_visible()
                if route == "/api/keys":
                    expect(page.get_by_role("button", name="Revoke studio-mac")).to_be_visible()
                axe(page, f"{name} {width}px {scheme}")
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                screenshot(page, f"{name}-{width}-{scheme}")
    finally:
        gw.api("DELETE", f"/api/v1/access-keys/{made['id']}")
