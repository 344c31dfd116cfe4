"""What a gateway imports only when first asked for it: trio-websocket and wsproto (the events
WebSocket, SPEC §9.3) with the first subscriber, prometheus_client (the process figures of
``GET /metrics``, SPEC §9.2) with the first scrape. A gateway nobody watches or scrapes does
not hold them (about 4 MB of its memory; docs/performance.md, S5). Nor does a gateway that
can have no managed model (no ``models:`` entry, no ``model_loading.dirs``) hold the
modules of models on demand (SPEC §11; docs/performance.md, S10), nor one with both
switches of `discovery:` off the modules of LAN discovery (SPEC §14), nor a gateway no
Messages or Responses request has reached the translators (SPEC §17.1). Nor does importing
protocol.lan.pake import spake2, nor importing and reading an identity cryptography. Each
looks at a fresh interpreter (a child process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.link.identity import ensure_identity
from tests.client import request
from tests.conftest import StartGateway
from tests.test_events_ws import RawFeed, subscribed

LAZY = ("trio_websocket", "wsproto", "prometheus_client", "http.server", "wsgiref")
ON_DEMAND = ("proxy.models.ondemand", "proxy.models.lifecycle", "proxy.models.managed",
             "proxy.models.servers", "proxy.models.process", "proxy.models.scan",
             "proxy.models.logs", "protocol.gguf", "protocol.catalogue")

# What both scripts below start with: the imports a gateway in a process of its own needs.
PREAMBLE = """
import sys
from pathlib import Path
import attrs, trio
from protocol.config import default_config, dump_config_yaml
from proxy.server import Gateway
from proxy.settings.store import Settings
from tests.client import request
"""

# A gateway in a process of its own, with model_loading.dirs as given and no models: entry;
# once it has answered the listing and the status, it prints which of ON_DEMAND it imported.
GATEWAY = PREAMBLE + """folder, dirs, wanted = Path(sys.argv[1]), tuple(sys.argv[2:]), {wanted!r}
cfg = default_config()
cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=0),
                   local=attrs.evolve(cfg.local, socket_dir=str(folder / "s")),
                   model_loading=attrs.evolve(cfg.model_loading, dirs=dirs))
(folder / "data").mkdir(mode=0o700)
(folder / "data" / "config.yaml").write_text(dump_config_yaml(cfg))
async def main():
    gateway = Gateway(Settings.open(folder / "data"))
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        unix = "unix:" + gateway.ctx.socket_path
        for path in ("/v1/models", "/api/v1/inference/status"):
            assert (await request(unix, "GET", path)).status == 200, path
        print(sorted(m for m in wanted if m in sys.modules))
        gateway.shutdown()
trio.run(main)
"""


def test_the_server_modules_leave_the_watchers_libraries_out() -> None:
    code = ("import sys, proxy.serve, proxy.server, proxy.api.routes, proxy.api.events, "
            f"proxy.observe.metrics; print(sorted(m for m in {LAZY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


async def test_the_first_scrape_and_the_first_subscriber_load_them(
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    metrics = gw.gateway.ctx.metrics
    assert metrics._process is None  # nothing scraped yet
    reply = await request(gw.unix, "GET", "/metrics")
    assert reply.status == 200
    assert b"\nprocess_resident_memory_bytes " in reply.body
    assert metrics._process is not None
    feed = await RawFeed.open(gw.unix)
    await subscribed(gw, 1)
    assert (await feed.frame() or {}).get("type") == "hello"
    assert "proxy.observe.event_socket" in sys.modules
    await feed.stream.aclose()


@pytest.mark.parametrize(("dirs", "imported"), [((), False), (("models",), True)],
                         ids=["no-folder", "a-folder-to-rescan"])
def test_a_gateway_that_can_have_no_managed_model_leaves_their_modules_out(
        short_tmp: Path, dirs: tuple[str, ...], imported: bool) -> None:
    code = GATEWAY.format(wanted=ON_DEMAND)
    done = subprocess.run([sys.executable, "-c", code, str(short_tmp), *dirs],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == repr(sorted(ON_DEMAND) if imported else []), done.stdout


OLLAMA = ("protocol.ollama", "protocol.ollama.stream", "protocol.ollama.requests",
          "proxy.ollama", "proxy.api.ollama")

# A gateway in a process of its own: which of OLLAMA it holds after OpenAI requests only,
# then after one Ollama listing (its relay, proxy.ollama, waits for a chat or generate).
OLLAMA_GATEWAY = PREAMBLE + """folder, wanted = Path(sys.argv[1]), {wanted!r}
cfg = default_config()
cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=0),
                   local=attrs.evolve(cfg.local, socket_dir=str(folder / "s")))
