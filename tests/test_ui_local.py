"""The console's Local models screen (SPEC §10) in real Chromium against real gateways:
local backends (kind, online or not, models, last error) and managed model servers (state,
address, restarts, last error), each change shown live from the feed's `model` events; the
compute backends of the bundled llama.cpp (SPEC §11.1); axe on light, dark and 360 px."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from protocol.config import ModelConfig
from tests.browser import ConsoleGateway, missing, restyle
from tests.fakenode import ThreadedUpstream
from tests.fakeupstream import FakeUpstream
from tests.gateways import GatewayProcess


class ManagedGateway:
    """A gateway process with one local backend (a fake model server) and one managed model
    whose file is missing, so its load fails: the states the screen must show, without
    llama.cpp."""

    def __init__(self, folder: Path) -> None:
        self.model = FakeUpstream(models=("local-m",))
        self.thread = ThreadedUpstream(self.model)
        self.thread.start()
        self.gw = GatewayProcess(folder, "local", backends=[("local", self.model.url)])
        missing_file = ModelConfig(name="broken-m", path="models/missing.gguf")
        self.gw.config = attrs.evolve(self.gw.config, models=(missing_file,))
        self.gw.launch()
        self.gw.ready_sync()

    @property
    def url(self) -> str:
        return f"http://localhost:{self.gw.port}"

    @property
    def token(self) -> str:
        return self.gw.admin_token

    def status(self) -> Any:
        code, body = self.gw.call_sync("GET", "/api/v1/inference/status", admin=True)
        assert code == 200
        return body

    def close(self) -> None:
        try:
            self.gw.stop()
        finally:
            with contextlib.suppress(RuntimeError):  # a test may have stopped it already
                self.thread.stop()


def card(region: Any, name: str) -> Any:
    """The card of one server on the screen."""
    return region.locator(f'li[data-name="{name}"]')


@pytest.fixture
def managed_gateway() -> Iterator[ManagedGateway]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="sl-ui-", dir="/tmp"))
    gateway = ManagedGateway(folder)
    try:
        yield gateway
    finally:
        try:
            gateway.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def test_backends_show_their_models_live(console_gateway: ConsoleGateway, console_page: Any,
                                         axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = console_gateway
    page = console_page(gw, "/local")
    expect(page.get_by_role("heading", name="Local models", level=1)).to_be_visible()
    backends = page.get_by_role("region", name="Local backends")
    row = card(backends, "local")
    expect(row).to_contain_text("llm")
    expect(row).to_contain_text("online")
    expect(row).to_contain_text("local-m")
    expect(row).to_contain_text("Messages ")  # its APIs, relayed or translated (SPEC §17.1)
    expect(page.get_by_text("None: no models: entries")).to_be_visible()
    # The model server now lists one more model: the next health check (1 s) sees it, and
    # the screen shows it from the feed's `model` event, with no reload.
    gw.model.models.append("extra-m")
    try:
        expect(row).to_contain_text("extra-m", timeout=10_000)
    finally:
        gw.model.models.remove("extra-m")
    expect(row).not_to_contain_text("extra-m", timeout=10_000)
    axe(page, "local models")
    screenshot(page, "local")


def test_managed_models_show_their_state_and_errors(
        managed_gateway: ManagedGateway, console_page: Any, axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = managed_gateway
    page = console_page(gw, "/local")
    managed = page.get_by_role("region", name="Managed models")
    row = card(managed, "broken-m")
    expect(row).to_contain_text("cannot read")  # found when the catalogue was made
    expect(row.get_by_text("unloaded")).to_be_visible()
    expect(row).to_contain_text("bundled llama.cpp")  # its engine (SPEC §11.1)
    expect(row).to_contain_text("Messages native, Responses native")  # SPEC §17.1
    # SPEC §17.2: the context one request will get (2048 over 2 slots), planned until loaded
    expect(row.get_by_role("definition").filter(has_text="tokens")).to_have_text(
        "1,024 tokens planned")
    # What the bundled llama.cpp runs on (SPEC §11.1): these machines have no GPU.
    assert "cpu" in gw.status()["llamaBackends"]
    llama = managed.get_by_role("definition").filter(has_text="CPU")
    expect(llama).to_have_text("CPU")
    expect(managed.get_by_role("term").filter(has_text="llama.cpp backends")).to_be_visible()
    # Narrow and dark, on this page, before the load is tried: axe, no sideways scrolling.
    for width, scheme in [(360, "light"), (1280, "dark"), (1280, "light")]:
        restyle(page, width=width, color_scheme=scheme)
        expect(page.get_by_text("cannot read").first).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        if (width, scheme) != (1280, "light"):  # that one is checked below, after the load
            axe(page, f"local {width}px {scheme}")
            screenshot(page, f"local-{width}-{scheme}")
    # A request for it: the load fails at once, and the card says so, live.
    code, body = gw.gw.call_sync("POST", "/v1/chat/completions",
                                 {"model": "broken-m", "messages": [{"role": "user",
                                                                      "content": "hi"}]})
    assert (code, body["error"]["code"]) == (503, "model_load_failed")
    expect(row.get_by_text("failed")).to_be_visible(timeout=10_000)
    entry = next(m for m in gw.status()["managedModels"] if m["name"] == "broken-m")
    assert entry["state"] == "failed"
    assert entry["lastError"].startswith("cannot read")
    # The managed server is not listed again among the backends.
    backends = page.get_by_role("region", name="Local backends")
    expect(card(backends, "broken-m")).to_have_count(0)
    axe(page, "local models, managed")
    screenshot(page, "local-managed")

    # The local backend's server goes away: offline, with the reason, live.
    backend = card(backends, "local")
    expect(backend).to_contain_text("online")
    expect(backend).to_contain_text("local-m")
    gw.thread.stop()
    expect(backend).to_contain_text("offline", timeout=10_000)
    expect(backend).to_contain_text("cannot connect")
    assert next(b for b in gw.status()["backends"] if b["name"] == "local")["online"] is False
    screenshot(page, "local-offline")
