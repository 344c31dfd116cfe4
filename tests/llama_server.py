"""The bundled llama.cpp launcher (``python -m proxy.models.launcher``) as a child process of a
test, for the e2e tests that talk to a model server the gateway does not manage."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio


@asynccontextmanager
async def llama_server(gguf: Path, alias: str, listen: str,
                       *options: str) -> AsyncIterator[tuple[str, trio.Process]]:
    """Start the launcher serving ``gguf`` as ``alias`` on ``listen`` (a ``*.sock`` path or
    ``127.0.0.1:PORT``) with more launcher ``options``; yields its URL (``unix:/path`` or
    ``http://127.0.0.1:PORT``) and the process once it listens. At the end: SIGTERM, at most
    10 s for it to exit, else SIGKILL."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "proxy.models.launcher", "--model", str(gguf), "--alias", alias,
         "--listen", listen, *options], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            line = (await proc.stdout.receive_some(4096)).decode().strip()
        assert line.startswith("listening "), line
        yield line.removeprefix("listening "), proc
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
