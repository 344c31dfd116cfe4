"""``sluice serve``: open the data folder's settings, prepare the demo model if asked, then
run the gateway (:class:`proxy.server.Gateway`) until a stop signal."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from protocol.config import ModelConfig
from protocol.errors import ConfigError
from proxy import logsetup
from proxy.datadir import resolve_data_dir
from proxy.demo import DemoError, demo_model_config, ensure_demo_model
from proxy.drain import drain_timeout
from proxy.link.identity import Identity, ensure_identity
from proxy.listeners import ListenerError
from proxy.models.launcher import INSTALL_HINT, llama_available
from proxy.server import Gateway, StartupError
from proxy.settings.store import Settings

__all__ = ["serve_main"]

log = logging.getLogger("sluice.server")


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


def serve(settings: Settings, extra_models: Sequence[ModelConfig] = ()) -> int:
    """Run the gateway until a stop signal; the process exit code."""
    try:
        gateway = Gateway(settings, drain_timeout=drain_timeout(), extra_models=extra_models,
                          identity=_identity(settings), handle_signals=True)
        trio.run(gateway.run)
    except (ListenerError, StartupError) as exc:
        log.error("%s", exc)
        return 2
    return 0


def _identity(settings: Settings) -> Identity | None:
    """This gateway's identity (SPEC §16), made on the first start and whenever its files
    are missing or unusable; None (logged) when the data dir cannot hold it: the gateway
    then serves without pinned links or a node listener."""
    try:
        return ensure_identity(settings.data_dir)
    except OSError as exc:
        log.error("cannot make this gateway's identity in %s: %s; pinned links and the "
                  "node listener are off", settings.data_dir, exc.strerror or exc)
        return None
