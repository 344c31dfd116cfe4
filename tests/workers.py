"""What the test run shares across pytest-xdist's workers (``scripts/test`` runs the suite
with ``-n``; each worker is a process of its own with its own module state):

- :func:`file_lock`: an exclusive ``flock`` on a file, so one worker at a time does what
  the others must not do at once; :func:`demo_model` fetches the demo GGUF into ``.cache/``
  (or ``$SLUICE_TEST_CACHE``) under it, so two workers never write its partial file at once
  (the benchmark's smoke tests ask for it before starting a benchmark that wants it);
- :func:`once_per_run`: a JSON value computed by the first worker that asks and read from
  a file by the others (the ``llama_answer`` fixture: one child for the whole run);
- Hypothesis without its per-example deadline (the ``sluice`` profile, loaded here): a
  worker beside others may take longer than 200 ms for one example, and a test's pass
  or fail must not hang on the machine's speed;
- one core each (:func:`pin_worker`): with as many workers as cores, worker N and every
  process it starts run on core N only, so two workers' llama.cpp servers never share a
  core (llama.cpp's threads spin while they wait: two servers of two threads on two cores
  ran several times slower than one thread each), and a model given ``threads: 0`` starts
  one thread (proxy/models/launcher.py counts the cores it may use);
- the run's figures (tests/figures.py): each worker hands its raw figures to the controller
  (xdist's ``workeroutput``), which merges them (counters summed, samples pooled, peaks
  maxed) and writes ``figures.json`` once; a run without xdist writes its own.

Registered as a plugin by tests/conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.figures import Figures


def pin_worker() -> list[int] | None:
    """Pin this xdist worker (and the processes it will start) to one core of those it
    may use, worker N to the Nth core (round the cores again when there are more workers:
    ``scripts/test`` runs one more than cores, so that two share a core); the cores pinned
    to, or None (not a worker, no affinity on this system, or ``SLUICE_TEST_PIN=0``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if (not worker.startswith("gw") or not count.isdigit()
            or os.environ.get("SLUICE_TEST_PIN") == "0"
            or not hasattr(os, "sched_setaffinity")):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[int(worker[2:]) % len(cores)]
    os.sched_setaffinity(0, {core})
    return [core]


PINNED = pin_worker()

settings.register_profile("sluice", deadline=None)
settings.load_profile("sluice")

CACHE = Path(os.environ.get("SLUICE_TEST_CACHE", Path(__file__).resolve().parents[1] / ".cache"))


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing) for the ``with`` block; other
    processes that ask for it wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def demo_model() -> Path:
    """The verified demo GGUF in :data:`CACHE`, fetched by the first worker that asks."""
    from proxy.demo import ensure_demo_model

    with file_lock(CACHE / "models" / ".fetch.lock"):
        return ensure_demo_model(CACHE)


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run sees (the parent of the workers' base temp
    folders under xdist; the run's own base temp folder without it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(factory: pytest.TempPathFactory, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s JSON value, computed by the first worker that asks (the others wait
    for it, then read it)."""
    folder = shared_dir(factory)
    answer = folder / f"{name}.json"
    with file_lock(folder / f"{name}.lock"):
        if answer.exists():
            return json.loads(answer.read_text())["value"]
        value = compute()
        answer.write_text(json.dumps({"value": value}))
        return value


# ------------------------------------------------------------------------------ figures

_FIGURES = Figures()


@pytest.fixture
def figures() -> Figures:
    """The run's figures; written to figures.json when the run ends (merged across
    workers)."""
    return _FIGURES


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker finished; take in its figures."""
    raw = getattr(node, "workeroutput", {}).get("sluice_figures")
    if raw:
        _FIGURES.merge(json.loads(raw))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes
        workeroutput["sluice_figures"] = json.dumps(_FIGURES.raw())
    elif _FIGURES:
        _FIGURES.write()
