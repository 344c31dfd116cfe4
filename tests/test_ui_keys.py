"""The Access keys screen with limits (SPEC §10, §13) in real Chromium against a real gateway:
a key created with its models, requests a minute and expiry date (the end of that day, local
time); each listed key's limits edited where they are shown, saved on Enter or blur, a
refusal shown beside the field (and beside the create form's field it names) and nothing
changed; the limits then hold for a client that sends the key; axe."""

from __future__ import annotations

import json
from http.client import HTTPConnection
from typing import Any

from tests.browser import ConsoleGateway

KEYS = "/api/v1/access-keys"


def chat_with_key(gw: ConsoleGateway, model: str, key: str) -> int:
    """One chat completion from another HTTP client (not the browser), with this key."""
    conn = HTTPConnection("127.0.0.1", gw.gw.port, timeout=30)
    try:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        conn.request("POST", "/v1/chat/completions", body,
                     {"Host": "localhost", "Content-Type": "application/json",
                      "Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def status_of(control: Any) -> Any:
    """The saved/error line of a field (made by the field component)."""
    return control.locator("xpath=ancestor::div[contains(@class, 'field')][1]").locator(
        ".save-status")


def stored(gw: ConsoleGateway, name: str) -> dict[str, Any]:
    found = [k for k in gw.get(KEYS) if k["name"] == name]
    assert len(found) == 1, found
    key: dict[str, Any] = found[0]
    return key


def test_a_key_with_limits(console_gateway: ConsoleGateway, console_page: Any, axe: Any,
                           screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    page = console_page(gw, "/api/keys")
    # The create form: a refusal is shown beside the field the server names.
    page.get_by_label("Key name").fill("tablet")
    page.get_by_label("Models", exact=True).fill("local-m, studio*")
    rpm = page.get_by_label("Requests a minute", exact=True)
    rpm.fill("lots")
    page.get_by_role("button", name="Create key").click()
    expect(rpm).to_have_attribute("aria-invalid", "true")
    refusal = page.locator("#keys-rpm + .save-status")
    expect(refusal).to_contain_text("rpm")
    expect(refusal).to_have_class("save-status bad")
    assert [k for k in gw.get(KEYS) if k["name"] == "tablet"] == []
    rpm.fill("2")
    page.get_by_label("Expires", exact=True).fill("2031-01-15")
    page.get_by_role("button", name="Create key").click()
    key = page.get_by_label("New key").input_value()
    assert key.startswith("sk-sluice-")
    expect(rpm).not_to_have_attribute("aria-invalid", "true")
    made = stored(gw, "tablet")
    end_of_day = page.evaluate(
        "new Date(2031, 0, 15, 23, 59, 59).toISOString().replace(/\\.\\d{3}Z$/, 'Z')")
    assert (made["models"], made["rpm"], made["expiresAt"]) == (
        ["local-m", "studio*"], 2, end_of_day)
    page.get_by_role("button", name="Done").click()

    # The list: each limit in a field named after the key.
    models = page.get_by_label("Models tablet may use")
    per_minute = page.get_by_label("Requests a minute for tablet")
    expiry = page.get_by_label("Expiry date of tablet")
    expect(models).to_have_value("local-m, studio*")
    expect(per_minute).to_have_value("2")
    expect(expiry).to_have_value("2031-01-15")
    assert chat_with_key(gw, "studio-m", key) == 200
    assert chat_with_key(gw, "den-m", key) == 403  # refused before the bucket
    assert chat_with_key(gw, "local-m", key) == 200
    assert chat_with_key(gw, "local-m", key) == 429  # 2 a minute
    axe(page, "access keys with limits")
    screenshot(page, "keys-limits")

    # A refused change: the server's message beside the field, nothing changed.
    per_minute.fill("-3")
    per_minute.press("Enter")
    expect(status_of(per_minute)).to_contain_text("rpm")
    expect(per_minute).to_have_attribute("aria-invalid", "true")
    assert stored(gw, "tablet")["rpm"] == 2
    screenshot(page, "keys-limit-refused")
    # Emptied: no limit, saved on Enter; the other fields saved when they lose focus.
    per_minute.fill("")
    per_minute.press("Enter")
    expect(status_of(per_minute)).to_have_text("Saved")
    models.fill("den-m")
    expiry.focus()
    expect(status_of(models)).to_have_text("Saved")
    expiry.fill("")
    models.focus()
    expect(status_of(expiry)).to_have_text("Saved")
    now = stored(gw, "tablet")
    assert (now["models"], now["rpm"], now["expiresAt"]) == (["den-m"], None, None)
    assert chat_with_key(gw, "den-m", key) == 200
    assert chat_with_key(gw, "den-m", key) == 200  # no rate limit any more
    assert chat_with_key(gw, "local-m", key) == 403

    # A key that expired says so.
    gw.api("PATCH", f"{KEYS}/{now['id']}", {"expiresAt": "2001-01-01"})
    page.reload()
    row = page.get_by_role("row").filter(has_text="tablet")
    expect(row.get_by_text("expired", exact=True)).to_be_visible()
    expect(page.get_by_label("Expiry date of tablet")).to_have_value("2001-01-01")
    assert chat_with_key(gw, "den-m", key) == 401
    status, _ = gw.api("DELETE", f"{KEYS}/{now['id']}")
    assert status == 200
    assert key not in gw.log()
