"""Browser tests of the web console (SPEC §10): real headless Chromium (Debian's
``/usr/bin/chromium``, driven by Playwright's sync API; no browser download) against real
gateway processes with fake nodes and a fake model server.

Fixtures (registered in tests/conftest.py; each test that uses them skips, with the reason,
when Playwright or Chromium is missing — ``scripts/test`` installs both):

``browser`` (session)
    One Chromium for the whole run (``--no-sandbox --disable-background-networking
    --disable-component-update --no-first-run --disable-sync --disable-gpu``; each context
    starts with a fresh profile, and ``console_page`` cleans one before it serves again).
``console_gateway`` (module)
    A :class:`ConsoleGateway`: a ``sluice serve`` process with load balancing on, three
    fake nodes named ``studio``, ``laptop`` and ``den`` (priorities 3, 2, 1; each holds
    ``shared-m`` and its own ``<name>-m``), and a fake local model server (``local-m``).
    Tests of one module share it: put back what you change, or use the factory below.
``make_console_gateway`` (function)
    ``make_console_gateway(nodes=("studio", ...), lb=True, local_models=("local-m",),
    port=None, **config)`` -> a fresh :class:`ConsoleGateway` for this test only
    (``port``: a fixed API port, so that ``gateway.gw.stop(); gateway.gw.launch();
    gateway.gw.ready_sync()`` restarts it where the page reconnects; ``config``: the
    keyword arguments of ``tests.conftest.gateway_config``, e.g. ``failure_threshold=2``).
``console_page`` (function)
    ``console_page(gateway, route="/nodes", *, token=True, width=1280, height=900,
    color_scheme="light", own_context=False)`` -> a Playwright ``Page`` opened at
    ``<gateway.url>/ui/#token=<admin token>`` (no fragment with ``token=False``: read-only),
    then at ``#<route>``; it returns once the live feed is open and the screen's ``<h1>`` is
    there. Each call gets a browser context of its own with one page; a page error (an
    uncaught exception in the console) or a CSP violation fails the test. After the test the
    page is cleaned (session and local storage cleared, ``about:blank``, the context's
    permissions, cookies and offline mode reset) and kept for a later test (``idle_pages``,
    per worker): a new context's page costs a renderer process, about half a second. A test
    that changes its context in a way that cannot be undone (``page.clock.install()``)
    passes ``own_context=True``: that context is closed after the test.
``axe`` (function)
    ``axe(page, name)``: runs axe-core (``.cache/axe``, from the npm registry) on the page
    and fails listing every serious or critical violation (rule, impact, help, elements);
    the default rules that cannot report one (minor or moderate only) are not run.
``screenshot`` (function)
    ``screenshot(page, name)`` -> the path of ``test-output/screens/<name>.png`` (whole
    page), for looking at. A full-page capture costs a few tenths of a second, so only the
    README's pictures (``README_SCREENS``) are written on every run; ``SLUICE_SCREENSHOTS=1``
    writes them all.

:func:`restyle` ``(page, width=..., height=..., color_scheme=...)`` turns an open page into
another variant (viewport size, ``prefers-color-scheme``) without a new context, so that a
test checks its narrow and dark variants on one page and one gateway.

:class:`ConsoleGateway`: ``url`` (``http://localhost:<port>``), ``token`` (admin),
``log_path`` / ``log()``, ``process`` (tests.gateways.GatewayProcess), ``nodes`` (name ->
tests.fakenode.FakeNode, each served from its own thread), ``fingerprint(name)``,
``model`` (the local tests.fakeupstream.FakeUpstream; chat completions answer "from local",
whole or streamed, like each node's "from node-<name>"), ``api(method, path, doc=None)`` ->
``(status, JSON)`` with the admin token, ``get(path)`` -> JSON (asserts 200),
``stop_node(name)`` (its port then refuses connections), ``chat(model)`` -> status of one
chat completion over TCP. Wait with Playwright's ``expect`` and locators, never sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.fakenode import FakeNode, ThreadedUpstream, chat_answer
from tests.fakeupstream import FakeUpstream
from tests.gateways import GatewayProcess, Node

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
AXE_JS = ROOT / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
SCREENS = ROOT / "test-output" / "screens"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync",
                 "--disable-gpu"]
DEFAULT_NODES = ("studio", "laptop", "den")
READY_TIMEOUT = 15_000  # ms: the page, its feed and its screen (a loaded 2-core machine)
# The screenshots the README shows (copied to docs/screens/ by hand), written on every run.
README_SCREENS = frozenset({"pool-1280", "node-order", "pairing-code", "found-on-network"})


def missing() -> str | None:
    """Why browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (scripts/test installs it)"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (scripts/test installs Debian's chromium)"
    return None


