"""The console's models on demand (SPEC §10, §11) in real Chromium against a real gateway
whose managed models are real llama.cpp servers: the Local models screen lists them with
their state and the memory budget, Load and Unload work (busy while the call runs, the
state live from the feed, the pid and the measured memory shown), the "unloads in …"
countdown goes down every second, a broken GGUF shows failed with its reason; the
Playground says "Loading <model>…" while its first request loads a cold model. Axe on
light, dark and 360 px."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from protocol.config import ModelConfig
from tests.browser import missing, restyle
from tests.gateways import GatewayProcess
from tests.test_e2e_llama import gguf  # noqa: F401 (a fixture)
from tests.test_e2e_ondemand import alive

pytest.importorskip("xllamacpp")

GIB = 1 << 30
LOAD = 60_000  # ms: a real llama.cpp start on a loaded 2-core machine
KEEP_ALIVE = 45.0  # seconds: smollm2 stays loaded long enough to watch its countdown
GARBAGE = b"this is not a model, only some garbage bytes\n" * 8


class OnDemandGateway:
    """A gateway process with two managed models in its data dir's models folder:
    ``smollm2`` (a link to the demo GGUF; a models: entry gives it a small context and
    KEEP_ALIVE) and ``x`` (garbage bytes: its load fails with the header's reason); at most
    one loaded, in a 2 GiB budget."""

    def __init__(self, folder: Path, gguf: Path) -> None:  # noqa: F811
        models = folder / "data" / "models"
        models.mkdir(parents=True)
        os.symlink(gguf, models / "smollm2.gguf")
        (models / "x.gguf").write_bytes(GARBAGE)
        self.gw = GatewayProcess(folder, "ondemand")
        cfg = self.gw.config
        smollm2 = ModelConfig(name="smollm2", path="models/smollm2.gguf", context=512,
                              parallel=1, threads=1, keep_alive=KEEP_ALIVE)
        self.gw.config = attrs.evolve(
            cfg, models=(smollm2,),
            model_loading=attrs.evolve(cfg.model_loading, max_loaded=1, memory_budget=2 * GIB))
        self.gw.launch()
        self.gw.ready_sync()

    @property
    def url(self) -> str:
        return f"http://localhost:{self.gw.port}"

    @property
    def token(self) -> str:
        return self.gw.admin_token

    def local(self) -> dict[str, Any]:
        code, body = self.gw.call_sync("GET", "/api/v1/models/local", admin=True)
        assert code == 200, body
        return {m["name"]: m for m in body["models"]}

    def close(self) -> None:
        self.gw.stop()
        log = self.gw.log()
        assert "Traceback" not in log, f"the gateway logged a traceback:\n{log}"


@pytest.fixture
def ondemand(gguf: Path) -> Iterator[OnDemandGateway]:  # noqa: F811
    reason = missing()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="sl-ui-", dir="/tmp"))
    try:
        gateway = OnDemandGateway(folder, gguf)
        try:
            yield gateway
        finally:
            gateway.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def card(page: Any, name: str) -> Any:
    """A managed model's card on the Local models screen."""
    return page.get_by_role("region", name="Managed models").locator(f'li[data-name="{name}"]')


def fact(node: Any, term: str) -> Any:
    """The value of one fact (``dt`` term) inside ``node``."""
    return node.locator("dl.facts div", has=node.page.locator("dt", has_text=term)).locator("dd")


def button(node: Any, name: str) -> Any:
    return node.get_by_role("button", name=name, exact=True)


def record_texts(page: Any, selector: str, key: str) -> None:
    """Keep every text the element at ``selector`` shows from now on, in
    ``window.seen[key]`` (a busy state may last less than one of Playwright's polls)."""
    page.evaluate("""([selector, key]) => {
        window.seen = window.seen || {};
        const node = document.querySelector(selector);
        const seen = window.seen[key] = [node.textContent];
        new MutationObserver(() => {
            if (seen[seen.length - 1] !== node.textContent) seen.push(node.textContent);
        }).observe(node, {subtree: true, childList: true, characterData: true});
    }""", [selector, key])


def seen(page: Any, key: str) -> list[str]:
    return list(page.evaluate("key => window.seen[key]", key))


def seconds_left(text: str) -> int:
    """``unloads in 1m 5s`` -> 65."""
    found = re.fullmatch(r"unloads in (?:(\d+)m )?(\d+)s", text)
    assert found, text
    return int(found[1] or 0) * 60 + int(found[2])


def test_load_count_down_and_unload(ondemand: OnDemandGateway, console_page: Any, axe: Any,
                                    screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = ondemand
    page = console_page(gw, "/local")
    expect(page.get_by_role("heading", name="Managed models")).to_be_visible()
    smol, broken = card(page, "smollm2"), card(page, "x")
    expect(smol.locator(".badge")).to_have_text("unloaded")
    expect(broken.locator(".badge")).to_have_text("unloaded")
    expect(broken).to_contain_text("not a GGUF file")  # found when the catalogue was made
    expect(fact(smol, "From")).to_have_text("config.yaml")
    expect(fact(broken, "From")).to_have_text("models folder")
    expect(fact(smol, "Keep alive")).to_have_text("45s")
    expect(fact(smol, "PID")).to_have_text("—")
    estimate = gw.local()["smollm2"]["estimatedBytes"]
    expect(fact(smol, "Memory")).to_contain_text("~")
    expect(fact(smol, "Memory")).to_contain_text("estimate")
    assert 50 << 20 < estimate < GIB
    budget = page.get_by_role("group", name="Memory budget")
    expect(budget).to_contain_text("0\u00a0B of 2.00\u00a0GiB budget")
    expect(budget).to_contain_text("0 of at most 1 loaded")
    meter = budget.get_by_role("meter", name="Memory in use")
    expect(meter).to_have_attribute("aria-valuenow", "0")
    axe(page, "local models, unloaded")
    screenshot(page, "models-unloaded")

    # Load: busy while the call runs, then loaded from the feed, with its pid and memory.
    load = button(smol, "Load smollm2")
    record_texts(page, '[data-name="smollm2"] button', "smollm2")
    load.click()
    expect(smol.locator(".badge")).to_have_text("loaded", timeout=LOAD)
    expect(button(smol, "Unload smollm2")).to_be_enabled()
    assert "Loading…" in "".join(seen(page, "smollm2"))
    entry = gw.local()["smollm2"]
    assert entry["state"] == "loaded"
    assert entry["pid"] > 0
    expect(fact(smol, "PID")).to_have_text(str(entry["pid"]))
    expect(fact(smol, "Memory")).not_to_contain_text("~")
    expect(fact(smol, "Memory")).to_contain_text("MiB")
    expect(fact(smol, "Address")).to_be_visible()
    expect(budget).to_contain_text("1 of at most 1 loaded")
    expect(budget).not_to_contain_text("0\u00a0B of")
    assert int(meter.get_attribute("aria-valuenow") or 0) >= 1

    # The countdown goes down, once a second, without a reload.
    clock = smol.locator(".countdown")
    expect(clock).to_have_text(re.compile(r"unloads in \d+s"))
    first = clock.inner_text()
    assert 10 <= seconds_left(first) <= KEEP_ALIVE, first
    expect(clock).not_to_have_text(first, timeout=3_000)
    later = clock.inner_text()
    assert seconds_left(later) < seconds_left(first), (first, later)
    axe(page, "local models, loaded")
    screenshot(page, "models-loaded")

    # Unload: the server goes, the card says so.
    pid = entry["pid"]
    button(smol, "Unload smollm2").click()
    expect(smol.locator(".badge")).to_have_text("unloaded", timeout=20_000)
    expect(fact(smol, "PID")).to_have_text("—")
    expect(clock).to_have_text("")
    expect(button(smol, "Load smollm2")).to_be_enabled()
    expect(budget).to_contain_text("0 of at most 1 loaded")
    assert gw.local()["smollm2"]["pid"] is None
    assert not alive(pid)  # the unload answered once its server was gone


def test_a_broken_gguf_fails_with_its_reason_and_rescan_finds_a_new_file_narrow_and_dark(
        ondemand: OnDemandGateway, gguf: Path, console_page: Any, axe: Any,  # noqa: F811
        screenshot: Any) -> None:
    from playwright.sync_api import expect

    read_only(ondemand, console_page)  # before any load: the cards' first state
    page = console_page(ondemand, "/local")
    broken = card(page, "x")
    expect(broken.locator(".badge")).to_have_text("unloaded")
    button(broken, "Load x").click()
    expect(broken.locator(".badge")).to_have_text("failed", timeout=LOAD)
    status = broken.locator(".form-status")
    expect(status).to_contain_text("not a GGUF file")  # the call's error, beside its button
    expect(fact(broken, "Last error")).to_contain_text("not a GGUF file")
    expect(fact(broken, "Log")).to_contain_text("x.log")
    expect(button(broken, "Load x")).to_be_enabled()  # try again
    assert ondemand.local()["x"]["state"] == "failed"
    axe(page, "local models, failed")
    screenshot(page, "models-failed")

    # A new file in the models folder: Rescan folders lists it at once (not in 10 s).
    os.symlink(gguf, ondemand.gw.data_dir / "models" / "extra.gguf")
    page.get_by_role("button", name="Rescan folders").click()
    expect(page.get_by_text("Rescanned: found extra")).to_be_visible()
    expect(card(page, "extra").locator(".badge")).to_have_text("unloaded")
    expect(fact(card(page, "extra"), "From")).to_have_text("models folder")

    # Narrow and dark (x failed, smollm2 loaded), on this page: axe, no sideways scrolling.
    restyle(page, width=360)
    smol = card(page, "smollm2")
    button(smol, "Load smollm2").click()
    expect(smol.locator(".badge")).to_have_text("loaded", timeout=LOAD)
    for width, scheme in [(360, "light"), (1280, "dark")]:
        restyle(page, width=width, color_scheme=scheme)
        expect(smol.locator(".countdown")).to_contain_text("unloads in")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        axe(page, f"local models {width}px {scheme}")
        screenshot(page, f"models-{width}-{scheme}")


def read_only(ondemand: OnDemandGateway, console_page: Any) -> None:
    """Without the token: the models, without their buttons (nothing loaded yet)."""
    from playwright.sync_api import expect

    page = console_page(ondemand, "/local", token=False)
    expect(page.get_by_role("note")).to_contain_text("loading or unloading a model needs "
                                                     "the admin token")
    smol = card(page, "smollm2")
    expect(smol.locator(".badge")).to_have_text("unloaded")
    expect(button(smol, "Load smollm2")).to_be_disabled()
    expect(page.get_by_role("button", name="Rescan folders")).to_be_disabled()


def test_playground_says_loading_while_a_cold_model_loads(
        ondemand: OnDemandGateway, console_page: Any, axe: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    gw = ondemand
    local = console_page(gw, "/local")  # another tab: the load shows there live
    page = console_page(gw, "/playground")
    page.get_by_label("Model").select_option("smollm2")
    note = page.locator("#playground-model-state")
    expect(note).to_contain_text("Not loaded: the first request loads it")
    record_texts(page, "#playground-status", "status")
    page.get_by_label("Message").fill("Say hello.")
    page.get_by_role("button", name="Send").click()
    screenshot(page, "playground-cold")  # for looking at: most likely still loading
    screenshot(local, "models-loading")
    reply = page.locator('[data-role="assistant"] p').last
    expect(page.get_by_role("status").filter(has_text="Done in")).to_be_visible(timeout=LOAD)
    texts = seen(page, "status")
    assert "Loading smollm2…" in texts, texts
    assert reply.inner_text().strip(), "no answer"
    assert texts.index("Loading smollm2…") < texts.index("Streaming…"), texts
    expect(note).to_have_text("Loaded.")
    entry = gw.local()["smollm2"]
    assert entry["state"] == "loaded"
    # The Local models tab saw it load, and, once the request ended, its idle clock.
    smol = card(local, "smollm2")
    expect(smol.locator(".badge")).to_have_text("loaded")
    expect(smol.locator(".countdown")).to_contain_text("unloads in")
    axe(page, "playground, loaded on demand")
    screenshot(page, "playground-loading")

    # Warm now: the next request waits for nothing but its answer. A new chat: the first
    # answer has no max_tokens and may fill the 512-token context, so the same chat again
    # could be refused by llama.cpp as too long (it was, once in CI).
    page.get_by_role("button", name="New chat").click()
    expect(page.locator('[data-role="assistant"] p')).to_have_count(0)
    record_texts(page, "#playground-status", "warm")
    page.get_by_label("Message").fill("Again.")
    page.get_by_role("button", name="Send").click()
    expect(page.locator('[data-role="assistant"] p')).to_have_count(1)
    expect(page.get_by_role("status").filter(has_text="Done in")).to_be_visible(timeout=LOAD)
    assert "Loading smollm2…" not in seen(page, "warm")
