"""``scripts/figures``: figures.json as a Markdown table (standard library only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parent.parent / "figures.json"


def cell(entry: dict[str, Any]) -> str:
    value = entry.get("value")
    if entry.get("kind") == "sample" and isinstance(value, dict):
        return (f"p50 {value.get('p50')}, p99 {value.get('p99')}, max {value.get('max')} "
                f"(n={value.get('n')})")
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def table(doc: dict[str, Any]) -> str:
    figures = doc.get("figures", {})
    lines = ["| figure | value | measured |", "|---|---|---|"]
    for name in sorted(figures):
        entry = figures[name]
        lines.append(f"| {name} | {cell(entry)} | {entry.get('measured', '-')} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        print(f"no figures yet: {path} (run scripts/test or scripts/soak)", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{path}: not JSON ({exc})", file=sys.stderr)
        return 1
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
