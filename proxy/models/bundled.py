"""The bundled llama.cpp's own steps of a start (SPEC §11): its GGUF read again (a file that
changed or went since the catalogue was made fails the load with the reason), then the
launcher (:mod:`proxy.models.launcher`) told where to listen (the model's socket in the
socket dir when its path is short enough, else a free loopback port), which prints
``listening <url>`` once it accepts connections; ready once ``/health`` answers 200
(llama.cpp answers 503 while it loads). It watches its parent itself (``--parent``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from protocol.model_spec import Bundled, ModelSpec
from proxy.models.gguf_file import read_estimate
from proxy.models.managed import LoadFailed
from proxy.models.process import Launch, until_healthy


async def plan_bundled(spec: ModelSpec, bundled: Bundled, socket_path: Path | None
                       ) -> Launch:
    """How ``spec`` starts on the bundled llama.cpp (LoadFailed: its file cannot be used)."""
    _, problem = await trio.to_thread.run_sync(read_estimate, spec.path, spec.context)
    if problem is not None:
        raise LoadFailed(problem)
    listen = os.fspath(socket_path) if socket_path is not None else "127.0.0.1:0"
    return Launch(
        [sys.executable, "-m", "proxy.models.launcher", "--model", spec.path,
         "--alias", spec.name, "--listen", listen, "--context", str(spec.context),
         "--parallel", str(spec.parallel), "--threads", str(spec.threads),
         *bundled.llama_args, "--parent", str(os.getpid())],
        until_healthy, "cannot run the bundled llama.cpp", socket_path=socket_path)
