"""The test tiers (see tests/conftest.py's docstring): the markers a file's name gives, and
the quick tier's guard: a test there that starts a child process fails, naming itself."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


def tier_of(stem: str) -> list[str]:
    """The tier markers a test file's name (without ``.py``) gives (tests/conftest.py's
    docstring)."""
    marks = []
    if stem.startswith("test_e2e_"):
        marks.append("e2e")
    if stem.endswith("_lan"):
        marks.append("lan")
    if stem.startswith("test_ui_"):
        marks.append("ui")
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test with its file's tiers, and runs the files of real processes,
    namespaces and browsers first (a stable sort: files keep their order within a tier):
    pytest-xdist hands out files in this order, so the long ones start at once and the
    many short in-process files fill the workers' ends instead of one browser file
    running alone last."""
    for item in items:
        for mark in tier_of(item.path.stem):
            item.add_marker(mark)
    items.sort(key=lambda item: not tier_of(item.path.stem))


_SPAWN_ALLOWED = 0  # > 0 while a fixture runs a child on purpose (spawn_allowed)


@contextlib.contextmanager
def spawn_allowed() -> Iterator[None]:
    """Let a child process start inside the quick tier (the run's one llama.cpp question)."""
    global _SPAWN_ALLOWED
    _SPAWN_ALLOWED += 1
    try:
        yield
    finally:
        _SPAWN_ALLOWED -= 1


@pytest.fixture(scope="session", autouse=True)
def _interfaces_listed() -> None:
    """The interface listing (proxy/lan/interfaces.py) finds libc once per process with
    ctypes.util.find_library, which runs ``ldconfig -p``: done here, before any test."""
    from proxy.lan.interfaces import list_interfaces

    with spawn_allowed():
        list_interfaces()


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_process(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the quick tier (no tier marker) that starts a child process (subprocess,
    trio.run_process, open_process: all go through ``subprocess.Popen``) fails at once,
    naming it: such a test belongs in a ``test_e2e_*.py`` file."""
    if tier_of(request.path.stem):
        return
    real = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any) -> None:
        if not _SPAWN_ALLOWED:
            raise AssertionError(
                f"{request.node.nodeid} starts a child process ({args!r}): the quick tier "
                "starts none; move the test to a tests/test_e2e_*.py file")
        real(self, args, *rest)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
