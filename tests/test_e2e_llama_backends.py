"""The installed llama.cpp's compute backends (SPEC §11.1) asked once of a child process
(proxy/models/llama_backends.py; ``python -m proxy.models.launcher --backends``) and shown
by ``GET /api/v1/models/local``, ``GET /api/v1/inference/status`` and the events feed's
hello. The parsing and the status line: tests/test_llama_backends.py."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import trio

from proxy.cli.render import show
from proxy.models.llama_backends import LlamaBackends
from proxy.server import Gateway
from tests.client import request
from tests.conftest import RunningGateway, gateway_config, open_settings
from tests.test_llama_backends import _printing


async def test_asked_once_for_all(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    llama = LlamaBackends(_printing('["cuda", "cpu"]', count), installed=True)
    assert not llama.known
    assert llama.backends is None
    answers = []

    async def ask() -> None:
        answers.append(await llama.ask())

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask)
    assert answers == [["cuda", "cpu"]] * 3
    assert await llama.ask() == ["cuda", "cpu"]
    assert llama.known
    assert count.read_text() == "x\n"  # one child for all of them


async def test_a_caller_that_leaves_does_not_cancel_the_question(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """In a gateway the question is a task of the gateway's nursery (LlamaBackends.run)."""
    count = tmp_path / "runs"
    code = (f"import time; open({str(count)!r}, 'a').write('x\\n'); time.sleep(0.3); "
            "print('[\"cpu\"]')")
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    await nursery.start(llama.run)
    with trio.move_on_after(0.05):
        await llama.ask()
    assert not llama.known
    assert await llama.ask() == ["cpu"]
    assert count.read_text() == "x\n"  # the first caller's question, answered to the next


async def test_without_a_nursery_a_cancelled_question_is_asked_again(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    code = (f"import time; open({str(count)!r}, 'a').write('x\\n'); time.sleep(0.3); "
            "print('[\"cpu\"]')")
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    with trio.move_on_after(0.05):
        await llama.ask()
    assert not llama.known
    assert await llama.ask() == ["cpu"]
    assert count.read_text() == "x\nx\n"


async def test_a_failing_child_is_logged_and_answers_null(
        caplog: pytest.LogCaptureFixture) -> None:
    code = "import sys; print('no GPU driver here', file=sys.stderr); sys.exit(4)"
    llama = LlamaBackends([sys.executable, "-c", code], installed=True)
    with caplog.at_level(logging.WARNING, "sluice.models"):
        assert await llama.ask() is None
    assert "exited with status 4: no GPU driver here" in caplog.text
    bad = LlamaBackends(_printing("cpu"), installed=True)
    assert await bad.ask() is None
    slow = LlamaBackends([sys.executable, "-c", "import time; time.sleep(30)"],
                         installed=True, timeout=0.2)
    with caplog.at_level(logging.WARNING, "sluice.models"):
        assert await slow.ask() is None
    assert "within 0.2 s" in caplog.text


async def own_gateway(nursery: trio.Nursery, folder: Path) -> RunningGateway:
    """A gateway that asks for itself (start_gateway's are told the run's answer)."""
    gateway = Gateway(open_settings(folder / "data", gateway_config([], socket_dir=folder / "s")))
    await nursery.start(gateway.run)
    return RunningGateway(gateway)


async def test_the_api_and_the_status_show_them(nursery: trio.Nursery, short_tmp: Path,
                                                 llama_answer: list[str] | None) -> None:
    """The real question (a child of this gateway), asked by the first of the answers."""
    gw = await own_gateway(nursery, short_tmp)
    assert not gw.gateway.ctx.llama.known
    local = (await request(gw.unix, "GET", "/api/v1/models/local")).json()
    assert gw.gateway.ctx.llama.known
    status = (await request(gw.unix, "GET", "/api/v1/inference/status")).json()
    expected = llama_answer  # the same child, asked by the tests' conftest
    if importlib.util.find_spec("xllamacpp") is None:
        assert expected is None
    else:
        assert "cpu" in expected
    assert local["llamaBackends"] == status["llamaBackends"] == expected
    line = [x for x in show(status).splitlines() if x.startswith("llama.cpp: ")]
    assert line == [f"llama.cpp: {', '.join(expected)}" if expected else
                    "llama.cpp: not installed (or it cannot tell its backends: see the "
                    "gateway's log)"]


async def test_the_events_hello_has_them(nursery: trio.Nursery, short_tmp: Path) -> None:
    """The console's first frame: its status, asked first."""
    from tests.test_events_ws import RawFeed

    gw = await own_gateway(nursery, short_tmp)
    assert not gw.gateway.ctx.llama.known
    feed = await RawFeed.open(gw.unix)
    hello = await feed.frame()
    await feed.stream.aclose()
    assert hello is not None
    assert hello["type"] == "hello"
    expected = gw.gateway.ctx.llama.backends
    assert gw.gateway.ctx.llama.known
    assert hello["data"]["status"]["llamaBackends"] == expected

