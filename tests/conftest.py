"""Shared fixtures and helpers: short socket folders, fake upstreams, the test config
builder, in-process gateways (and changing their live config), admin and remote-peer
requests, the test tiers and their guard.

Test files are named by what they run, and the name alone puts each in its tier (the
markers, set by tests/tiers.py):

- ``test_e2e_*.py`` (marker ``e2e``): real processes: a ``sluice serve`` child
  (tests/gateways.py), real llama.cpp servers, the CLI as a child, the benchmark, the soak,
  the fuzzer.
- ``test_*_lan.py`` (marker ``lan``): two hosts in network namespaces (tests/netns.py; root).
- ``test_ui_*.py`` (marker ``ui``): the web console in a real browser (tests/browser.py).
- everything else: unit tests and in-process tests (a gateway in the test's own trio loop,
  fakes on real loopback sockets). They start no child process: one that does fails,
  naming itself (tests/tiers.py); the run's one llama.cpp question and
  the one ``ldconfig`` of the interface listing are asked before any test. Where a file
  tests a gateway in process it is often ``test_*_gateway.py``.

The marker ``slow`` (set by hand) marks a test of more than about a second of CPU or wall
time on an idle machine, mostly long property runs.

``scripts/test --quick`` runs the last group without ``slow``:
``-m "not e2e and not lan and not ui and not slow"``.

The suite runs in parallel under pytest-xdist (``scripts/test`` passes ``-n`` and
``--dist loadfile``: a file's tests, and its module fixtures, stay on one worker). Each
worker is a process with its own module state, so tests share no fixed port, folder or
process: free ports (port 0, ``free_port``), temporary folders (``short_tmp``,
``tmp_path``), namespaces named by pid (tests/netns.py). What the workers do share is in
tests/workers.py: a file lock, a value computed once per run (``llama_answer``), the demo
model's one fetch (``demo_model``), and the run's figures (the ``figures`` fixture),
merged by the controller into figures.json. Wait for the event itself (a socket, a log
line, a state: tests/waits.py) or use trio's MockClock, never a bare sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import openai
import pytest
import trio

from protocol.config import (
    BackendConfig,
    Config,
    NodeConfig,
    default_config,
    dump_config_yaml,
    rebuild_health_check,
)
from proxy.link import peer_checks
from proxy.models.llama_backends import LlamaBackends
from proxy.server import Gateway
from proxy.settings.store import Settings
from tests.client import Reply, request
from tests.fakeupstream import FakeUpstream

if TYPE_CHECKING:
    from tests.gateways import Launcher

# The web console's browser fixtures (browser, console_gateway, make_console_gateway,
# console_page, axe, screenshot): see tests/browser.py. What the run's parallel workers
# share (a file lock, a value computed once per run, the figures): see tests/workers.py. The
# tiers' markers and the quick tier's guard against child processes: tests/tiers.py.
pytest_plugins = ["tests.browser", "tests.workers", "tests.tiers"]

# No test may send mDNS on this machine's real interfaces (SPEC §14): every gateway this run
# starts, in process or as a child, refuses to open the mDNS socket (proxy.lan.discovery.link),
# but for those tests.netns starts inside the network namespaces a test made.
os.environ["SLUICE_NO_MDNS"] = "1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for configs that need a fixed one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder with a short path: Unix socket paths are limited to 103 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def launch(short_tmp: Path) -> AsyncIterator[Launcher]:
    """Real gateway processes for one test (tests/gateways.py), all stopped at its end."""
    from tests.gateways import Launcher  # it imports this module

    launcher = Launcher(short_tmp)
    try:
        yield launcher
    finally:
        await launcher.aclose()


def _given(obj: Any, **fields: Any) -> Any:
    """``obj`` with the fields that were given (not None) changed."""
    return attrs.evolve(obj, **{k: v for k, v in fields.items() if v is not None})


def gateway_config(
    backends: Sequence[tuple[str, str]] = (),
    *,
    socket_dir: Path,
    connection: float | None = None,
    first_byte: float | None = None,
    chunk_interval: float | None = None,
    stream_total: float | None = None,
    standard_total: float | None = None,
    image_total: float | None = None,
    nodes: Sequence[NodeConfig] = (),
    lb: bool | None = None,
    strategy: str | None = None,
    failover: bool | None = None,
    interval: float | None = None,
    hc_timeout: float | None = None,
    failure_threshold: int | None = None,
    reset_timeout: float | None = None,
    apis: str = "auto",
    **api: Any,
) -> Config:
    """The default config with API port 0 (a free one), ``socket_dir`` for the Unix socket,
    these llm backends (name, url) and nodes, and what else is given: request timeouts,
    the backends' ``apis`` (SPEC §17.1), load balancing (``lb``, ``strategy``, ``failover``),
    health checks (``interval``,
    ``hc_timeout``; ``timeouts.health_check`` derived from them), the circuit breaker, and
    ``api`` fields by name. What is not given (None) keeps its default."""
    cfg = default_config()
    t = cfg.timeouts
    request = attrs.evolve(
        t.request,
        streaming=_given(t.request.streaming, first_byte=first_byte,
                         chunk_interval=chunk_interval, total=stream_total),
        standard=_given(t.request.standard, total=standard_total),
        image_generation=_given(t.request.image_generation, total=image_total))
    cfg = attrs.evolve(
        cfg,
        api=attrs.evolve(cfg.api, **{"port": 0, **api}),
        local=attrs.evolve(cfg.local, socket_dir=str(socket_dir)),
        backends=tuple(BackendConfig(name=n, url=u, kind="llm", apis=apis) for n, u in backends),
        nodes=tuple(nodes),
        load_balancing=_given(cfg.load_balancing, enabled=lb, strategy=strategy,
                              failover_enabled=failover),
        health_checks=_given(cfg.health_checks, interval=interval, timeout=hc_timeout),
        circuit_breaker=_given(cfg.circuit_breaker, failure_threshold=failure_threshold,
                               reset_timeout=reset_timeout),
        timeouts=_given(t, connection=connection, request=request),
    )
    return rebuild_health_check(cfg)


def node(fp: str, url: str, priority: int, enabled: bool = True) -> NodeConfig:
    """A ``nodes:`` entry named after its fingerprint."""
    return NodeConfig(fingerprint=fp, name=fp, base_url=url, priority=priority,
                      enabled=enabled)


def open_settings(data_dir: Path, cfg: Config) -> Settings:
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (data_dir / "config.yaml").write_text(dump_config_yaml(cfg))
    return Settings.open(data_dir)


class RunningGateway:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def tcp(self) -> str:
        return f"127.0.0.1:{self.gateway.ctx.tcp_port}"

    @property
    def unix(self) -> str:
        return f"unix:{self.gateway.ctx.socket_path}"

    def address(self, transport: str) -> str:
        return self.tcp if transport == "tcp" else self.unix

    def openai_client(self, transport: str) -> openai.OpenAI:
        """The official SDK pointed at this gateway over TCP or over its Unix socket."""
        if transport == "tcp":
            return openai.OpenAI(base_url=f"http://{self.tcp}/v1", api_key="unused",
                                 max_retries=0)
        http = httpx.Client(transport=httpx.HTTPTransport(uds=self.gateway.ctx.socket_path))
        return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                             http_client=http)


StartGateway = Callable[..., Awaitable[RunningGateway]]


def _ask_llama() -> list[str] | None:
    llama = LlamaBackends()
    return llama.run_child() if llama.installed() else None


@pytest.fixture(scope="session")
def llama_answer(tmp_path_factory: pytest.TempPathFactory) -> list[str] | None:
    """The installed llama.cpp's compute backends (SPEC §11.1), asked of the real child once
    for the whole run (by the first worker that needs it; tests/workers.py): the gateways of
    ``start_gateway`` are told it, so that no test waits for a child of its own at its first
    status (a MockClock would jump meanwhile). tests/test_e2e_llama_backends.py asks
    through a gateway of its own."""
    from tests.tiers import spawn_allowed  # plugins (pytest_plugins): pytest imports them
    from tests.workers import once_per_run

    with spawn_allowed():
        answer: list[str] | None = once_per_run(tmp_path_factory, "llama-backends",
                                                _ask_llama)
    return answer


@pytest.fixture
async def start_gateway(nursery: trio.Nursery, short_tmp: Path,
                        llama_answer: list[str] | None) -> StartGateway:
    count = 0

    async def start(backends: list[tuple[str, str]], **options: Any) -> RunningGateway:
        nonlocal count
        count += 1
        drain = options.pop("drain_timeout", 5.0)
        identity = options.pop("identity", None)  # SPEC §16: pinned links, a node listener
        folder = short_tmp / f"g{count}"
        cfg = gateway_config(backends, socket_dir=folder / "s", **options)
        gateway = Gateway(open_settings(folder / "data", cfg), drain_timeout=drain,
                          identity=identity, llama=LlamaBackends.answered(llama_answer))
        await nursery.start(gateway.run)
        await gateway.backends.ready.wait()  # every backend checked once
        return RunningGateway(gateway)

    return start


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> FakeUpstream:
    up = FakeUpstream()
    await nursery.start(up.serve)
    return up


@pytest.fixture
async def unix_upstream(nursery: trio.Nursery, short_tmp: Path) -> FakeUpstream:
    up = FakeUpstream(unix_path=str(short_tmp / "up.sock"))
    await nursery.start(up.serve)
    return up


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def inject_backend(gw: RunningGateway, name: str, url: str, models: list[str]) -> None:
    """Add a backend that holds ``models`` right now, without waiting for a health check
    (for upstreams that never answer one)."""
    from proxy.registry.backends import LocalBackend

    backend = LocalBackend(BackendConfig(name=name, url=url, kind="llm"), None)
    registry = gw.gateway.backends
    registry.add(backend)
    registry.checked(backend, [{"id": m} for m in models], None, None)


def configure(gw: RunningGateway, nodes: tuple[NodeConfig, ...] | None = None, *,
              enabled: bool | None = None) -> None:
    """Change the live config without validation (Unix node URLs), then wake the poll."""
    settings = gw.gateway.settings
    cfg = settings.config
    if nodes is not None:
        cfg = attrs.evolve(cfg, nodes=nodes)
    if enabled is not None:
        cfg = attrs.evolve(cfg, load_balancing=attrs.evolve(cfg.load_balancing,
                                                             enabled=enabled))
    settings.config = cfg
    gw.gateway.ctx.nodes.wake()


REMOTE = "127.0.0.2"  # a loopback address the ``remote_seam`` fixture counts as a remote peer


async def remote_request(gw: RunningGateway, method: str, path: str, body: bytes | None = None,
                         headers: list[tuple[str, str]] | None = None) -> Reply:
    """A request from 127.0.0.2, which the ``remote_seam`` fixture counts as a remote peer."""
    return await request(gw.tcp, method, path, body, headers, source=REMOTE)


def admin_headers(gw: RunningGateway) -> list[tuple[str, str]]:
    """The gateway's admin token as a bearer ``authorization`` header."""
    return [("authorization", f"Bearer {gw.gateway.settings.secrets.admin_token}")]


async def admin(gw: RunningGateway, method: str, path: str, doc: Any = None, *,
                body: bytes | None = None) -> Reply:
    """An admin request over the Unix socket with the admin token: ``doc`` sent as JSON, or
    ``body`` as is."""
    if doc is not None:
        body = json.dumps(doc).encode()
    return await request(gw.unix, method, path, body, admin_headers(gw))


@pytest.fixture
def remote_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    real = peer_checks.peer_is_loopback
    monkeypatch.setattr(peer_checks, "peer_is_loopback", lambda host: host != REMOTE and real(host))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a gateway reaps what it stops)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().split(b") ", 1)[1][:1] != b"Z"
    except OSError:
        return False


def blackhole_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A TCP listener whose accept queue is full, so connecting to it hangs. Filled with
    blocking stdlib connects in real time, so a test's mock clock cannot cut them short."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(16):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(0.3)
        fillers.append(sock)
        try:
            sock.connect(listener.getsockname())
        except TimeoutError:
            return listener, fillers
    raise RuntimeError("could not fill the accept queue")


@pytest.fixture
def blackhole() -> Iterator[str]:
    listener, fillers = blackhole_listener()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        for sock in fillers:
            sock.close()
        listener.close()
