"""Crash-safe settings (SPEC §2: config.yaml and secrets.yaml are replaced atomically: temp
file, fsync, rename, fsync of the folder — proxy/files.py ``atomic_write``).

- ``kill -9`` of a real gateway process in the middle of a burst of settings writes (load
  balancing, timeouts, access-key creations, one after another with the admin token), at
  five different moments: both files stay valid for the project's own loaders
  (``parse_config_text``, ``Secrets.from_text``) and equal the state after the last
  acknowledged write or after the one in flight — never a mix, never truncated.
- 50 concurrent settings writes to an in-process gateway: all accepted, and config.yaml
  ends equal to one of them, the one GET answers (the last applied).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import trio

from protocol.config import parse_config_text
from protocol.durations import parse_duration
from protocol.secrets import Secrets
from tests.client import request
from tests.conftest import StartGateway
from tests.figures import Figures
from tests.gateways import SERVE, START_TIMEOUT, GatewayProcess
from tests.netns import unix_health

STRATEGIES = ("round-robin", "least-loaded", "fastest", "priority")
KILL_AFTER = (0.05, 0.2, 0.4, 0.7, 1.0)  # seconds into the burst
MAX_OPS = 3000  # bound on one burst


def op(i: int) -> tuple[str, str, dict[str, Any]]:
    """The i-th write of a burst: method, path, body."""
    if i % 3 == 0:
        return "PUT", "/api/v1/settings/load-balancing", {"strategy": STRATEGIES[i // 3 % 4]}
    if i % 3 == 1:
        return "PUT", "/api/v1/settings/timeouts", {
            "request": {"streaming": {"total": f"{100 + i % 1000}s"}}}
    return "POST", "/api/v1/access-keys", {"name": f"key-{i}"}


def state_after(n: int) -> tuple[str, float, tuple[str, ...]]:
    """(strategy, streaming total, access key names) after the first ``n`` writes."""
    strategy, total, names = "cache-aware", 600.0, []  # the default of a new file
    for i in range(n):
        _, path, body = op(i)
        if path.endswith("load-balancing"):
            strategy = body["strategy"]
        elif path.endswith("timeouts"):
            total = float(body["request"]["streaming"]["total"].rstrip("s"))
        else:
            names.append(body["name"])
    return strategy, total, tuple(names)


def on_disk(data_dir: Path) -> tuple[str, float, tuple[str, ...]]:
    """The same from the files, read with the project's own loaders (raises if invalid)."""
    config_text = (data_dir / "config.yaml").read_text()
    secrets_text = (data_dir / "secrets.yaml").read_text()
    # An empty config.yaml would parse as the defaults: a truncated file must not pass.
    assert config_text.endswith("\n")
    assert "timeouts:" in config_text
    assert secrets_text.endswith("\n")
    assert "admin_token" in secrets_text
    cfg = parse_config_text(config_text)
    secrets = Secrets.from_text(secrets_text, "secrets.yaml")
    assert secrets.admin_token
    names = tuple(str(k["name"]) for k in secrets.access_keys)
    return cfg.load_balancing.strategy, cfg.timeouts.request.streaming.total, names


def burst(gw: GatewayProcess, acked: list[int], stop: threading.Event) -> None:
    """Writes one after another until the gateway is gone; ``acked``: those answered 200."""
    for i in range(MAX_OPS):
        if stop.is_set():
            return
        method, path, body = op(i)
        try:
            status, answer = gw.call_sync(method, path, body, admin=True)
        except (OSError, ValueError):  # killed: refused, reset, or a cut answer
            return
        assert status in (200, 201), (path, status, answer)
        acked.append(i)