(folder / "data").mkdir(mode=0o700)
(folder / "data" / "config.yaml").write_text(dump_config_yaml(cfg))
async def main():
    gateway = Gateway(Settings.open(folder / "data"))
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        unix = "unix:" + gateway.ctx.socket_path
        assert (await request(unix, "GET", "/v1/models")).status == 200
        print(sorted(m for m in wanted if m in sys.modules))
        assert (await request(unix, "GET", "/api/version")).status == 200
        print(sorted(m for m in wanted if m in sys.modules))
        gateway.shutdown()
trio.run(main)
"""


def test_the_ollama_api_is_loaded_by_the_first_ollama_request(short_tmp: Path) -> None:
    done = subprocess.run([sys.executable, "-c", OLLAMA_GATEWAY.format(wanted=OLLAMA),
                           str(short_tmp)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    before, after = done.stdout.strip().splitlines()
    assert before == "[]"
    assert after == repr(sorted(set(OLLAMA) - {"proxy.ollama"})), after


TRANSLATE = ("protocol.translate", "protocol.translate.messages", "protocol.translate.chat",
             "proxy.translated", "proxy.translated_out")


def test_the_translators_wait_for_a_request_that_needs_them(short_tmp: Path) -> None:
    """SPEC §17.1's translators are imported by the first Messages or Responses request
    (proxy/exchange.py imports proxy/translated.py then), not at start."""
    done = subprocess.run([sys.executable, "-c", GATEWAY.format(wanted=TRANSLATE),
                           str(short_tmp)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


DISCOVERY = ("proxy.lan.discovery", "proxy.lan.discovery.service", "proxy.lan.discovery.link",
             "proxy.lan.discovery.announcer", "proxy.lan.discovery.browser", "proxy.lan.interfaces",
             "protocol.lan.dnssd", "protocol.lan.mdns", "protocol.lan.discovered")

# A gateway in a process of its own, discovery off: which of DISCOVERY it holds after a few
# requests (the discovered list, the settings); then browsing turned on live (through a
# fake link: no socket, no packet) and which it holds then.
DISCOVERY_GATEWAY = PREAMBLE + """folder, wanted = Path(sys.argv[1]), {wanted!r}
import json
cfg = default_config()
cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=0),
                   local=attrs.evolve(cfg.local, socket_dir=str(folder / "s")),
                   load_balancing=attrs.evolve(cfg.load_balancing, enabled=True))
(folder / "data").mkdir(mode=0o700)
(folder / "data" / "config.yaml").write_text(dump_config_yaml(cfg))
class NoLink:
    def interfaces(self): return []
    def join(self, interface): pass
    def leave(self, interface): pass
    async def send(self, data, interface, to=None): pass
    async def receive(self): await trio.sleep_forever()
    def close(self): pass
async def no_link():
    return NoLink()
async def main():
    gateway = Gateway(Settings.open(folder / "data"))
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        unix = "unix:" + gateway.ctx.socket_path
        for path in ("/api/v1/nodes/discovered", "/api/v1/settings/discovery"):
            assert (await request(unix, "GET", path)).status == 200, path
        print(sorted(m for m in wanted if m in sys.modules))
        gateway.discovery.open_link = no_link
        admin = [("authorization", "Bearer " + gateway.settings.secrets.admin_token)]
        reply = await request(unix, "PUT", "/api/v1/settings/discovery",
                              json.dumps({{"browse": True}}).encode(), admin)
        assert reply.status == 200, reply.body
        with trio.fail_after(5):
            while gateway.discovery.service is None:
                await trio.sleep(0.01)
        print(sorted(m for m in wanted if m in sys.modules))
        gateway.shutdown()
