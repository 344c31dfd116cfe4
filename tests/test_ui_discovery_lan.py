"""The Nodes screen finds a computer on a real LAN and connects it with a pairing code (SPEC
§14, §10): two ``sluice serve`` processes in two network namespaces (:mod:`tests.netns`),
real mDNS between them, and Chromium run inside A's namespace.

Host B: external access on, ``discovery.announce`` on, a fake model server (``b-model``) on
a Unix socket; its clients on the LAN need an access key. Host A: load balancing on,
``discovery.browse`` on. Chromium is started by Playwright through a wrapper script that
execs it under ``ip netns exec <A's namespace>`` (Playwright drives it over a pipe, which
the exec keeps), and opens A's console at ``http://127.0.0.1:<A's port>/ui/`` (loopback:
A's Host guard lets it in). The test: B appears under "Found on this network"; a code made
on B (its API over its Unix socket) typed after Connect, Enter: B is in A's connected
computers, "Connected" in the found list, and a chat request to A for ``b-model`` is served
by B with the access key the code got. A wrong code first: B's refusal beside the field.

Skips, saying so, where namespaces, Playwright or Chromium are not available. Discovery
runs only inside these namespaces, never on a real interface."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS, READY_TIMEOUT, missing
from tests.fakeupstream import FakeUpstream, json_completion
from tests.gateways import GatewayProcess
from tests.netns import Lan, lan_run

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Browser, Page, expect

FOUND_TIMEOUT = 20_000  # ms: B's announcement seen by A's browser (mDNS, first query at once)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=15)
        self.path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def call(gw: GatewayProcess, method: str, path: str, doc: Any = None
         ) -> tuple[int, dict[str, str], Any]:
    """``method path`` on ``gw``'s Unix socket with its admin token: (status, headers, JSON)."""
    conn = UnixHTTPConnection(gw.socket_path)
    headers = {"Host": "localhost", "Authorization": f"Bearer {gw.admin_token}"}
    body = None if doc is None else json.dumps(doc).encode()
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        data = response.read()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                json.loads(data) if data else None)
    finally:
        conn.close()


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` (bounded) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not in {timeout}s"
        time.sleep(0.1)


def ok(gw: GatewayProcess, method: str, path: str, doc: Any = None) -> Any:
    status, _, body = call(gw, method, path, doc)
    assert status == 200, (method, path, status, body)
    return body


class Hosts:
    def __init__(self, lan: Lan, a: GatewayProcess, b: GatewayProcess, folder: Path) -> None:
        self.lan = lan
        self.a = a
        self.b = b
        self.folder = folder


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with lan_run("LAN CONSOLE TEST", "sl-uilan-", missing()) as run:
        folder = run.folder
        up_b = run.serve(FakeUpstream(models=["b-model"], unix_path=str(folder / "b.sock")))
        up_b.on("POST", "/v1/chat/completions", json_completion("from b", "b-model"))
        b = run.launch("b", GatewayProcess(folder / "b", "uilan-b",
                                           backends=[("b-fake", up_b.url)], lb=False,
                                           allow_external_access=True))
        a = run.launch("a", GatewayProcess(folder / "a", "uilan-a", lb=True))
        ok(b, "PUT", "/api/v1/settings/discovery", {"announce": True})
        ok(a, "PUT", "/api/v1/settings/discovery", {"browse": True})
        yield Hosts(run.lan, a, b, folder)


@pytest.fixture
def browser_in_a(hosts: Hosts, browser: Browser) -> Iterator[Browser]:
    """A Chromium whose network is A's namespace (launched by the session's Playwright)."""
    wrapper = hosts.folder / "chromium-in-a"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(hosts.lan.prefix("a"))} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    inside = browser.browser_type.launch(executable_path=str(wrapper), headless=True,
                                         args=CHROMIUM_ARGS)
    try:
        yield inside
    finally:
        inside.close()


@pytest.fixture
def page_of_a(hosts: Hosts, browser_in_a: Browser) -> Iterator[Page]:
    context = browser_in_a.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text)
                if "Content Security Policy" in msg.text else None)
        page.goto(f"http://127.0.0.1:{hosts.a.port}/ui/#token={hosts.a.admin_token}")
        expect(page.locator("#connection")).to_have_text("live", timeout=READY_TIMEOUT)
        yield page
    finally:
        context.close()
    assert not errors, f"the console raised: {errors}"


def test_found_on_the_network_then_connected_with_a_code(
        hosts: Hosts, page_of_a: Page, screenshot: Callable[[Page, str], Any],
        axe: Callable[[Page, str], None]) -> None:
    page, a, b = page_of_a, hosts.a, hosts.b
    effect = page.locator(".discovery-effect")
    expect(page.get_by_role("switch", name="Find computers on this network")
           ).to_have_attribute("aria-checked", "true")
    expect(effect).to_contain_text("On: looking for other computers.")
    expect(effect).to_contain_text("Other computers do not see this one.")  # browse only
    found = page.get_by_role("list", name="Computers found on this network")
    item = found.get_by_role("listitem").filter(has_text=f":{b.port}")
    expect(item).to_be_visible(timeout=FOUND_TIMEOUT)
    listed = ok(a, "GET", "/api/v1/nodes/discovered")
    assert [c["fingerprint"] for c in listed] == [b.fingerprint], listed
    name, base_url = listed[0]["name"], listed[0]["baseUrl"]
    assert base_url == f"http://{hosts.lan.addr['b']}:{b.port}", listed
    expect(item).to_contain_text(name)
    expect(item).to_contain_text(base_url)
    screenshot(page, "found-on-network")
    connect = item.get_by_role("button", name=f"Connect {name}")
    # A wrong code: B refuses, and the refusal shows beside the field.
    code = ok(b, "POST", "/api/v1/pairing")["code"]
    connect.click()
    field = item.get_by_role("textbox", name="Pairing code")
    expect(field).to_be_focused()
    expect(field).to_have_attribute("inputmode", "numeric")
    field.fill("000000" if code != "000000" else "111111")
    field.press("Enter")
    expect(field).to_have_attribute("aria-invalid", "true")
    refusal = item.locator(".field .save-status.bad")
    expect(refusal).to_contain_text("not accepted")  # B's words, through A
    expect(refusal).not_to_contain_text("pairingCode:")  # the field's JSON name is no news
    axe(page, "a refused pairing code")
    screenshot(page, "pairing-refused")
    assert ok(a, "GET", "/api/v1/nodes") == []
    # Escape closes the field, focus back on Connect; then the right code, and Enter.
    field.press("Escape")
    expect(field).to_have_count(0)
    expect(connect).to_be_focused()
    connect.click()
    field = item.get_by_role("textbox", name="Pairing code")
    field.fill(f"{code[:3]} {code[3:]}")  # as B shows it
    field.press("Enter")
    expect(item.get_by_text("Connected", exact=True)).to_be_visible()
    connected = page.get_by_role("list", name="Connected computers")
    expect(connected).to_contain_text(name)
    expect(page.locator("ol.order > li .node-name")).to_have_text([name])
    nodes = ok(a, "GET", "/api/v1/nodes")
    assert [(n["fingerprint"], n["hasApiKey"]) for n in nodes] == [(b.fingerprint, True)], nodes
    assert ok(b, "GET", "/api/v1/pairing")["state"] == "claimed"
    screenshot(page, "found-on-network-connected")
    # A chat request to A for B's model is served by B (with the key the code got), once
    # A's health check has seen B and its models.
    wait_until(lambda: any(b.fingerprint in m["availableOn"] for m in
                           ok(a, "GET", "/api/v1/pool/distributed-status")["models"]
                           if m["id"] == "b-model"), "b-model available on B through A")
    status, headers, body = call(a, "POST", "/v1/chat/completions",
                                 {"model": "b-model",
                                  "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    assert headers.get("x-sluice-served-by") == f"node:{b.fingerprint}", headers
    assert body["choices"][0]["message"]["content"] == "from b"
