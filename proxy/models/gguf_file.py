"""A GGUF file's size for the memory budget (SPEC §11), read from its header, and the
config checks that need it (SPEC §3.1, §11.1: a command model whose size cannot be told).

Blocking file reads: the gateway runs them in a worker thread. No trio here, so
``sluice check-config`` can use them without loading the server's modules.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import cast

from protocol.config import Config
from protocol.errors import ConfigError
from protocol.gguf import GgufError, kv_cache_bytes, parse_gguf_header
from proxy.models.scan import model_path

HEADER_READS = (2 << 20, 64 << 20)  # bytes of a GGUF read for its header: first, at most


def read_estimate(path: str, context: int) -> tuple[int, str | None]:
    """A model's memory before it is loaded: file size + KV cache for ``context`` tokens,
    and the reason when the file cannot be used (blocking: run in a worker thread)."""
    estimate, problem, _ = read_gguf_facts(path, context)
    return estimate, problem


def read_gguf_facts(path: str, context: int) -> tuple[int, str | None, str]:
    """:func:`read_estimate`'s two answers and the GGUF's ``general.architecture`` ("" when
    it cannot be read): the Ollama API names the context after it (SPEC §17.2)."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as file:
            for cap in HEADER_READS:
                want = min(cap, size)
                # Read into an anonymous mapping, unmapped once parsed: a bytes object this
                # large, once freed, would stay resident in the heap (glibc raises its mmap
                # threshold to the size of the first big block freed; docs/performance.md,
                # S10). Its slices are bytes, all the parser takes of it.
                with mmap.mmap(-1, max(want, 1)) as buf:
                    file.seek(0)
                    got = file.readinto(buf)
                    head = buf if got == want > 0 else buf[:got]
                    try:
                        info = parse_gguf_header(cast(bytes, head), size)
                        return size + kv_cache_bytes(info, context), None, info.architecture
                    except GgufError as exc:
                        if not exc.truncated or cap == HEADER_READS[-1]:
                            return size, f"{path}: {exc}", ""
    except OSError as exc:
        return 0, f"cannot read {path}: {exc.strerror or exc}", ""
    return size, None, ""  # pragma: no cover (the loop always returns)



def memory_required(problem: str) -> str:
    """Why a command model needs ``memory``: sluice cannot read its size (``problem``)."""
    return (f"required: sluice cannot tell the size of this model ({problem}); give its "
            f"size, e.g. memory: 6GiB")


def check_model_sizes(cfg: Config, data_dir: Path) -> None:
    """SPEC §3.1: ``models[N].memory`` is required where the model's size cannot be read —
    a command model (§11.1) with no ``memory`` whose ``path`` is not a readable GGUF.
    Raises :class:`ConfigError` naming the field (blocking: reads GGUF headers)."""
    for i, model in enumerate(cfg.models):
        if not model.command or model.memory is not None:
            continue
        problem = "path names no GGUF file" if not model.path else \
            read_estimate(model_path(data_dir, model.path), model.context)[1]
        if problem is not None:
            raise ConfigError(f"models[{i}].memory", memory_required(problem))
