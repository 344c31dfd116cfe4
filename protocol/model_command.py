"""A model server's own command line (SPEC §11.1), as pure code: the placeholders it may
name, and the command with them filled in.

A command is split first (a YAML list, or a string split like a shell: the config's
converter), then each argument has its ``${...}`` placeholders replaced; nothing is ever run
through a shell. ``${PORT}`` is a free loopback port sluice picks, ``${SOCKET}`` a socket path
in the socket dir, ``${MODEL}`` the entry's ``path`` made absolute, ``${NAME}`` its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

PLACEHOLDERS = ("PORT", "SOCKET", "MODEL", "NAME")
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def placeholders_in(argument: str) -> list[str]:
    """The names of the placeholders an argument uses, in order (``${PORT}`` -> PORT)."""
    return _PLACEHOLDER.findall(argument)


def unknown_placeholder(command: Sequence[str]) -> tuple[int, str] | None:
    """The first placeholder that does not exist, with its argument's index; else None."""
    for index, argument in enumerate(command):
        for name in placeholders_in(argument):
            if name not in PLACEHOLDERS:
                return index, name
    return None


def uses(command: Sequence[str], name: str) -> bool:
    """Whether any argument names placeholder ``name``."""
    return any(name in placeholders_in(argument) for argument in command)


def expand(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The command with every placeholder replaced by its value (a name without a value
    is left as written: :func:`unknown_placeholder` refuses those at config time)."""
    def fill(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return [_PLACEHOLDER.sub(fill, argument) for argument in command]
