"""``ollama_api.port`` (SPEC §12): a loopback-only listener that answers the Ollama API (and
the rest of the gateway's, as the local fallback does); a port already taken is a
notification and the gateway runs on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from protocol.config import OllamaApiConfig
from proxy.server import Gateway
from tests.client import request
from tests.conftest import gateway_config, open_settings
from tests.fakeupstream import FakeUpstream, json_completion


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start(nursery: trio.Nursery, folder: Path, port: int,
                upstream: FakeUpstream | None = None) -> Gateway:
    backends = [("llama", upstream.url)] if upstream is not None else []
    cfg = gateway_config(backends, socket_dir=folder / "s")
    cfg = attrs.evolve(cfg, ollama_api=OllamaApiConfig(port=port))
    gateway = Gateway(open_settings(folder / "data", cfg))
    await nursery.start(gateway.run)
    await gateway.backends.ready.wait()
    return gateway


async def test_the_ollama_listener_answers_on_loopback(nursery: trio.Nursery, short_tmp: Path,
                                                       upstream: FakeUpstream) -> None:
    upstream.on("POST", "/v1/chat/completions", json_completion("hello"))
    port = free_port()
    gateway = await start(nursery, short_tmp, port, upstream)
    address = f"127.0.0.1:{port}"
    assert (await request(address, "GET", "/api/version")).status == 200
    tags = (await request(address, "GET", "/api/tags")).json()
    assert [m["name"] for m in tags["models"]] == ["fake-model"]
    chat = await request(address, "POST", "/api/chat",
                         b'{"model": "fake-model", "stream": false, "messages": '
                         b'[{"role": "user", "content": "hi"}]}')
    assert chat.json()["message"]["content"] == "hello"
    # Bound to 127.0.0.1 alone, never a wildcard address: another loopback address of this
    # machine is refused.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
    assert gateway.notifications.all() == []


async def test_a_port_in_use_is_a_notification(nursery: trio.Nursery, short_tmp: Path,
                                               taken: int) -> None:
    gateway = await start(nursery, short_tmp, taken)
    codes = [n["code"] for n in gateway.notifications.all()]
    assert codes == ["ollama_port_unavailable"]
    assert str(taken) in gateway.notifications.all()[0]["message"]
    assert (await request(f"unix:{gateway.ctx.socket_path}", "GET", "/health")).status == 200
