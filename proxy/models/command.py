"""A model server of the user's own (SPEC §11.1): ``models[].command`` run as a child process
with its placeholders filled in, under the same lifecycle as the bundled llama.cpp.

The command is never interpreted by a shell (the guard, a fixed sh script, execs it with its
arguments as they are). ``${PORT}`` is a loopback port picked here,
``${SOCKET}`` a socket path in the socket dir; sluice reaches the server over the socket if
the command names it, else over the port. The server is ready once GET ``health`` answers
200 there (vLLM answers 503 or refuses connections while it loads). Its stdout and stderr go
to ``<data dir>/logs/<name>.log``. It runs in a session of its own: ``stop_signal`` goes to
the command's own process (the entry's pid), SIGKILL after 10 s, and once it is gone
whatever is left of its process group is killed too (workers it started). It is started
through :mod:`proxy.models.guard`, which stops it should the gateway die without doing so.
"""

from __future__ import annotations

import os
import shutil
import signal
from functools import partial
from pathlib import Path

from protocol.model_command import expand, uses
from protocol.model_spec import Command, ModelSpec
from proxy.models.guard import guarded
from proxy.models.managed import LoadFailed
from proxy.models.process import Launch, free_port, until_answers


def find_program(name: str, env: dict[str, str]) -> str | None:
    """The executable a command's first argument names: a path (absolute, or relative to
    the working directory) as it is, a bare name looked up on the command's PATH."""
    return shutil.which(name, path=env.get("PATH", os.defpath))


def where_to_listen(spec: ModelSpec, command: Command, socket_path: Path | None
                    ) -> tuple[dict[str, str], str]:
    """The placeholders' values and the URL sluice reaches the server at."""
    values = {"NAME": spec.name, "MODEL": spec.path}
    url = ""
    if uses(command.argv, "SOCKET"):
        if socket_path is None:
            raise LoadFailed(f"{spec.field or spec.name}.command names ${{SOCKET}}, but this "
                             "gateway has no socket folder short enough for it (use ${PORT})")
        values["SOCKET"] = os.fspath(socket_path)
        url = f"unix:{socket_path}"
    port = free_port()
    values["PORT"] = str(port)
    return values, url or f"http://127.0.0.1:{port}"


def plan_command(spec: ModelSpec, command: Command, socket_path: Path | None) -> Launch:
    """How ``spec``'s command starts: its placeholders filled in, its program found (else
    LoadFailed saying so), run through the guard with its lifeline; ready once GET
    ``health`` answers 200 at the URL it was told to listen at."""
    values, url = where_to_listen(spec, command, socket_path)
    argv = expand(command.argv, values)
    env = {**os.environ, **dict(command.env)}
    program = find_program(argv[0], env)
    where = spec.field or spec.name
    if program is None:
        raise LoadFailed(f"{where}.command: {argv[0]!r} was not found (no such executable "
                         "file" + ("" if os.sep in argv[0] else " on PATH") + ")")
    return Launch(
        # Through the guard, which execs the program in its own place and stops it should
        # this gateway die without doing so; its stdin is the lifeline, held only here.
        guarded(command.stop_signal, [program, *argv[1:]]),
        partial(until_answers, url=url, path=command.health),
        f"{where}.command: cannot run {argv[0]!r}", env=env,
        socket_path=socket_path if "SOCKET" in values else None,  # removed at a stop
        lifeline=True, stdout_logged=True, stop_signal=signal.Signals[command.stop_signal],
        group=True, waits_at=url)

