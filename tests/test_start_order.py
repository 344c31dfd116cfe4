"""The gateway's start order (proxy/server.py START_ORDER; its Step and Kind in
proxy/start_steps.py): the table Gateway.run walks."""

from __future__ import annotations

from proxy.server import START_ORDER
from proxy.start_steps import Kind


def test_the_start_order() -> None:
    names = [step.name for step in START_ORDER]
    assert len(set(names)) == len(names)
    assert names[0] == "listeners"  # a second gateway fails before it touches anything
    assert names[-1] == "accept loops"  # a connection finds every part running
    kinds = [step.kind for step in START_ORDER]
    # Setup steps run before the background nursery opens: they all come first.
    setup = kinds.count(Kind.SETUP)
    assert kinds[:setup] == [Kind.SETUP] * setup
    assert kinds.count(Kind.SERVE) == 1
    assert names.index("context") < names.index("config watcher")
    assert names.index("backend health checks") < names.index("discovery")
