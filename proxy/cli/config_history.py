"""``sluice config history`` and ``sluice config restore ID`` (SPEC §13): the versions of
config.yaml that changes replaced, through the running gateway's
``/api/v1/settings/history``."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from proxy.cli.admin import CliError, call
from proxy.cli.render import clean

__all__ = ["config_main", "show_history"]

PATH = "/api/v1/settings/history"
_SOURCES = {"api": "a settings change", "file": "a hand edit", "restore": "a restore"}


def show_history(entries: list[Any]) -> str:
    """One version a line, newest first: the id to restore, when, what replaced it."""
    rows = [e for e in entries if isinstance(e, Mapping)]
    if not rows:
        return ("no earlier versions yet: each change of config.yaml (settings, console, CLI "
                "or a hand edit) keeps the file it replaced")
    lines = [f"{'ID':<30} {'REPLACED BY':<18} SECTIONS"]
    for entry in rows:
        sections = ", ".join(clean(s) for s in entry.get("sections") or ()) or "-"
        source = _SOURCES.get(str(entry.get("source")), clean(entry.get("source")))
        lines.append(f"{clean(entry.get('id')):<30} {source:<18} {sections}")
    lines.append("restore one with: sluice config restore ID")
    return "\n".join(lines)


def config_main(data_dir: Path, action: str, version: str | None, as_json: bool) -> int:
    """``sluice config history|restore ID``."""
    try:
        if action == "history":
            entries = call(data_dir, "GET", PATH, admin=True)
            print(json.dumps(entries, indent=2) if as_json else show_history(entries))
            return 0
        done = call(data_dir, "POST", f"{PATH}/{quote(version or '', safe='')}/restore",
                    admin=True)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(done, indent=2))
        return 0
    sections = ", ".join(clean(s) for s in done.get("sections") or ()) or "nothing"
    print(f"restored config.yaml {clean(version)} (changed: {sections})")
    if done.get("restartRequired"):
        print("some of it applies at the next start: restart sluice", file=sys.stderr)
    return 0
