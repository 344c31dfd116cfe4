"""Real ``sluice serve`` processes for end-to-end tests, each with its own data dir, socket
folder (a short path under /tmp), free TCP port, fingerprint and admin token.

``GatewayProcess(folder, name, ...)`` builds its config with ``tests.conftest.gateway_config``
(the same keyword arguments, ``nodes`` as :class:`Node`; ``PROCESS_DEFAULTS`` unless told),
writes ``config.yaml`` (with ``dump_config_yaml``),
``secrets.yaml`` (admin token, node keys) and ``node.id``, then ``launch()`` starts
``python -m proxy serve --data-dir ...`` with stderr going to ``<folder>/log``. The API port
is 0 in the config: the gateway picks a free one and publishes it in ``state.json``.
Readiness is ``GET /health`` answering 200 over TCP; ``ready()`` (async, for tests whose
fakes run in the same trio loop) and ``ready_sync()`` (for fixtures outside any loop) both
poll it, bounded. ``astop()`` / ``stop()`` send SIGTERM (a second one cancels what is still
draining), then SIGKILL if the process is still there.

The async helpers talk raw HTTP with :mod:`tests.client`: over TCP by default, or over the
Unix socket (``via="unix"``: no access key needed there).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from http.client import HTTPConnection
from pathlib import Path
from typing import IO, Any

import attrs
import trio
import yaml

from protocol.config import NodeConfig, dump_config_yaml
from protocol.secrets import Secrets
from tests.client import Reply, chat_body, request
from tests.conftest import gateway_config, node

SERVE = [sys.executable, "-m", "proxy", "serve"]
START_TIMEOUT = 20.0  # generous: the whole suite may be running on the same two cores
STOP_TIMEOUT = 5.0


@attrs.frozen
class Node:
    """A ``nodes:`` entry (and its key, if any) for a gateway's config."""

    fingerprint: str
    base_url: str
    priority: int
    key: str | None = None
    enabled: bool = True
    name: str | None = None  # the registry's label (default: the fingerprint)
    weight: int = 1  # its share under the weighted strategy

    def config(self) -> NodeConfig:
        entry = attrs.evolve(node(self.fingerprint, self.base_url, self.priority,
                                  self.enabled), weight=self.weight)
        return entry if self.name is None else attrs.evolve(entry, name=self.name)


# A process polls its nodes every second and balances load unless told otherwise (the
# in-process gateways of tests/conftest.py keep the defaults of default_config()).
PROCESS_DEFAULTS: dict[str, Any] = {"lb": True, "interval": 1.0, "hc_timeout": 0.8}


