"""The catalogue's models as specs (SPEC §11, §11.1): each ``models:`` entry and each GGUF
file under ``model_loading.dirs`` made into the :class:`~protocol.model_spec.ModelSpec` the
lifecycle runs, with its engine chosen once (:func:`~protocol.model_spec.engine_of`), its
size for the budget and why its file cannot be used, if it cannot. Blocking (the folder scan
and the GGUF headers): the gateway runs :func:`prepare` in a worker thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from protocol.catalogue import Entry
from protocol.config import Config, ModelConfig
from protocol.model_spec import ModelSpec, engine_of, slot_cap
from proxy.models.gguf_file import memory_required, read_gguf_facts
from proxy.models.scan import build

log = logging.getLogger("sluice.models")

Prepared = list[tuple[ModelSpec, Entry]]
# A file's estimate, problem and architecture by (path, size, mtime, context): a rescan reads
# the header of a new or changed file only.
Estimates = dict[tuple[str, int, int, int], tuple[int, str | None, str]]


def _estimate(path: str, context: int, cache: Estimates | None
              ) -> tuple[int, str | None, str]:
    if cache is None:
        return read_gguf_facts(path, context)
    try:
        st = os.stat(path)
    except OSError:
        return read_gguf_facts(path, context)  # says why it cannot be read
    key = (path, st.st_size, st.st_mtime_ns, context)
    known = cache.get(key)
    if known is None:
        known = cache[key] = read_gguf_facts(path, context)
    return known


def prepare(models: Sequence[ModelConfig], cfg: Config, data_dir: Path,
            cache: Estimates | None = None) -> Prepared:
    """The catalogue's models as specs: a config entry's settings, else the defaults; each
    with why its file cannot be used, if it cannot (blocking: the folder scan and the GGUF
    headers; run it in a worker thread). ``cache`` keeps the headers read for the next
    call."""
    entries, skipped = build(data_dir, models, cfg.model_loading.dirs)
    for item in skipped:
        log.warning("model file %s left out: %s", item.path, item.reason)
    by_name = {m.name: m for m in models}
    fields = {m.name: f"models[{i}]" for i, m in enumerate(models)}
    out = []
    for entry in entries:
        model = by_name.get(entry.name) or ModelConfig(name=entry.name, path=entry.path)
        keep_alive = cfg.model_loading.keep_alive if model.keep_alive is None \
            else model.keep_alive
        field = fields.get(entry.name, "")
        engine = engine_of(model)  # chosen once, here
        estimate, problem, arch = _size(model, engine.loads_file, entry.path, field, cache)
        if entry.missing:
            problem = f"parts {', '.join(map(str, entry.missing))} of {entry.parts} are missing"
        out.append((ModelSpec(
            name=entry.name, path=entry.path, estimate=estimate, keep_alive=keep_alive,
            context=model.context, parallel=model.parallel, threads=model.threads,
            preload=model.preload, problem=problem, engine=engine,
            max_concurrent=slot_cap(model),
            kind=model.kind, declared=model.memory is not None, field=field,
            apis=model.apis, architecture=arch), entry))
    return out


def _size(model: ModelConfig, loads_file: bool, path: str, field: str,
          cache: Estimates | None) -> tuple[int, str | None, str]:
    """A model's size for the budget, why its file cannot be used, and its architecture
    (from its GGUF header, "" when unread): a declared ``memory`` wins; else the GGUF's
    estimate. A command model's own server reads its file, so only its size is asked of
    it: with no ``memory`` and no readable GGUF it is required."""
    if not loads_file and model.memory is not None:
        return model.memory, None, ""
    estimate, problem, arch = (0, "path names no GGUF file", "") if not path else \
        _estimate(path, model.context, cache)
    if problem is not None and not loads_file:
        return estimate, f"{field}.memory: {memory_required(problem)}", arch
    return (estimate if model.memory is None else model.memory), problem, arch


def config_problems(prepared: Prepared) -> list[str]:
    """The problems that make a config invalid (SPEC §3: serve exits 2), not only a model
    that cannot load: a command model whose size is unknown (no ``memory``, no GGUF)."""
    return [spec.problem for spec, _ in prepared
            if not spec.engine.loads_file and not spec.declared and spec.problem is not None]
