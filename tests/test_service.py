"""``sluice service`` (SPEC §13) without a child process: the unit's text, read back here
with an independent parser (shlex and systemd's two escapes), the launchd plist, the other
platforms told no. The real CLI in a subprocess with a fake ``systemctl``, ``systemd-analyze
verify``, the unit's ExecStart run as a gateway, and the launchd agent with a fake
``launchctl``: tests/test_e2e_service.py."""

from __future__ import annotations

import argparse
import plistlib
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.service_unit import (
    STOP_TIMEOUT,
    ServiceSpec,
    UnitError,
    exec_words,
    launchd_plist,
    plist_command,
    serve_command,
    systemd_unit,
    unit_command,
)
from proxy.cli.args import parse_args
from proxy.cli.service import service_main
from proxy.cli.service_host import Host


def _unescape(word: str, mark: str) -> str:
    """``mark`` doubled is the character itself; a lone one is something systemd would
    expand (a specifier, a variable): the unit failed to escape it."""
    def one(match: re.Match[str]) -> str:
        assert match.group() == mark * 2, f"systemd would expand {mark} in {word!r}"
        return mark
    return re.sub(re.escape(mark) + "{1,2}", one, word)


def systemd_words(value: str, *, command: bool = True) -> list[str]:
    """A unit line's words as systemd makes them, by another road than the product's
    parser: shlex's POSIX rules for the quotes and backslashes this unit uses, then the
    specifier escape (``%%``) and, in a command's arguments, the variable escape (``$$``)."""
    words = [_unescape(w, "%") for w in shlex.split(value)]
    if not command:
        return words
    return words[:1] + [_unescape(w, "$") for w in words[1:]]


def unit_lines(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def unit_exec(text: str) -> list[str]:
    (line,) = unit_lines(text, "ExecStart")
    return systemd_words(line)


def unit_env(text: str) -> dict[str, str]:
    pairs = [systemd_words(v, command=False)[0] for v in unit_lines(text, "Environment")]
    return dict(p.split("=", 1) for p in pairs)


# -- the unit's text ---------------------------------------------------------------------


def test_unit_runs_the_gateway_and_stops_it_with_a_drain() -> None:
    from proxy.models.process import STOP_TIMEOUT as MODEL_STOP
    from proxy.server import DRAIN_TIMEOUT

    spec = ServiceSpec(serve_command("/opt/py/bin/python", "/srv/data"))
    text = systemd_unit(spec)
    assert unit_exec(text) == ["/opt/py/bin/python", "-m", "proxy", "serve",
                               "--data-dir", "/srv/data"]
    assert unit_lines(text, "Restart") == ["on-failure"]
    assert unit_lines(text, "KillSignal") == ["SIGTERM"]
    assert unit_lines(text, "KillMode") == ["mixed"]  # SIGTERM to the gateway only
    assert unit_lines(text, "WantedBy") == ["default.target"]
    assert unit_lines(text, "Environment") == []
    restart = int(unit_lines(text, "RestartSec")[0])
    assert 1 <= restart <= 30
    stop = int(unit_lines(text, "TimeoutStopSec")[0])
    assert stop == STOP_TIMEOUT
    assert stop > DRAIN_TIMEOUT + MODEL_STOP  # the drain, then the model servers' stop


@given(st.lists(st.text(st.characters(blacklist_categories=("Cc", "Cs"))), min_size=1))
def test_any_argument_reaches_the_gateway_unchanged(args: list[str]) -> None:
    spec = ServiceSpec(("/usr/bin/python3", *args), (("PYTHONPATH", "/a b/%h $X \"q\\"),))
    text = systemd_unit(spec)
    assert unit_exec(text) == ["/usr/bin/python3", *args]
    assert unit_command(text) == ["/usr/bin/python3", *args]
    assert unit_env(text) == {"PYTHONPATH": "/a b/%h $X \"q\\"}


@pytest.mark.parametrize("program", ["/a'b/python", '/a"b/python', "/a\\b/python",
                                     "/$HOME/python", "python3", "/a\nb/python"])
def test_a_program_systemd_cannot_run_is_refused(program: str) -> None:
    with pytest.raises(UnitError):
        systemd_unit(ServiceSpec(serve_command(program, "/d")))


def test_exec_words_refuse_what_they_cannot_read() -> None:
    assert exec_words('/p "a b" c\\ d \'e f\' 100%% $$X') == ["/p", "a b", "c d", "e f",
                                                              "100%", "$X"]
    for broken in ('/p "open', "/p end\\", "/p %h"):
        with pytest.raises(UnitError):
            exec_words(broken)
    with pytest.raises(UnitError):
        unit_command("[Service]\nType=exec\n")


def test_launchd_plist() -> None:
    spec = ServiceSpec(serve_command("/opt/py/bin/python", "/Users/a/d d"),
                       (("PYTHONPATH", "/src"),), "/Users/a/d d/sluice.log")
    doc = plistlib.loads(launchd_plist(spec))
    assert doc["Label"] == "dev.sluice.gateway"
    assert doc["ProgramArguments"] == ["/opt/py/bin/python", "-m", "proxy", "serve",
                                       "--data-dir", "/Users/a/d d"]
    assert doc["RunAtLoad"] is True
    assert doc["KeepAlive"] == {"SuccessfulExit": False}
    assert doc["ExitTimeOut"] == STOP_TIMEOUT  # launchd's own is 20 s: less than the drain
    assert doc["StandardOutPath"] == doc["StandardErrorPath"] == "/Users/a/d d/sluice.log"
    assert doc["EnvironmentVariables"] == {"PYTHONPATH": "/src"}
    assert plist_command(launchd_plist(spec)) == list(spec.command)
    with pytest.raises(UnitError):
        plist_command(b"not a plist")


# -- install, uninstall, status: the real CLI --------------------------------------------


# -- macOS and the rest: in process, the platform a parameter ----------------------------


def _service(host: Host, *args: str) -> int:
    parsed: argparse.Namespace = parse_args(["service", *args])
    data = Path(parsed.data_dir) if getattr(parsed, "data_dir", None) else Path("/nowhere")
    return service_main(parsed, data, host)


def test_other_platforms_are_told_no(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = Host("win32", {"HOME": str(tmp_path)}, 0)
    for action in ("install", "uninstall", "status"):
        assert _service(host, action) == 2
        assert "not available on win32" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