class GatewayProcess:
    """One real gateway process (see the module docstring)."""

    def __init__(self, folder: Path, name: str, *, nodes: Sequence[Node] = (),
                 **config: Any) -> None:
        self.folder = folder
        self.name = name
        self.fingerprint = f"node-{name}-{secrets.token_hex(4)}"
        self.admin_token = secrets.token_urlsafe(24)
        self.data_dir = folder / "data"
        self.socket_dir = folder / "s"
        self.socket_path = self.socket_dir / "sluice.sock"
        self.log_path = folder / "log"
        self.node_keys = {n.fingerprint: n.key for n in nodes if n.key}
        self.config = gateway_config(socket_dir=self.socket_dir,
                                     nodes=[n.config() for n in nodes],
                                     **{**PROCESS_DEFAULTS, **config})
        # Status and admin calls go over the Unix socket when TCP clients need a key.
        self.default_via = "unix" if self.config.api.require_auth else "tcp"
        self.port: int | None = None
        self.prefix: list[str] = []  # e.g. ``ip netns exec <ns>`` (tests/netns.py)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        return f"GatewayProcess({self.name!r}, {self.fingerprint}, port={self.port})"

    # -- lifecycle -----------------------------------------------------------------------

    def launch(self) -> None:
        """Write the data dir and start the process (returns at once; see ready())."""
        for folder in (self.folder, self.data_dir, self.folder / "run"):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.data_dir / "config.yaml").write_text(dump_config_yaml(self.config))
        secret = Secrets(admin_token=self.admin_token, node_keys=dict(self.node_keys))
        path = self.data_dir / "secrets.yaml"
        path.write_text(yaml.safe_dump(secret.to_dict(), sort_keys=False))
        path.chmod(0o600)
        (self.data_dir / "node.id").write_text(self.fingerprint + "\n")
        env = {**os.environ, "XDG_RUNTIME_DIR": str(self.folder / "run")}
        env.pop("SLUICE_DATA_DIR", None)
        if self.prefix:  # inside a network namespace a test made (tests/netns.py): mDNS
            env.pop("SLUICE_NO_MDNS", None)  # stays on that namespace's veth
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen([*self.prefix, *SERVE, "--data-dir", str(self.data_dir)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def _check_alive(self) -> None:
        assert self.proc is not None, "launch() first"
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway {self.name} exited with {self.proc.returncode}:\n"
                                 f"{self.log()}")

    def _state_port(self) -> int | None:
        try:
            state = json.loads((self.data_dir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        port = state.get("tcpPort")
        return port if isinstance(port, int) else None

    async def ready(self, timeout: float = START_TIMEOUT) -> GatewayProcess:
        """Wait (bounded) until ``GET /health`` answers 200 on the API port."""
        with trio.fail_after(timeout):
            while True:
                self._check_alive()
                self.port = self.port or self._state_port()
                if self.port is not None:
                    try:
                        if (await request(self.address, "GET", "/health")).status == 200:
                            return self
                    except OSError:
                        pass
                await trio.sleep(0.02)

    def ready_sync(self, timeout: float = START_TIMEOUT) -> GatewayProcess:
        """ready() for callers outside a trio loop."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            self.port = self.port or self._state_port()
            if self.port is not None:
                conn = HTTPConnection("127.0.0.1", self.port, timeout=2)
                try:
                    conn.request("GET", "/health")
                    if conn.getresponse().status == 200:
                        return self
                except OSError:
                    pass
                finally:
                    conn.close()
            time.sleep(0.02)
        raise AssertionError(f"gateway {self.name} not ready in {timeout}s:\n{self.log()}")

    async def astop(self) -> None:
        """stop() from inside a trio loop, in a worker thread."""
        await trio.to_thread.run_sync(self.stop)

    def stop(self) -> None:
        """SIGTERM (twice if it is still draining), then SIGKILL."""
        proc = self.proc
        if proc is None:
            return
        try:
            for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                proc.send_signal(sig)
                try:
                    proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- addresses -----------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` for tests.client."""
        assert self.port is not None, "not ready yet"
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What other gateways put in ``nodes[].base_url``."""
        return f"http://{self.address}"

    @property
    def unix(self) -> str:
        return f"unix:{self.socket_path}"

    def node(self, priority: int, key: str | None = None) -> Node:
        """This gateway as another gateway's node."""
        return Node(self.fingerprint, self.base_url, priority, key)

    # -- HTTP helpers --------------------------------------------------------------------

    def admin(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.admin_token}")]

    def where(self, via: str | None) -> str:
        """The tests.client address for ``via`` (``tcp``, ``unix``, None = default)."""
        return self.address if (via or self.default_via) == "tcp" else self.unix

    async def call(self, method: str, path: str, doc: Any = None, *, via: str | None = None,
                   admin: bool = False, headers: Sequence[tuple[str, str]] = ()) -> Reply:
        body = None if doc is None else json.dumps(doc).encode()
        hdrs = [*(self.admin() if admin else []), *headers]
        if body is not None:
            hdrs.append(("content-type", "application/json"))
        return await request(self.where(via), method, path, body, hdrs)

    def call_sync(self, method: str, path: str, doc: Any = None, *,
                  admin: bool = False) -> tuple[int, Any]:
        """call() for callers outside a trio loop: (status, JSON body)."""
        headers = {"Host": "localhost", **({"Authorization": f"Bearer {self.admin_token}"}
                                           if admin else {})}
        body = None if doc is None else json.dumps(doc).encode()
        if body is not None:
            headers["Content-Type"] = "application/json"
        assert self.port is not None, "not ready yet"
        conn = HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body, headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()

    async def get_json(self, path: str, *, via: str | None = None, admin: bool = False) -> Any:
        reply = await self.call("GET", path, via=via, admin=admin)
        assert reply.status == 200, (path, reply.status, reply.body)
        return reply.json()

    async def chat(self, model: str, *, stream: bool = False, via: str = "tcp",
                   headers: Sequence[tuple[str, str]] = (), body: bytes | None = None) -> Reply:
        """A chat completion for ``model`` (or exactly ``body``), read whole; over TCP
        unless ``via="unix"``."""
        hdrs = [("content-type", "application/json"), *headers]
        return await request(self.where(via), "POST", "/v1/chat/completions",
                             body or chat_body(model, stream), hdrs)

    async def routing_stats(self) -> Any:
        return await self.get_json("/api/v1/pool/routing-stats")

    async def node_stats(self, fingerprint: str) -> Any:
        for entry in (await self.routing_stats())["nodes"]:
            if entry["fingerprint"] == fingerprint:
                return entry
        raise AssertionError(f"{fingerprint} is not in {self.name}'s routing stats")

    async def distributed_status(self) -> Any:
        return await self.get_json("/api/v1/pool/distributed-status")

    async def model_ids(self) -> list[tuple[str, str]]:
        """``(id, owned_by)`` of ``GET /v1/models``."""
        return [(m["id"], m["owned_by"]) for m in (await self.get_json("/v1/models"))["data"]]

    async def set_load_balancing(self, **fields: Any) -> Any:
        reply = await self.call("PUT", "/api/v1/settings/load-balancing", fields, admin=True)
        assert reply.status == 200, reply.body
        return reply.json()

    # -- waiting -------------------------------------------------------------------------

    async def wait_until(self, check: Callable[[], Awaitable[bool]], what: str,
                         timeout: float = 10.0) -> None:
        """Poll ``check`` (bounded) until it holds."""
        try:
            with trio.fail_after(timeout):
                while not await check():
                    await trio.sleep(0.02)
        except trio.TooSlowError:
            raise AssertionError(f"{self.name}: {what} not reached in {timeout}s") from None

    async def wait_nodes(self, holders: dict[str, Sequence[str]],
                         timeout: float = 10.0) -> None:
        """Wait until each fingerprint is online and listed as a holder of its models."""

        async def check() -> bool:
            pool = await self.distributed_status()
            online = {e["fingerprint"] for e in pool["endpoints"] if e["status"] == "online"}
            where = {m["id"]: set(m["availableOn"]) for m in pool["models"]}
            return all(fp in online and all(fp in where.get(m, ()) for m in models)
                       for fp, models in holders.items())

        await self.wait_until(check, f"nodes online with their models {holders}", timeout)


class Launcher:
    """Starts gateways for one test (or module) in numbered folders under ``root`` and
    stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gateways: list[GatewayProcess] = []

    def _new(self, name: str, config: dict[str, Any]) -> GatewayProcess:
        gw = GatewayProcess(self.root / f"g{len(self.gateways)}", name, **config)
        self.gateways.append(gw)
        gw.launch()
        return gw

    async def start(self, name: str, **config: Any) -> GatewayProcess:
        return await self._new(name, config).ready()

    async def start_many(self, specs: dict[str, dict[str, Any]]) -> list[GatewayProcess]:
        """Start several at once (name -> config); returns them ready, in order."""
        started = [self._new(name, config) for name, config in specs.items()]
        for gw in started:
            await gw.ready()
        return started

    def start_sync(self, name: str, **config: Any) -> GatewayProcess:
        return self._new(name, config).ready_sync()

    async def aclose(self) -> None:
        async with trio.open_nursery() as nursery:
            for gw in self.gateways:
                nursery.start_soon(gw.astop)
        self._check_logs()

    def close(self) -> None:
        for gw in self.gateways:
            gw.stop()
        self._check_logs()

    def _check_logs(self) -> None:
        """A gateway that logged a traceback hid a crash from its client: fail loudly."""
        for gw in self.gateways:
            log = gw.log()
            if "Traceback" in log:
                raise AssertionError(f"gateway {gw.name} logged a traceback:\n{log}")


async def sigterm_mid_stream(proc: trio.Process, url: str, up: Any) -> tuple[int, Reply]:
    """A streamed chat request to ``url`` (``unix:/path``), then SIGTERM to ``proc`` (a
    ``sluice serve``) once the fake upstream ``up`` has it: the exit code and the client's
    reply, which a drain lets finish."""
    replies: list[Reply] = []

    async def stream() -> None:
        replies.append(await request(url, "POST", "/v1/chat/completions",
                                     chat_body(stream=True)))

    async with trio.open_nursery() as inner:
        inner.start_soon(stream)
        with trio.fail_after(5):
            while not up.requests_to("/v1/chat/completions"):
                await trio.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
    with trio.fail_after(15):
        code = await proc.wait()
    return code, replies[0]


async def reap(proc: trio.Process) -> None:
    """Kill ``proc`` if it still runs and wait for it, even while the test is being
    cancelled: a process left to the garbage collector warns in whichever test runs next."""
    with trio.CancelScope(shield=True), trio.fail_after(10):
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
