"""What the lifecycle needs of one managed model (SPEC §11): its :class:`ModelSpec`, with the
engine that runs it chosen once, from its config entry, as a value: :class:`Bundled` (the
bundled llama.cpp, through the launcher) or :class:`Command` (a server of the user's own,
§11.1). Whatever differs between the two is read from the value, never decided again from
the config (pure).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from protocol.config import ModelConfig

__all__ = ["Bundled", "Command", "Engine", "ModelSpec", "engine_of", "llama_args"]


@attrs.frozen
class Bundled:
    """The bundled llama.cpp: the launcher (:mod:`proxy.models.launcher`) runs one server,
    which says where it listens and answers ``/health``."""

    llama_args: tuple[str, ...] = ()  # a model's llama.cpp options, as launcher arguments

    name: ClassVar[str] = "bundled"  # the entry's ``engine``
    health: ClassVar[str] = "/health"
    stop_signal: ClassVar[str] = "SIGTERM"
    # The server loads the file itself from the GGUF sluice read: a file that is not a
    # usable GGUF fails the load (for a command, only its size is asked of the file).
    loads_file: ClassVar[bool] = True

    @property
    def owner(self) -> str:
        """``owned_by`` in /v1/models."""
        return "llamacpp"


@attrs.frozen
class Command:
    """A model server of the user's own (SPEC §11.1): ``argv`` with its placeholders, run
    with ``env`` added, ready once GET ``health`` answers 200, stopped by ``stop_signal``."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    health: str = "/health"
    stop_signal: str = "SIGTERM"

    name: ClassVar[str] = "command"
    loads_file: ClassVar[bool] = False

    @property
    def owner(self) -> str:
        """``owned_by`` in /v1/models: the program's name (llama-server, vllm, ...)."""
        return self.argv[0].rsplit("/", 1)[-1]


Engine = Bundled | Command


def engine_of(model: ModelConfig) -> Engine:
    """The engine of a ``models:`` entry: its ``command``, else the bundled llama.cpp."""
    if model.command:
        return Command(model.command, model.env, model.health, model.stop_signal)
    return Bundled(tuple(llama_args(model)))


def llama_args(model: ModelConfig) -> list[str]:
    """The bundled llama.cpp's options of a ``models:`` entry as launcher arguments."""
    args = []
    if model.gpu_layers is not None:
        args += ["--gpu-layers", str(model.gpu_layers)]
    if model.flash_attn is not None:
        args += ["--flash-attn", "on" if model.flash_attn else "off"]
    if model.cache_type_k is not None:
        args += ["--cache-type-k", model.cache_type_k]
    if model.cache_type_v is not None:
        args += ["--cache-type-v", model.cache_type_v]
    if model.batch is not None:
        args += ["--batch", str(model.batch)]
    if model.kind == "embedding":
        args.append("--embeddings")
    return args


def slot_cap(model: ModelConfig) -> int | None:
    """SPEC §18: the bundled llama.cpp has ``parallel`` slots (capped by
    ``max_concurrent``); a command's server has what it reports, capped the same way."""
    if model.command:
        return model.max_concurrent
    if model.max_concurrent is None:
        return model.parallel
    return min(model.parallel, model.max_concurrent)


@attrs.frozen
class ModelSpec:
    """What the lifecycle needs of a catalogue entry."""

    name: str
    path: str
    estimate: int  # bytes before it is loaded: file size + KV cache, or its declared memory
    keep_alive: float  # seconds idle before it is unloaded; inf = never
    context: int = 2048
    parallel: int = 2
    threads: int = 0
    preload: bool = False
    problem: str | None = None  # why its file cannot be loaded (a load then fails with it)
    engine: Engine = Bundled()
    max_concurrent: int | None = None  # SPEC §18: its slots' cap (slot_cap)
    kind: str = "llm"
    declared: bool = False  # estimate is its declared memory: it counts loaded or not
    field: str = ""  # its config entry (models[2]) for errors; "" for a folder's model
    apis: str = "auto"  # SPEC §17.1 (the bundled llama.cpp's auto is native)
    architecture: str = ""  # the GGUF's general.architecture ("" when unread)
