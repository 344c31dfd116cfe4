"""``sluice keys create|list|update|revoke`` (SPEC §1, §13): access keys and their limits,
through the running gateway's admin API (``/api/v1/access-keys``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from protocol.errors import ConfigError
from protocol.key_limits import expiry_from_cli
from proxy.cli.admin import CliError, call
from proxy.cli.render import show_keys

__all__ = ["keys_main", "limits_body"]

KEYS = "/api/v1/access-keys"


def _models(text: str) -> list[str]:
    """``--models a,qwen*``: the names, blanks dropped (the gateway checks each one)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def limits_body(args: argparse.Namespace, now: float) -> dict[str, Any]:
    """The POST or PATCH body of ``create`` / ``update``: only what was given; the
    ``--all-models``, ``--no-rpm`` and ``--no-expiry`` switches as nulls (no limit).
    Raises ConfigError for an ``--expires`` that is neither a duration nor a date."""
    body: dict[str, Any] = {}
    if getattr(args, "name", None) is not None:
        body["name"] = args.name
    if getattr(args, "models", None) is not None:
        body["models"] = _models(args.models)
    elif getattr(args, "all_models", False):
        body["models"] = None
    if getattr(args, "rpm", None) is not None:
        body["rpm"] = args.rpm
    elif getattr(args, "no_rpm", False):
        body["rpm"] = None
    if getattr(args, "priority", None) is not None:
        body["priority"] = args.priority
    if getattr(args, "expires", None) is not None:
        body["expiresAt"] = expiry_from_cli(args.expires, now)
    elif getattr(args, "no_expiry", False):
        body["expiresAt"] = None
    return body


def _limits_line(key: dict[str, Any]) -> str:
    models = key.get("models")
    rpm = key.get("rpm")
    parts = [f"models {', '.join(models) if models else 'all'}",
             f"{rpm} requests a minute" if rpm else "no rate limit",
             f"expires {key['expiresAt']}" if key.get("expiresAt") else "never expires"]
    if key.get("priority") == "batch":
        parts.append("batch priority")
    return "; ".join(parts)


Lines = list[tuple[bool, str]]  # (for stderr, text): what to print, in order


def _run(data_dir: Path, args: argparse.Namespace) -> tuple[Any, Lines]:
    """One action: its JSON answer and the lines to print (the key alone on stdout)."""
    action = args.action
    if action == "list":
        keys = call(data_dir, "GET", KEYS, admin=True)
        return keys, [(False, show_keys(keys))]
    if action == "create":
        made = call(data_dir, "POST", KEYS, limits_body(args, time.time()), admin=True)
        label = f" ({made['name']})" if made.get("name") else ""
        return made, [(True, f"created access key {made['id']}{label}: {_limits_line(made)}"),
                      (False, made["key"]),
                      (True, "this key is shown only once: store it now")]
    path = f"{KEYS}/{quote(args.id, safe='')}"
    if action == "update":
        body = limits_body(args, time.time())
        if not body:
            raise CliError("nothing to change: give --name, --models, --all-models, --rpm, "
                           "--no-rpm, --expires, --no-expiry or --priority")
        changed = call(data_dir, "PATCH", path, body, admin=True)
        return changed, [(False, f"access key {args.id}: {_limits_line(changed)}")]
    done = call(data_dir, "DELETE", path, admin=True)
    return done, [(False, f"revoked access key {args.id}")]


def keys_main(data_dir: Path, args: argparse.Namespace) -> int:
    """``sluice keys create|list|update|revoke``: 0, 1 when the gateway refuses or cannot
    be reached, 2 for an ``--expires`` that cannot be read."""
    try:
        doc, lines = _run(data_dir, args)
    except ConfigError as exc:
        print(f"sluice: {exc.message}", file=sys.stderr)
        return 2
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for to_stderr, text in lines:
        print(text, file=sys.stderr if to_stderr else sys.stdout)
    return 0
