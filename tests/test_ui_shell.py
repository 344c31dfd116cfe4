"""The console's shell in Chromium (SPEC §10): the token moves from the address bar's
fragment into sessionStorage and never reaches the gateway; read-only mode without it; the
navigation reaches every screen; axe finds nothing serious on the shell or any screen, at
desktop width and at 360 px."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import ConsoleGateway, OpenPage

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import expect

NAV = ["Nodes", "Distributed pool", "Requests", "Playground", "Local models", "General",
       "Health", "Access keys"]


def test_smoke_the_console_opens(console_gateway: ConsoleGateway, console_page: OpenPage,
                                 screenshot: Any) -> None:
    page = console_page(console_gateway)
    expect(page.get_by_role("heading", name="Nodes", level=1)).to_be_visible()
    expect(page.get_by_role("navigation", name="Screens")).to_be_visible()
    screenshot(page, "shell-nodes")
