"""Which compute backends the installed llama.cpp wheel has (SPEC §11.1): ``cpu``, ``cuda``,
``metal``, ``vulkan``, ..., shown by ``sluice status``, ``GET /api/v1/models/local``
(``llamaBackends``) and the console.

Importing ``xllamacpp`` loads llama.cpp (and, in a GPU build, the GPU's driver), which a
gateway should not hold for a question asked once: a child process answers it
(``python -m proxy.models.launcher --backends``), asked the first time somebody wants to
know and remembered for the gateway's life. The ask runs in a task of the gateway's
nursery (:meth:`LlamaBackends.run`, a step of its start order; the child waited for in a
worker thread), so a request that goes away does not cancel it for the others; nothing is
run when llama.cpp is not installed (None). Whatever fails (the child,
its answer, :data:`ASK_TIMEOUT`) is logged and answers None too: it is not asked again.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Sequence

import trio

from proxy.tasks import TaskHolder

log = logging.getLogger("sluice.models")

ASK_TIMEOUT = 30.0  # seconds the child may take (a GPU driver's start can be slow)
COMMAND = (sys.executable, "-m", "proxy.models.launcher", "--backends")


def parse_answer(text: str) -> list[str] | None:
    """The child's JSON line: a list of names, or null. Raises ValueError otherwise."""
    value = json.loads(text)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"not a list of names: {text[:200]!r}")
    return value


class LlamaBackends:
    """The answer, asked once (:meth:`ask`) and then :attr:`known`."""

    def __init__(self, command: Sequence[str] = COMMAND, installed: bool | None = None,
                 timeout: float = ASK_TIMEOUT) -> None:
        self.command = tuple(command)
        self._installed = installed  # None: look (find_spec) when first asked
        self.timeout = timeout
        self.backends: list[str] | None = None
        self.known = False
        self._done: trio.Event | None = None  # made by the first ask; set once answered
        self._tasks = TaskHolder()  # where the question runs while run() runs

    def __repr__(self) -> str:
        return f"LlamaBackends({self.backends if self.known else 'not asked'})"

    @classmethod
    def answered(cls, backends: list[str] | None) -> LlamaBackends:
        """One that knows already (asked by somebody else: the tests ask once for all
        their gateways)."""
        llama = cls(installed=backends is not None)
        llama.backends = backends
        llama.known = True
        return llama

    def installed(self) -> bool:
        if self._installed is None:
            from proxy.models.launcher import llama_available

            self._installed = llama_available()
        return self._installed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Hold the nursery the question runs in (a step of the gateway's start order), so
        a caller that leaves does not cancel it for the others."""
        await self._tasks.run(task_status=task_status)

    async def ask(self) -> list[str] | None:
        """The backends, asking the child the first time (later callers wait for that
        answer); None when llama.cpp is not installed or the answer could not be had.
        While :meth:`run` runs, the question is a task of its nursery; without it (a
        LlamaBackends of its own), the first caller asks in its own time, and if it is
        cancelled nothing is learnt: the next caller asks again."""
        while not self.known:
            if self._done is None:
                if not self.installed():
                    self.known = True
                    break
                self._done = trio.Event()
                nursery = self._tasks.nursery
                if nursery is None:
                    await self._ask_child()
                    continue
                nursery.start_soon(self._ask_child, name="llama-backends")
            await self._done.wait()
        return self.backends

    async def _ask_child(self) -> None:
        done = self._done
        assert done is not None
        backends = None
        try:
            # A worker thread and the wall clock's timeout: the child takes real time
            # whatever clock trio runs on (a test's MockClock would time it out at once).
            backends = await trio.to_thread.run_sync(self.run_child, abandon_on_cancel=True)
        except subprocess.TimeoutExpired:
            log.warning("llama.cpp did not say which backends it has within %g s",
                        self.timeout)
        except (OSError, ValueError) as exc:  # a JSONDecodeError is a ValueError
            log.warning("cannot tell which backends llama.cpp has: %s", exc)
        except BaseException:  # cancelled: nothing learnt, the next caller asks again
            self._done = None
            done.set()
            raise
        self.backends = backends
        self.known = True
        done.set()

    def run_child(self) -> list[str] | None:
        """The child's answer (blocking: run in a worker thread). Raises OSError, ValueError,
        subprocess.TimeoutExpired."""
        done = subprocess.run(self.command, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=self.timeout, check=False)
        out = done.stdout.decode("utf-8", "replace").strip().splitlines()
        if done.returncode != 0 or not out:
            last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
            raise ValueError(f"it exited with status {done.returncode}"
                             + (f": {last[0]}" if last else ""))
        return parse_answer(out[-1])
