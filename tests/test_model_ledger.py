"""The record of model servers in state.json (proxy/models/ledger.py, proxy/datadir.py): what
is written while they run, what a next gateway reads back (bad entries dropped), and that a
recorded pid is signalled only while its start time matches. No child process: the real
stops are tests/test_e2e_model_orphans.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from proxy.datadir import GatewayState, ServerRecord, read_state, write_state
from proxy.models.ledger import Ledger, start_time, stop_leftover


def test_a_start_time_is_the_process_own_and_none_when_gone() -> None:
    mine = start_time(os.getpid())
    assert mine is not None
    assert mine == start_time(os.getpid())
    assert start_time(0x3FFFFFF0) is None


def test_records_round_trip_and_bad_entries_are_dropped(tmp_path: Path) -> None:
    record = ServerRecord("web", 4242, "123456", "SIGINT")
    write_state(tmp_path, GatewayState(pid=7, model_servers=(record,)))
    assert read_state(tmp_path) == GatewayState(pid=7, model_servers=(record,))
    doc = json.loads((tmp_path / "state.json").read_text())
    doc["modelServers"] += [{"pid": "x", "startTime": "1"}, {"pid": 5}, {"pid": -1,
                            "startTime": "1"}, "junk", {"pid": 9, "startTime": "2"}]
    (tmp_path / "state.json").write_text(json.dumps(doc))
    state = read_state(tmp_path)
    assert state is not None
    assert state.model_servers == (record, ServerRecord("", 9, "2", "SIGTERM"))
    (tmp_path / "state.json").write_text(json.dumps({"pid": 7, "modelServers": {}}))
    assert read_state(tmp_path) == GatewayState(pid=7)


async def test_the_ledger_writes_what_runs() -> None:
    written: list[tuple[ServerRecord, ...]] = []
    book = Ledger(written.append)
    pid = os.getpid()
    await book.add("web", pid, "SIGINT")
    assert written == [(ServerRecord("web", pid, start_time(pid) or "", "SIGINT"),)]
    await book.remove(pid)
    await book.remove(pid)  # once only
    assert written[1:] == [()]
    await book.add("gone", 0x3FFFFFF0)  # exited before it could be recorded: nothing
    assert len(written) == 2
    await book.run()  # nothing left behind: clear at once
    assert book.clear.is_set()


async def test_a_pid_with_another_start_time_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append((pid, sig)))
    pid = os.getpid()
    assert not await stop_leftover(ServerRecord("other", pid, "1"))
    assert not await stop_leftover(ServerRecord("gone", 0x3FFFFFF0, "1"))
    assert signalled == []
