"""Which compute backends the installed llama.cpp wheel has (SPEC §11.1): ``cpu``, ``cuda``,
``metal``, ``vulkan``, ..., shown by ``sluice status``, ``GET /api/v1/models/local``
(``llamaBackends``) and the console.

Importing ``xllamacpp`` loads llama.cpp (and, in a GPU build, the GPU's driver), which a
gateway should not hold for a question asked once: a child process answers it
(``python -m proxy.models.launcher --backends``), asked the first time somebody wants to
know and remembered for the gateway's life. The ask runs in a task of its own, so a request
that goes away does not cancel it for the others; nothing is run when llama.cpp is not
installed (None). Whatever fails (the child, its answer, :data:`ASK_TIMEOUT`) is logged and
answers None too: it is not asked again.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Sequence

import trio

log = logging.getLogger("sluice.models")

ASK_TIMEOUT = 30.0  # seconds the child may take (a GPU driver's start can be slow)
COMMAND = (sys.executable, "-m", "proxy.models.launcher", "--backends")
_ANSWERED: dict[tuple[str, ...], list[str] | None] = {}  # a command's answer, for the process


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
        self._done: trio.Event | None = None  # made by the first ask; set once answered

    def __repr__(self) -> str:
        return f"LlamaBackends({self.backends if self.known else 'not asked'})"

    @property
    def known(self) -> bool:
        return self._done is not None and self._done.is_set()

    def installed(self) -> bool:
        if self._installed is None:
            from proxy.models.launcher import llama_available

            self._installed = llama_available()
        return self._installed

    async def ask(self) -> list[str] | None:
        """The backends, asking the child the first time (later callers wait for that
        answer); None when llama.cpp is not installed or the answer could not be had. An
        answer is remembered for the process (the installed wheel does not change under
        it): a second gateway in the same process does not ask again."""
        if self._done is None:
            self._done = trio.Event()
            if self.command in _ANSWERED:
                self.backends = _ANSWERED[self.command]
                self._done.set()
            elif not self.installed():
                self._done.set()
                return None
            else:
                trio.lowlevel.spawn_system_task(self._ask_child, name="llama-backends")
        await self._done.wait()
        return self.backends

    async def _ask_child(self) -> None:
        assert self._done is not None
        try:
            with trio.fail_after(self.timeout):
                done = await trio.run_process(self.command, stdin=subprocess.DEVNULL,
                                              capture_stdout=True, capture_stderr=True,
                                              check=False)
            out = done.stdout.decode("utf-8", "replace").strip().splitlines()
            if done.returncode != 0 or not out:
                last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
                raise ValueError(f"it exited with status {done.returncode}"
                                 + (f": {last[0]}" if last else ""))
            self.backends = _ANSWERED[self.command] = parse_answer(out[-1])
        except trio.TooSlowError:
            log.warning("llama.cpp did not say which backends it has within %g s",
                        self.timeout)
        except (OSError, ValueError) as exc:  # a JSONDecodeError is a ValueError
            log.warning("cannot tell which backends llama.cpp has: %s", exc)
        finally:
            self._done.set()
