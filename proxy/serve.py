"""``sluice serve``: open the data folder's settings, prepare the demo model if asked, then
run the gateway (:func:`proxy.server.serve`) until a stop signal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from protocol.config import ModelConfig
from protocol.errors import ConfigError
from proxy import logsetup
from proxy.datadir import resolve_data_dir
from proxy.demo import DemoError, demo_model_config, ensure_demo_model
from proxy.models.launcher import INSTALL_HINT, llama_available
from proxy.server import serve
from proxy.settings.store import Settings

__all__ = ["serve_main"]


def serve_main(args: argparse.Namespace) -> int:
    """Run the gateway; the process exit code (2: it cannot start, the reason on stderr)."""
    data_dir = resolve_data_dir(getattr(args, "data_dir", None))
    config = getattr(args, "config", None)
    logsetup.configure(getattr(args, "log_level", "INFO"))
    try:
        settings = Settings.open(data_dir, Path(config) if config else None)
    except ConfigError as exc:
        print(f"sluice: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sluice: cannot use data folder {data_dir}: {exc}", file=sys.stderr)
        return 2
    extra: list[ModelConfig] = []
    if getattr(args, "demo", False):
        if not llama_available():
            print(f"sluice: --demo: {INSTALL_HINT}", file=sys.stderr)
            return 2
        try:
            ensure_demo_model(settings.data_dir)
        except (DemoError, OSError) as exc:
            print(f"sluice: cannot prepare the demo model: {exc}", file=sys.stderr)
            return 2
        extra.append(demo_model_config())
    return serve(settings, extra)
