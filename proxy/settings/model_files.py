"""The checks of a config that read the files it names (SPEC §3.1): a command model
without ``memory`` must name a readable GGUF. The reading is :mod:`proxy.models.gguf_file`,
imported only when such a model is configured, so a gateway without models does not load
it (tests/test_lazy_imports.py)."""

from __future__ import annotations

from pathlib import Path

from protocol.config import Config


def unsized(cfg: Config) -> bool:
    """Whether ``cfg`` has a command model without ``memory`` (its file must be read)."""
    return any(m.command and m.memory is None for m in cfg.models)


def check_files(cfg: Config, data_dir: Path) -> None:
    """Raise :class:`~protocol.errors.ConfigError` naming ``models[N].memory`` when a
    command model's size cannot be read (blocking: reads GGUF headers)."""
    if unsized(cfg):
        from proxy.models.gguf_file import check_model_sizes

        check_model_sizes(cfg, data_dir)
