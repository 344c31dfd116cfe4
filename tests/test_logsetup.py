"""sluice serve's log handler: INFO lines wait in a buffer (at most FLUSH_EVERY), a WARNING
is written at once with what came before it, and nothing is lost at close."""

from __future__ import annotations

import logging
import os
import time

import pytest

from proxy import logsetup


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_info_waits_a_warning_writes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    clock = [1000.0]
    monkeypatch.setattr(logsetup.time, "monotonic", lambda: clock[0])
    handler = logsetup.BufferedStderr(write)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test.logsetup")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.info("first")
        log.info("second")
        assert _read_available(read) == b""  # buffered
        log.warning("trouble")
        assert _read_available(read) == b"INFO first\nINFO second\nWARNING trouble\n"
        log.info("later")
        clock[0] += logsetup.FLUSH_EVERY  # the next record finds it is time
        log.info("after the interval")
        assert _read_available(read) == b"INFO later\nINFO after the interval\n"
        log.info("last")
        logsetup.write_out()  # only the root logger's handlers: not this one
        handler.close()
        assert _read_available(read) == b"INFO last\n"
    finally:
        log.removeHandler(handler)
        os.close(read)
        os.close(write)


def test_the_access_log_fast_path_writes_the_logging_format(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.observe.access_log import AccessLog

    lines: list[str] = []
    access = logging.getLogger("sluice.access")
    before = access.level
    access.setLevel(logging.INFO)
    AccessLog(lines.append).write_batch([
        (time.time(), ("abc-1", "POST", "/v1/chat/completions", "m", 200, "local:x", 0.0123,
                       1.5, "success")),
        (time.time(), ("abc-2", "GET", "/health", None, 200, None, None, 0.0, "success"))])
    lines = "".join(lines).splitlines(keepends=True)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    import re

    assert re.fullmatch(stamp + r" INFO sluice\.access: abc-1 POST /v1/chat/completions "
                        r"model=m status=200 served_by=local:x ttfb=12\.3ms "
                        r"duration=1500\.0ms outcome=success\n", lines[0]), lines[0]
    assert lines[1].endswith("abc-2 GET /health model=- status=200 served_by=- ttfb=- "
                             "duration=0.0ms outcome=success\n")
    access.setLevel(logging.WARNING)
    try:
        assert not AccessLog(lines.append).enabled()  # the logger's level decides
    finally:
        access.setLevel(before)
