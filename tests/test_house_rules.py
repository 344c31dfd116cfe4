"""The claims of ARCHITECTURE.md that a program can check, read from the source's syntax
trees (no module is imported): if one fails, either the code broke a rule of the house or
the map must say what is true now.

- ``protocol/`` imports neither ``proxy`` nor trio (it does no I/O; shape-check has the
  list of I/O modules).
- Durations come from trio's clock: the wall clock and the process clocks (``time.time``,
  ``time.monotonic``, ``time.perf_counter``, ``datetime.now`` ...) are read only where
  :data:`WALL_CLOCK_READERS` says why.
- No fire-and-forget tasks: nothing calls ``trio.lowlevel.spawn_system_task``; a task
  started later goes to a nursery its owner holds (:mod:`proxy.tasks`).
- Nothing imports back up into ``proxy/api/`` but the gateway (``server.py``) and the
  request's exchange (the route table).
- The CLI shares no code with the server: no ``proxy/cli`` module imports ``proxy.server``
  (shape-check follows the whole closure), and only the live views load trio.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module (relative path) -> why it may read a clock other than trio's
WALL_CLOCK_READERS = {
    "proxy/timestamps.py": "the one wall clock of the server (timestamps, expiry)",
    "proxy/logsetup.py": "the log buffer's flush timer: logging runs in any thread",
    "proxy/link/identity_make.py": "a certificate's validity dates (a child process)",
    "proxy/cli/keys.py": "the CLI: a key's expiry from now (no trio there)",
    "proxy/cli/pair.py": "the CLI: a code's remaining time (no trio there)",
    "proxy/cli/models.py": "the CLI: how long ago a model was used (no trio there)",
}
CLOCKS = {("time", "time"), ("time", "time_ns"), ("time", "monotonic"),
          ("time", "monotonic_ns"), ("time", "perf_counter"), ("time", "perf_counter_ns"),
          ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today")}
API_IMPORTERS = {"proxy/server.py", "proxy/exchange.py"}
CLI_TRIO = {"proxy/cli/feed.py", "proxy/cli/live.py", "proxy/cli/lines.py",
            "proxy/cli/view.py"}


@functools.cache
def parsed(folder: str) -> tuple[tuple[str, ast.Module], ...]:
    return tuple((str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path)))
                 for path in sorted((ROOT / folder).rglob("*.py")))


def sources(folder: str) -> Iterator[tuple[str, ast.Module]]:
    if folder.startswith("proxy/"):  # a part of proxy/: from proxy's trees
        yield from ((path, tree) for path, tree in parsed("proxy")
                    if path.startswith(folder + "/"))
    else:
        yield from parsed(folder)


def imported(tree: ast.Module) -> set[str]:
    """Every module a file imports, anywhere in it (a lazy import counts too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def clock_reads(tree: ast.Module) -> list[str]:
    """``time.time()``-like calls, and such functions imported by name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id
            if (owner, node.attr) in CLOCKS:
                found.append(f"{owner}.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            found += [f"from {node.module} import {a.name} (line {node.lineno})"
                      for a in node.names if (node.module, a.name) in CLOCKS]
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_protocol_imports_neither_proxy_nor_trio() -> None:
    bad = {path: sorted(n for n in imported(tree) if within(n, "proxy") or within(n, "trio"))
           for path, tree in sources("protocol")}
    assert {path: names for path, names in bad.items() if names} == {}


def test_durations_come_from_trios_clock() -> None:
    reads = {path: clock_reads(tree) for path, tree in sources("proxy")}
    assert {path: found for path, found in reads.items()
            if found and path not in WALL_CLOCK_READERS} == {}
    # and every reader listed still reads one (the list stays true)
    assert sorted(path for path in WALL_CLOCK_READERS if not reads.get(path)) == []


def test_no_fire_and_forget_tasks() -> None:
    spawns = [path for folder in ("proxy", "protocol") for path, tree in sources(folder)
              if any(isinstance(node, ast.Attribute) and node.attr == "spawn_system_task"
                     for node in ast.walk(tree))]
    assert spawns == []


def test_nothing_imports_back_up_into_the_api() -> None:
    importers = {path for path, tree in sources("proxy")
                 if not path.startswith("proxy/api/")
                 and any(within(name, "proxy.api") for name in imported(tree))}
    assert importers <= API_IMPORTERS, importers - API_IMPORTERS


def test_the_cli_loads_trio_only_for_its_live_views() -> None:
    loaders = {path for path, tree in sources("proxy/cli")
               if any(within(name, "trio") for name in imported(tree))}
    assert loaders <= CLI_TRIO, loaders - CLI_TRIO
    assert not [path for path, tree in sources("proxy/cli")
                if any(within(name, "proxy.server") for name in imported(tree))]
