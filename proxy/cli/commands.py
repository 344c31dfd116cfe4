"""The CLI's commands: ``status``, ``keys`` (:mod:`proxy.cli.keys`), ``nodes``, ``pair``
(:mod:`proxy.cli.pair`),
``ps``/``load``/``unload`` (:mod:`proxy.cli.models`), ``config history|restore``
(:mod:`proxy.cli.config_history`), ``console`` (through the running gateway's admin API;
``console`` in :mod:`proxy.cli.console`), ``check-config`` (the file alone), and ``events``
and ``status --watch`` (the live feed: :mod:`proxy.cli.live`, loaded only for them). Each
returns the process exit code: 0, 1 when the gateway cannot be used (the reason on stderr),
2 for an invalid config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from protocol.config import parse_config_text
from protocol.errors import ConfigError
from proxy.cli.admin import TIMEOUT, CliError, call, fetch_status
from proxy.cli.config_history import config_main
from proxy.cli.keys import keys_main
from proxy.cli.models import load_main, ps_main
from proxy.cli.pair import pair_main
from proxy.cli.render import show, show_nodes
from proxy.datadir import CONFIG_FILE, resolve_data_dir
from proxy.files import read_text
from proxy.settings.model_files import check_files

__all__ = ["check_config", "nodes_main", "run", "status_main"]

PAIRING_TIMEOUT = 20.0  # seconds: the gateway asks the other computer (10 s at most) first


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names (every one but ``serve``)."""
    data_dir = resolve_data_dir(getattr(args, "data_dir", None))
    if args.command == "check-config":
        return check_config(Path(args.config) if args.config else data_dir / CONFIG_FILE,
                            data_dir)
    if args.command == "status" and args.watch:
        from proxy.cli.live import watch_main  # trio and trio-websocket: only when watching

        return watch_main(data_dir, as_json=args.json)
    if args.command == "status":
        return status_main(data_dir, args.json)
    if args.command == "events":
        from proxy.cli.live import events_main

        return events_main(data_dir, as_json=args.json, types=args.types)
    if args.command == "console":
        from proxy.cli.console import console_main

        return console_main(data_dir, open_browser=not args.no_open)
    if args.command == "keys":
        return keys_main(data_dir, args)
    if args.command == "nodes":
        return nodes_main(data_dir, args)
    if args.command == "pair":
        return pair_main(data_dir, wait=args.wait, as_json=args.json)
    if args.command == "config":
        return config_main(data_dir, args.action, getattr(args, "id", None), args.json)
    if args.command == "ps":
        return ps_main(data_dir, args.json)
    if args.command in ("load", "unload"):
        return load_main(data_dir, args.command, args.name, args.json)
    if args.command == "service":
        from proxy.cli.service import service_main

        return service_main(args, data_dir)
    raise ValueError(f"not a CLI command: {args.command!r}")


def check_config(config_path: Path, data_dir: Path | None = None) -> int:
    """``sluice check-config``: print ``ok: <path>`` and return 0, or the error and 2. The
    checks are serve's (SPEC §3.1), those that read the model files it names too (relative
    paths from ``data_dir``, by default the config file's folder)."""
    try:
        text = read_text(Path(config_path))  # its errors already name the file
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    try:
        check_files(parse_config_text(text),
                    Path(config_path).parent if data_dir is None else data_dir)
    except ConfigError as exc:
        print(f"error: {config_path}: {exc.message}", file=sys.stderr)
        return 2
    print(f"ok: {config_path}")
    return 0


def status_main(data_dir: Path, as_json: bool) -> int:
    """``sluice status [--json]``."""
    try:
        status = fetch_status(data_dir)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else show(status))
    return 0


def _read_key(args: argparse.Namespace) -> str | None:
    """A node key from --api-key-file or --api-key-stdin (never from the command line, where
    ``ps`` would show it); surrounding whitespace and the final newline are dropped."""
    if args.api_key_file:
        try:
            text = Path(args.api_key_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the API key file {args.api_key_file}: "
                           f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}") from None
    elif args.api_key_stdin:
        text = sys.stdin.read()
    else:
        return None
    key = text.strip()
    if not key:
        raise CliError("the API key is empty")
    return key


def _nodes_action(data_dir: Path, args: argparse.Namespace) -> tuple[Any, str]:
    """Run one ``sluice nodes`` action; its JSON answer and the line to print."""
    action = args.action
    if action == "list":
        nodes = call(data_dir, "GET", "/api/v1/nodes", admin=True)
        return nodes, show_nodes(nodes)
    if action == "add":
        body: dict[str, Any] = {"baseUrl": args.url}
        key = _read_key(args)
        if key is not None:
            body["apiKey"] = key
        if args.code is not None:
            body["pairingCode"] = args.code
        if args.name:
            body["name"] = args.name
        if args.weight is not None:
            body["weight"] = args.weight
        known = set() if args.code is None else {
            n["fingerprint"] for n in call(data_dir, "GET", "/api/v1/nodes", admin=True)}
        node = call(data_dir, "POST", "/api/v1/nodes", body, admin=True,
                    timeout=PAIRING_TIMEOUT if args.code is not None else TIMEOUT)
        paired = " with the access key it gave for the code" if args.code is not None else ""
        if node.get("link") == "pinned":  # SPEC §16
            paired = (f", its certificate {node['pin']} pinned, with the access key it made "
                      "for this computer")
        if node["fingerprint"] in known:
            return node, (f"paired again with node {node['fingerprint']} ({node['name']}, "
                          f"{node['baseUrl']}){paired}")
        return node, (f"added node {node['fingerprint']} ({node['name']}, {node['baseUrl']})"
                      f"{paired}, last in the order")
    if action == "order":
        current = [n["fingerprint"] for n in call(data_dir, "GET", "/api/v1/nodes", admin=True)]
        first = list(args.fingerprints)
        order = first + [fp for fp in current if fp not in first]
        nodes = call(data_dir, "PUT", "/api/v1/nodes/order", {"order": order}, admin=True)
        return nodes, show_nodes(nodes)
    path = f"/api/v1/nodes/{quote(args.fingerprint, safe='')}"
    if action == "remove":
        done = call(data_dir, "DELETE", path, admin=True)
        return done, f"removed node {args.fingerprint}"
    if action == "weight":
        node = call(data_dir, "PATCH", path, {"weight": args.weight}, admin=True)
        return node, f"node {args.fingerprint}: weight {node['weight']}"
    enabled = action == "enable"
    node = call(data_dir, "PATCH", path, {"enabled": enabled}, admin=True)
    return node, f"node {args.fingerprint}: routing {'on' if enabled else 'off'}"


def nodes_main(data_dir: Path, args: argparse.Namespace) -> int:
    """``sluice nodes list|add|remove|order|enable|disable|weight``."""
    try:
        doc, text = _nodes_action(data_dir, args)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else text)
    return 0
