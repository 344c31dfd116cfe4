"""``sluice console`` (SPEC §10) as a subprocess against a real gateway: it prints
``http://localhost:<port>/ui/#token=<admin token>``; with a display and an opener it hands
the browser a 0600 launcher page (never the token on a command line); without either it
only prints. In Chromium, the launcher and the URL open the console, the token goes into
sessionStorage only, leaves the address bar, and never appears in the gateway's log."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.console import LAUNCHER_FILE
from tests.browser import READY_TIMEOUT, ConsoleGateway, OpenPage, missing, running_gateway

CONSOLE = [sys.executable, "-m", "proxy", "console"]


def run_console(gateway: ConsoleGateway, env: dict[str, str], *extra: str
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CONSOLE, "--data-dir", str(gateway.gw.data_dir), *extra],
                          env=env, capture_output=True, text=True, timeout=30, check=False)


def fake_opener(folder: Path) -> tuple[dict[str, str], Path]:
    """An environment with a display and an ``xdg-open`` that records its arguments."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    record = folder / "opened"
    script = bin_dir / "xdg-open"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DISPLAY": ":99"}
    env.pop("WAYLAND_DISPLAY", None)
    return env, record


@pytest.fixture(scope="module")
def bare_module_gateway() -> Iterator[ConsoleGateway]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with running_gateway((), local_models=()) as gateway:
        yield gateway


@pytest.fixture
def bare_gateway(bare_module_gateway: ConsoleGateway) -> ConsoleGateway:
    """The module's gateway with no nodes, without the launcher page an earlier test's
    ``sluice console`` wrote."""
    (bare_module_gateway.gw.data_dir / LAUNCHER_FILE).unlink(missing_ok=True)
    return bare_module_gateway


def test_it_prints_the_url_and_opens_a_launcher(bare_gateway: ConsoleGateway,
                                                tmp_path: Path) -> None:
    env, record = fake_opener(tmp_path)
    done = run_console(bare_gateway, env)
    assert done.returncode == 0, done.stderr
    url = f"http://localhost:{bare_gateway.gw.port}/ui/#token={bare_gateway.token}"
    assert done.stdout == url + "\n"
    deadline = time.monotonic() + 10
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    opened = record.read_text().split()
    launcher = bare_gateway.gw.data_dir / LAUNCHER_FILE
    assert opened == [launcher.as_uri()]
    assert bare_gateway.token not in record.read_text()  # not on any command line
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o600
    assert url in launcher.read_text()


def test_without_a_display_it_only_prints(bare_gateway: ConsoleGateway, tmp_path: Path) -> None:
    env, record = fake_opener(tmp_path)
    del env["DISPLAY"]
    done = run_console(bare_gateway, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"http://localhost:{bare_gateway.gw.port}/ui/#token=")
    assert "open this URL" in done.stderr
    env["DISPLAY"] = ":99"
    assert run_console(bare_gateway, env, "--no-open").returncode == 0
    assert not record.exists()
    assert not (bare_gateway.gw.data_dir / LAUNCHER_FILE).exists()


def test_no_opener_on_path_is_no_error(bare_gateway: ConsoleGateway, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "DISPLAY": ":99"}
    done = run_console(bare_gateway, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("http://localhost:")


def test_no_gateway_running(tmp_path: Path) -> None:
    done = subprocess.run([*CONSOLE, "--data-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert "no gateway is running" in done.stderr
    assert done.stdout == ""


def test_the_page_keeps_the_token_out_of_the_address_bar_and_the_log(
        console_gateway: ConsoleGateway, browser: Any, tmp_path: Path,
        screenshot: Any) -> None:
    from playwright.sync_api import expect

    env, _record = fake_opener(tmp_path)
    done = run_console(console_gateway, env)
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    token = console_gateway.token
    context = browser.new_context()
    try:
        for start in ((console_gateway.gw.data_dir / LAUNCHER_FILE).as_uri(), url):
            page = context.new_page()
            page.goto(start)
            expect(page.locator("#connection")).to_have_text("live", timeout=READY_TIMEOUT)
            expect(page).to_have_url(f"{console_gateway.url}/ui/#/nodes")
            assert page.evaluate("() => sessionStorage.getItem('sluice.adminToken')") == token
            assert page.evaluate("() => localStorage.length") == 0
            assert page.evaluate("() => document.cookie") == ""
            assert token not in page.evaluate("() => location.href")
            # A write with the token (the page sends it in a header), and the screen is
            # not read-only.
            expect(page.locator("#readonly-banner")).to_be_hidden()
            switch = page.get_by_role("switch", name="Failover")
            for state in ("false", "true"):
                switch.click()
                expect(switch).to_have_attribute("aria-checked", state)
                expect(switch).not_to_have_attribute("aria-busy", "true")
            page.close()
    finally:
        context.close()
    assert console_gateway.get("/api/v1/settings/load-balancing")["failoverEnabled"] is True
    log = console_gateway.log()
    assert "GET /ui/" in log or "/ui/" in log  # the page was loaded through this gateway
    assert token not in log


def test_without_a_token_the_console_is_read_only(console_gateway: ConsoleGateway,
                                                  console_page: OpenPage,
                                                  screenshot: Any) -> None:
    from playwright.sync_api import expect

    page = console_page(console_gateway, "/nodes", token=False)
    banner = page.locator("#readonly-banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("sluice console")
    expect(page.get_by_role("switch", name="Load balancing")).to_be_disabled()
    expect(page.get_by_role("button", name="Add computer")).to_be_disabled()
    screenshot(page, "read-only")
