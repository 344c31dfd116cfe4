"""The text of sluice's service definitions (SPEC §13): a systemd user unit for Linux and a
launchd agent for macOS, made from the command line to run; and that command read back from
a unit or an agent (``sluice service status``). Pure: strings in, strings and bytes out;
:mod:`proxy.cli.service` writes the files and talks to systemctl and launchctl.

A unit's ``ExecStart=`` is split and unquoted by systemd, not by a shell: an argument is
written as it is when it holds only plain characters, else in double quotes with ``\\`` and
``"`` escaped; ``%`` (a specifier) is doubled everywhere and ``$`` (a variable) in command
lines, so a path holding spaces, quotes, ``%h`` or ``$HOME`` reaches the gateway unchanged.
The program itself (the interpreter) cannot hold a quote, a backslash or ``$`` (systemd's
rules for it differ: :func:`quote_program`).
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "LAUNCHD_LABEL", "RESTART_SEC", "STOP_TIMEOUT", "UNIT_NAME", "ServiceSpec", "UnitError",
    "exec_words", "launchd_plist", "option", "plist_command", "quote_program", "quote_word",
    "serve_command", "systemd_unit", "unit_command",
]

UNIT_NAME = "sluice.service"
LAUNCHD_LABEL = "dev.sluice.gateway"
RESTART_SEC = 5  # seconds between a failed gateway and its next start
# Seconds from SIGTERM to SIGKILL: the gateway's drain (proxy.server.DRAIN_TIMEOUT, 30 s)
# then its managed model servers' stop (proxy.models.process.STOP_TIMEOUT, 10 s), with room
# to spare (tests/test_service.py checks it stays longer than the two).
STOP_TIMEOUT = 60

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./$-]+")  # after % and $ are doubled
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_PROGRAM = re.compile(r"[\"'\\$]")
_EXEC_LINE = re.compile(r"^ExecStart=(.*)$", re.MULTILINE)


class UnitError(ValueError):
    """A value a unit cannot hold (a control character in a path), or a unit whose command
    cannot be read back."""


@attrs.frozen
class ServiceSpec:
    """What the service runs: the command (an absolute interpreter first), the variables it
    needs (e.g. ``PYTHONPATH`` when the user runs sluice with one), and for launchd the file
    its output goes to (the data dir's log)."""

    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    log_file: str | None = None


def serve_command(python: str, data_dir: str, config: str | None = None) -> tuple[str, ...]:
    """``<python> -m proxy serve --data-dir DIR [--config FILE]``: the gateway the user runs
    now, on the same data dir (all paths absolute)."""
    command = (python, "-m", "proxy", "serve", "--data-dir", data_dir)
    return command + (("--config", config) if config is not None else ())


def _check(value: str) -> str:
    if _CONTROL.search(value):
        raise UnitError(f"a service cannot hold {value!r}: it has a control character")
    return value


def quote_word(word: str, *, command: bool = True) -> str:
    """One argument as systemd reads it back unchanged (``command=False``: an
    ``Environment=`` assignment, where ``$`` is not expanded)."""
    text = _check(word).replace("%", "%%")
    if command:
        text = text.replace("$", "$$")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_program(path: str) -> str:
    """The program of ``ExecStart=``: systemd takes ``%`` specifiers in it, but neither
    unescapes ``$$`` in the path it runs nor leaves ``$`` alone in the ``argv[0]`` it passes,
    and refuses a quote or a backslash there ("Executable name contains special
    characters"); such a path is refused here, with what to do."""
    if not path.startswith("/"):
        raise UnitError(f"the service's program must be an absolute path, not {path!r}")
    bad = sorted(set(_UNSAFE_PROGRAM.findall(path)))
    if bad:
        raise UnitError(f"systemd cannot run a program whose path holds {' '.join(bad)}: "
                        f"{path!r}; install sluice in a folder without them")
    return quote_word(path)


def systemd_unit(spec: ServiceSpec) -> str:
    """The text of ``sluice.service``, a user unit started with the user's session."""
    if not spec.command:
        raise UnitError("the service has no command")
    lines = [
        "# Written by `sluice service install`; `sluice service uninstall` removes it.",
        "[Unit]",
        "Description=sluice, the local-network AI API gateway",
        "",
        "[Service]",
        "Type=exec",
        "ExecStart=" + " ".join([quote_program(spec.command[0]),
                                 *(quote_word(w) for w in spec.command[1:])]),
    ]
    lines += [f"Environment={quote_word(f'{k}={v}', command=False)}"
              for k, v in spec.environment]
    lines += [
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        "KillSignal=SIGTERM",
        # SIGTERM to the gateway alone: it drains, then stops its model servers itself;
        # whatever is left when the time is up gets SIGKILL.
        "KillMode=mixed",
        f"TimeoutStopSec={STOP_TIMEOUT}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def exec_words(value: str) -> list[str]:
    """The arguments of an ``ExecStart=`` value as systemd splits them (the subset of its
    grammar :func:`quote_word` writes, plus single quotes); raises UnitError."""
    value = value.replace("%%", "\0")
    if "%" in value:
        raise UnitError("the command uses a systemd specifier")
    words: list[str] = []
    word: list[str] | None = None
    quote = ""
    chars = iter(value.replace("\0", "%"))
    for ch in chars:
        if ch == "\\":
            escaped = next(chars, None)
            if escaped is None:
                raise UnitError("the command ends with a backslash")
            word = (word or []) + [escaped]
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word = (word or []) + [ch]
        elif ch in "\"'":
            quote, word = ch, word or []
        elif ch.isspace():
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = (word or []) + [ch]
    if quote:
        raise UnitError("the command has an unclosed quote")
    if word is not None:
        words.append("".join(word))
    return [w.replace("$$", "\0").replace("\0", "$") for w in words]


def unit_command(text: str) -> list[str]:
    """The command a unit's ``ExecStart=`` runs (the last one, as systemd would for a
    simple service); raises UnitError when there is none."""
    found = _EXEC_LINE.findall(text)
    if not found:
        raise UnitError("the unit has no ExecStart= line")
    words = exec_words(found[-1].strip())
    if not words:
        raise UnitError("the unit's ExecStart= is empty")
    return words


def launchd_plist(spec: ServiceSpec, label: str = LAUNCHD_LABEL) -> bytes:
    """The agent's property list: started at login, started again when it exits with a
    failure (``KeepAlive.SuccessfulExit`` false), SIGTERM then ``STOP_TIMEOUT`` s to drain
    (launchd's ``ExitTimeOut``), its output appended to ``log_file``."""
    doc: dict[str, object] = {
        "Label": label,
        "ProgramArguments": [_check(w) for w in spec.command],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_SEC,
        "ExitTimeOut": STOP_TIMEOUT,
        "ProcessType": "Background",
    }
    if spec.environment:
        doc["EnvironmentVariables"] = {_check(k): _check(v) for k, v in spec.environment}
    if spec.log_file is not None:
        doc["StandardOutPath"] = doc["StandardErrorPath"] = _check(spec.log_file)
    return plistlib.dumps(doc, sort_keys=False)


def plist_command(data: bytes) -> list[str]:
    """The ``ProgramArguments`` of an agent's property list; raises UnitError."""
    try:
        doc = plistlib.loads(data)
    except (plistlib.InvalidFileException, ValueError) as exc:
        raise UnitError(f"not a property list ({exc})") from None
    args = doc.get("ProgramArguments") if isinstance(doc, Mapping) else None
    if not isinstance(args, Sequence) or not args or not all(isinstance(a, str) for a in args):
        raise UnitError("the agent has no ProgramArguments")
    return list(args)


def option(command: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` (or ``--name=VALUE``) in a command, if it is there."""
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None
