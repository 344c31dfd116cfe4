"""The ``sluice`` command line: argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from protocol.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Local-network AI API gateway (OpenAI-compatible).")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the gateway (the default)")
    serve.add_argument("--data-dir", help="data folder (default: $SLUICE_DATA_DIR, "
                       "$XDG_DATA_HOME/sluice or ~/.local/share/sluice)")
    serve.add_argument("--config", help="config file instead of <data dir>/config.yaml")
    serve.add_argument("--demo", action="store_true",
                       help="also serve the demo model smollm2-135m (downloaded on first use)")
    serve.add_argument("--log-level", default="INFO",
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    check = sub.add_parser("check-config", help="validate the config file")
    check.add_argument("--data-dir", help="data folder holding config.yaml")
    check.add_argument("--config", help="config file to check")
    status = sub.add_parser("status", help="show the running gateway's state")
    status.add_argument("--data-dir", help="data folder of the gateway")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    keys = sub.add_parser("keys", help="access keys for remote clients")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create", help="make a key (printed once)")
    create.add_argument("--name", help="a label, e.g. the client's name")
    keys_sub.add_parser("list", help="list the keys (never the keys themselves)")
    revoke = keys_sub.add_parser("revoke", help="revoke a key")
    revoke.add_argument("id", help="the key's id (see: sluice keys list)")
    for command in (create, keys_sub.choices["list"], revoke):
        command.add_argument("--data-dir", help="data folder of the gateway")
        command.add_argument("--json", action="store_true", help="print the raw JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command or "serve"
    from proxy.settings import Settings, check_config, resolve_data_dir

    data_dir = resolve_data_dir(getattr(args, "data_dir", None))
    config = getattr(args, "config", None)
    if command == "check-config":
        return check_config(Path(config) if config else data_dir / "config.yaml")
    if command == "status":
        from proxy.status import status_main

        return status_main(data_dir, args.json)
    if command == "keys":
        from proxy.status import keys_main

        return keys_main(data_dir, args.action, name=getattr(args, "name", None),
                         key_id=getattr(args, "id", None), as_json=args.json)
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings.open(data_dir, Path(config) if config else None)
    except ConfigError as exc:
        print(f"sluice: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sluice: cannot use data folder {data_dir}: {exc}", file=sys.stderr)
        return 2
    extra = []
    if getattr(args, "demo", False):
        from proxy.demo import DemoError, demo_model_config, ensure_demo_model
        from proxy.models.launcher import INSTALL_HINT

        if importlib.util.find_spec("xllamacpp") is None:
            print(f"sluice: --demo: {INSTALL_HINT}", file=sys.stderr)
            return 2
        try:
            ensure_demo_model(settings.data_dir)
        except (DemoError, OSError) as exc:
            print(f"sluice: cannot prepare the demo model: {exc}", file=sys.stderr)
            return 2
        extra.append(demo_model_config())
    from proxy.server import serve

    return serve(settings, extra)