class ConsoleGateway:
    """A gateway process with fake nodes and a fake local model (see the module docstring)."""

    def __init__(self, folder: Path, names: Sequence[str], *, lb: bool = True,
                 local_models: Sequence[str] = ("local-m",), port: int | None = None,
                 **config: Any) -> None:
        self.folder = folder
        self._threads: dict[str, ThreadedUpstream] = {}
        self.nodes: dict[str, FakeNode] = {}
        self.model = FakeUpstream(models=tuple(local_models))
        self.model.on("POST", "/v1/chat/completions", chat_answer("from local"))
        self._model_thread = ThreadedUpstream(self.model)
        self._started: list[ThreadedUpstream] = []
        self.process: GatewayProcess | None = None
        self._names = tuple(names)
        self._lb = lb
        self._config = config
        self._local = tuple(local_models)
        self._port = port

    def start(self) -> ConsoleGateway:
        entries = []
        count = len(self._names)
        for i, name in enumerate(self._names):
            fake = FakeNode(f"node-{name}", ["shared-m", f"{name}-m"])
            thread = ThreadedUpstream(fake)
            thread.start()
            self._started.append(thread)
            self._threads[name] = thread
            self.nodes[name] = fake
            entries.append(Node(fake.fingerprint, fake.url, count - i, name=name))
        backends = []
        if self._local:
            self._model_thread.start()
            self._started.append(self._model_thread)
            backends = [("local", self.model.url)]
        # apis native: tests give the fake model its Messages and Responses routes after the
        # start, which the health check's probe would have found missing (SPEC §17.1)
        self.process = GatewayProcess(self.folder, "console", nodes=entries,
                                      backends=backends,
                                      **{"lb": self._lb, "apis": "native", **self._config})
        if self._port is not None:  # a fixed API port (to restart on it), else a free one
            cfg = self.process.config
            self.process.config = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=self._port))
        self.process.launch()
        self.process.ready_sync()
        return self

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
        for thread in self._started:
            with contextlib.suppress(RuntimeError):
                thread.stop()
        log = self.log()
        assert "Traceback" not in log, f"the gateway logged a traceback:\n{log}"

    # -- what tests use ------------------------------------------------------------------

    @property
    def gw(self) -> GatewayProcess:
        assert self.process is not None, "start() first"
        return self.process

    @property
    def url(self) -> str:
        return f"http://localhost:{self.gw.port}"

    @property
    def token(self) -> str:
        return self.gw.admin_token

    @property
    def log_path(self) -> Path:
        return self.gw.log_path

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    def fingerprint(self, name: str) -> str:
        return self.nodes[name].fingerprint

    def api(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        return self.gw.call_sync(method, path, doc, admin=True)

    def get(self, path: str) -> Any:
        status, body = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body

    def order(self) -> list[str]:
        """The registry's node names, top priority first."""
        return [n["name"] for n in self.get("/api/v1/nodes")]

    def stop_node(self, name: str) -> None:
        self._threads[name].stop()

    def chat(self, model: str) -> int:
        conn = HTTPConnection("127.0.0.1", self.gw.port, timeout=30)
        try:
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
            conn.request("POST", "/v1/chat/completions", body,
                         {"Host": "localhost", "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()


@contextlib.contextmanager
def running_gateway(names: Sequence[str] = DEFAULT_NODES, **options: Any
                    ) -> Iterator[ConsoleGateway]:
    folder = Path(tempfile.mkdtemp(prefix="sl-ui-", dir="/tmp"))
    gateway = ConsoleGateway(folder, names, **options)
    try:
        yield gateway.start()
    finally:
        try:
            gateway.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


# -- fixtures (tests/conftest.py imports them) ----------------------------------------------


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def console_gateway() -> Iterator[ConsoleGateway]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with running_gateway() as gateway:
        yield gateway


@pytest.fixture
def make_console_gateway() -> Iterator[Callable[..., ConsoleGateway]]:
    with contextlib.ExitStack() as stack:
        def make(nodes: Sequence[str] = DEFAULT_NODES, **options: Any) -> ConsoleGateway:
            return stack.enter_context(running_gateway(nodes, **options))

        yield make


OpenPage = Callable[..., Any]


@pytest.fixture(scope="session")
def idle_pages(browser: Any) -> Iterator[list[tuple[Any, Any]]]:
    """Browser contexts of one page each that earlier tests gave back (see console_page)."""
    idle: list[tuple[Any, Any]] = []
    yield idle
    for context, _page in idle:
        context.close()


def _give_back(context: Any, page: Any, idle: list[tuple[Any, Any]]) -> None:
    """Clean ``page`` for the next test and keep it, or close its context when it cannot be
    made clean (closed, other pages opened in its context, a navigation failing)."""
    from playwright.sync_api import Error

    if not page.is_closed() and context.pages == [page]:
        try:
            if page.url.startswith("http"):  # the admin token, anything the console kept
                page.evaluate("() => { sessionStorage.clear(); localStorage.clear(); }")
            page.goto("about:blank")  # closes the feed before its gateway stops
            context.clear_permissions()
            context.clear_cookies()
            context.set_offline(False)
        except Error:
            pass
        else:
            idle.append((context, page))
            return
    context.close()


@pytest.fixture
def console_page(browser: Any, idle_pages: list[tuple[Any, Any]]) -> Iterator[OpenPage]:
    from playwright.sync_api import expect

    used: list[tuple[Any, Any, bool, list[tuple[str, Any]]]] = []
    errors: list[str] = []

    def open_page(gateway: ConsoleGateway, route: str = "/nodes", *, token: bool = True,
                  width: int = 1280, height: int = 900, color_scheme: str = "light",
                  own_context: bool = False) -> Any:
        if idle_pages and not own_context:
            context, page = idle_pages.pop()
            page.set_viewport_size({"width": width, "height": height})
        else:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
        page.emulate_media(color_scheme=color_scheme)
        listeners: list[tuple[str, Any]] = [
            ("pageerror", lambda exc: errors.append(str(exc))),
            ("console", lambda msg: errors.append(msg.text)
             if "Content Security Policy" in msg.text else None)]
        for event, listener in listeners:
            page.on(event, listener)
        used.append((context, page, own_context, listeners))
        fragment = f"#token={gateway.token}" if token else f"#{route}"
        page.goto(f"{gateway.url}/ui/{fragment}")
        expect(page.locator("#connection")).to_have_text("live", timeout=READY_TIMEOUT)
        if token and route != "/nodes":
            page.evaluate("route => { location.hash = route; }", f"#{route}")
        expect(page.locator('.screen[data-screen] h1')).to_be_visible(timeout=READY_TIMEOUT)
        return page

    yield open_page
    for context, page, own_context, listeners in used:
        for event, listener in listeners:
            page.remove_listener(event, listener)
        if own_context:
            context.close()
        else:
            _give_back(context, page, idle_pages)
    assert not errors, f"the console raised: {errors}"


def run_axe(page: Any, name: str = "page") -> list[dict[str, Any]]:
    """The serious and critical axe-core violations on ``page`` (injected through the
    DevTools protocol, which the page's CSP does not govern). Only the rules axe runs by
    default that can report a serious or critical violation run (the rule's impact or its
    checks' highest): the others' findings would be dropped here anyway."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE_JS.read_text(encoding="utf-8") + "\n;undefined")
    result = page.evaluate("""async () => {
        const rank = {minor: 1, moderate: 2, serious: 3, critical: 4};
        const impact = id => rank[axe._audit.checks[id]?.metadata?.impact] ?? 0;
        const highest = rule => Math.max(rank[rule.impact] ?? 0, ...[
            ...rule.any, ...rule.all, ...rule.none].map(c => impact(c.id ?? c)));
        const rules = axe._audit.rules.filter(r => r.enabled !== false  // as axe.run would
            && !r.tags.includes("experimental") && highest(r) >= 3);
        const r = await axe.run(document, {resultTypes: ["violations"],
            runOnly: {type: "rule", values: rules.map(rule => rule.id)}});
        return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.map(n => ({target: n.target.join(" "), summary: n.failureSummary}))}));
    }""")
    return [v for v in result if v["impact"] in ("serious", "critical")]


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"- {v['id']} ({v['impact']}): {v['help']}")
        for node in v["nodes"][:8]:
            summary = (node["summary"] or "").replace("\n", " / ")
            lines.append(f"    {node['target']}: {summary}")
    return "\n".join(lines)


@pytest.fixture
def axe() -> Callable[[Any, str], None]:
    if not AXE_JS.exists():
        pytest.skip(f"axe-core is missing ({AXE_JS}; scripts/test installs it)")

    def check(page: Any, name: str = "page") -> None:
        violations = run_axe(page, name)
        assert not violations, f"axe on {name}:\n{describe(violations)}"

    return check


def restyle(page: Any, *, width: int | None = None, height: int | None = None,
            color_scheme: str | None = None) -> Any:
    """The same page at another viewport size and/or colour scheme (the media queries and
    the layout follow at once); returns ``page``."""
    if width is not None or height is not None:
        size = page.viewport_size
        page.set_viewport_size({"width": width or size["width"],
                                "height": height or size["height"]})
    if color_scheme is not None:
        page.emulate_media(color_scheme=color_scheme)
    return page


def save_screenshot(page: Any, name: str) -> Path:
    path = SCREENS / f"{name}.png"
    if name in README_SCREENS or os.environ.get("SLUICE_SCREENSHOTS") == "1":
        SCREENS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def screenshot() -> Callable[[Any, str], Path]:
    return save_screenshot


def holding_puts(page: Any, path: str, method: str = "PUT") -> list[tuple[Any, Any]]:
    """Hold the answers of the page's PUTs (or `method`) to `path`: each is applied by the
    server (route.fetch()) and kept, with its answer, for the test to fulfil later."""
    held: list[tuple[Any, Any]] = []

    def hold(route: Any) -> None:
        if route.request.method != method:
            route.fallback()
            return
        held.append((route, route.fetch()))

    page.route(f"**{path}", hold)
    return held


def wait_held(page: Any, held: list[tuple[Any, Any]]) -> None:
    """Until the held PUT was applied by the server (its route handler runs while the page
    is being waited on): bounded, 10 s at most."""
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1