trio.run(main)
"""


def test_discovery_is_loaded_only_when_turned_on(short_tmp: Path) -> None:
    """Browsing is turned on in a child gateway, but no mDNS can reach this machine's real
    interfaces: its link is a fake with no socket (NoLink above), and the child is told
    SLUICE_NO_MDNS as every gateway of the suite is (tests/conftest.py), so even a real
    link would refuse to open the mDNS socket."""
    env = {**os.environ, "SLUICE_NO_MDNS": "1"}  # proxy.lan.discovery.link NO_MDNS
    done = subprocess.run([sys.executable, "-c", DISCOVERY_GATEWAY.format(wanted=DISCOVERY),
                           str(short_tmp)], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    before, after = done.stdout.strip().splitlines()
    assert before == "[]"
    assert after == repr(sorted(DISCOVERY)), after


TLS_LIBRARIES = ("cryptography", "spake2")

# A gateway in a process of its own, started as `sluice serve` starts one (its identity made
# on the first start, SPEC §16), without external access: which of TLS_LIBRARIES it holds
# once it has answered a few requests.
IDENTITY_GATEWAY = PREAMBLE + """folder, wanted = Path(sys.argv[1]), {wanted!r}
from proxy.serve import _identity
cfg = default_config()
cfg = attrs.evolve(cfg, api=attrs.evolve(cfg.api, port=0),
                   local=attrs.evolve(cfg.local, socket_dir=str(folder / "s")))
(folder / "data").mkdir(mode=0o700, exist_ok=True)
(folder / "data" / "config.yaml").write_text(dump_config_yaml(cfg))
async def main():
    settings = Settings.open(folder / "data")
    gateway = Gateway(settings, identity=_identity(settings))
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        unix = "unix:" + gateway.ctx.socket_path
        for path in ("/v1/models", "/health", "/api/v1/inference/status"):
            assert (await request(unix, "GET", path)).status == 200, path
        print(gateway.ctx.identity.fingerprint, gateway.ctx.node_port)
        print(sorted(m for m in wanted if m in sys.modules))
        gateway.shutdown()
trio.run(main)
"""


def test_cryptography_and_spake2_only_to_make_the_identity(short_tmp: Path) -> None:
    """SPEC §16: the first start makes the identity, in a short child process (issue 39:
    made in the gateway, ``cryptography`` stayed loaded for the life of the process, +11 MB
    of RSS); a later start without external access reads it with ``ssl`` alone. Neither
    start holds either library."""
    code = IDENTITY_GATEWAY.format(wanted=TLS_LIBRARIES)
    runs = [subprocess.run([sys.executable, "-c", code, str(short_tmp)], capture_output=True,
                           text=True, timeout=60, check=False) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    (pin1, port1, first), (pin2, port2, second) = (
        [*done.stdout.split()[:2], done.stdout.strip().splitlines()[1]] for done in runs)
    assert pin1 == pin2  # made once, then kept
    assert pin1.startswith("sha256:")
    assert port1 == port2 == "None"  # no external access: no node listener
    assert first == second == "[]"


def test_importing_the_module_does_not_import_spake2() -> None:
    check = "import protocol.lan.pake, sys; assert 'spake2' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True,
                   cwd=Path(__file__).resolve().parents[1])


def test_importing_and_reading_do_not_import_cryptography(tmp_path: Path) -> None:
    ensure_identity(tmp_path)
    check = ("import sys; from pathlib import Path; import proxy.link.identity as m; "
             f"assert m.load_identity(Path({str(tmp_path)!r})) is not None; "
             f"assert m.ensure_identity(Path({str(tmp_path)!r})) is not None; "
             "assert 'cryptography' not in sys.modules, 'cryptography was imported'")
    subprocess.run([sys.executable, "-c", check], check=True,
                   cwd=Path(__file__).resolve().parents[1])