def restart(gw: GatewayProcess) -> tuple[int, int]:
    """Start the killed gateway again on its files as they are: (temp files left once it
    is up, its exit code after SIGTERM)."""
    # What a kill between atomic_write's mkstemp and its rename leaves (sometimes it does).
    (gw.data_dir / ".secrets.yaml.cut.tmp").write_bytes(b"admin_tok")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(gw.folder / "run")}
    env.pop("SLUICE_DATA_DIR", None)
    with (gw.folder / "log2").open("wb") as log:
        proc = subprocess.Popen([*SERVE, "--data-dir", str(gw.data_dir)], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not unix_health(gw.socket_path):
                assert proc.poll() is None, (gw.folder / "log2").read_text()
                assert time.monotonic() < deadline, "the restarted gateway is not up"
                time.sleep(0.05)
            left = len(list(gw.data_dir.glob(".*.tmp")))
            proc.send_signal(signal.SIGTERM)
            return left, proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_kill_9_during_settings_writes(short_tmp: Path, figures: Figures) -> None:
    valid = writes = 0
    leftovers = 0
    for run, delay in enumerate(KILL_AFTER):
        gw = GatewayProcess(short_tmp / f"k{run}", f"crash{run}", lb=False, interval=5.0,
                            hc_timeout=4.0)
        gw.launch()
        try:
            gw.ready_sync()
            assert on_disk(gw.data_dir) == state_after(0)
            acked: list[int] = []
            stop = threading.Event()
            writer = threading.Thread(target=burst, args=(gw, acked, stop), daemon=True)
            writer.start()
            deadline = time.monotonic() + 10
            while not acked and time.monotonic() < deadline:  # the burst is under way
                time.sleep(0.005)
            time.sleep(delay)
            assert gw.proc is not None
            gw.proc.kill()  # SIGKILL
            gw.proc.wait(10)
            stop.set()
            writer.join(10)
            assert not writer.is_alive()
        finally:
            gw.stop()
        n = len(acked)
        assert acked == list(range(n))
        found = on_disk(gw.data_dir)  # parseable, or this raises
        assert found in (state_after(n), state_after(n + 1)), (n, found)
        valid += 1
        writes += n
        leftovers += len(list(gw.data_dir.glob(".*.tmp")))
        # The gateway starts again on these files, and clears the temp files of a cut write.
        assert restart(gw) == (0, 0)
        assert on_disk(gw.data_dir) == found
    figures.note("crash_safe_settings", {"kills": len(KILL_AFTER), "valid_after": valid,
                                         "restarted": valid, "acknowledged_writes": writes,
                                         "temp_files_left_by_kill": leftovers})


async def test_fifty_concurrent_settings_writes(start_gateway: StartGateway,
                                                figures: Figures) -> None:
    gw = await start_gateway([])
    settings = gw.gateway.settings
    token = settings.secrets.admin_token
    headers = [("authorization", f"Bearer {token}"), ("content-type", "application/json")]
    path = "/api/v1/settings/timeouts"
    sent = {i: {"request": {"streaming": {"total": f"{200 + i}s"},
                            "standard": {"total": f"{100 + i}s"}}} for i in range(50)}
    statuses: list[int] = []

    async def write(i: int) -> None:
        reply = await request(gw.unix, "PUT", path, json.dumps(sent[i]).encode(), headers)
        statuses.append(reply.status)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(write, i)
    assert statuses == [200] * 50
    answer = (await request(gw.unix, "GET", path)).json()
    # The GET writes durations its own way (120s is "2m"): compare them as seconds.
    streaming = parse_duration(answer["request"]["streaming"]["total"], "streaming")
    standard = parse_duration(answer["request"]["standard"]["total"], "standard")
    winner = int(streaming) - 200
    assert sent[winner]["request"]["streaming"]["total"] == f"{200 + winner}s"
    assert standard == 100 + winner  # one write, not a mix
    cfg = parse_config_text(settings.config_path.read_text())
    assert cfg.timeouts.request.streaming.total == 200 + winner
    assert cfg.timeouts.request.standard.total == 100 + winner
    assert not list(settings.config_path.parent.glob(".*.tmp"))
    figures.note("concurrent_settings_writes", {"writes": 50, "accepted": len(statuses),
                                                "file_equals_get": True})
