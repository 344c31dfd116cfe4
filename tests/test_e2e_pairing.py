"""Pairing end to end (SPEC §14): two real ``sluice serve`` processes on 127.0.0.1. B runs
``sluice pair --wait`` and prints a code; A runs ``sluice nodes add URL --code C``; B's
``pair`` sees the claim and ends; A then serves a model only B's model server has through
B (``x-sluice-served-by: node:<B>``), with the key B gave; B lists that key under A's
computer name; neither gateway's log holds the code or the key."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import trio
import yaml

from tests.client import Reply
from tests.fakeupstream import FakeUpstream, json_completion
from tests.gateways import GatewayProcess, Launcher

SLUICE = [sys.executable, "-m", "proxy"]
CODE_LINE = re.compile(r"Pairing code: (\d{3}) (\d{3}) \(valid until \d\d:\d\d, "
                       r"(4|5) minutes, one use\)")
ADD_LINE = re.compile(r"On the other computer: sluice nodes add (http://127\.0\.0\.1:\d+) "
                      r"--code (\d{6})")


async def sluice(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*SLUICE, *args, "--data-dir", str(gw.data_dir)],
                                  capture_stdout=True, capture_stderr=True, check=False)


async def read_until(stream: trio.abc.ReceiveStream, pattern: re.Pattern[str]) -> str:
    """What ``stream`` gave until ``pattern`` is found in it (bounded)."""
    text = ""
    with trio.fail_after(20):
        while pattern.search(text) is None:
            chunk = await stream.receive_some(4096)
            assert chunk, f"ended before {pattern.pattern!r}: {text!r}"
            text += chunk.decode()
    return text


async def test_pairing_two_gateways(launch: Launcher, nursery: trio.Nursery) -> None:
    model_server = FakeUpstream(models=("only-on-b",))
    await nursery.start(model_server.serve)
    model_server.on("POST", "/v1/chat/completions", json_completion("from b", model="only-on-b"))
    a, b = await launch.start_many({"a": {}, "b": {"backends": [("local", model_server.url)]}})
    # B: sluice pair --wait (prints the code, then waits for the claim).
    pair = await trio.lowlevel.open_process(
        [*SLUICE, "pair", "--wait", "--data-dir", str(b.data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert pair.stdout is not None
        assert pair.stderr is not None
        printed = await read_until(pair.stdout, ADD_LINE)
        shown = CODE_LINE.search(printed)
        assert shown is not None, printed
        url, code = ADD_LINE.search(printed).groups()  # type: ignore[union-attr]
        assert code == shown[1] + shown[2]
        assert url == b.base_url
        # A: sluice nodes add URL --code C
        added = await sluice(a, "nodes", "add", url, "--code", code)
        assert added.returncode == 0, added.stderr
        assert added.stdout.decode().strip() == (
            f"added node {b.fingerprint} (127.0.0.1, {url}) with the access key it gave for "
            f"the code, last in the order")
        # B's pair saw the claim.
        with trio.fail_after(10):
            rest = await read_until(pair.stdout, re.compile(r"paired: .+\n"))
            assert await pair.wait() == 0
        notes = (await pair.stderr.receive_some(65536)).decode()
    finally:
        if pair.returncode is None:
            pair.kill()
            await pair.wait()
    host = socket.gethostname()[:100]
    assert f"paired: {host} connected with the code" in rest
    assert "external access is off" in notes
    key = yaml.safe_load((a.data_dir / "secrets.yaml").read_text())["node_keys"][b.fingerprint]
    assert key.startswith("sk-sluice-")
    # A serves B's model through B.
    await a.wait_nodes({b.fingerprint: ["only-on-b"]})
    reply: Reply = await a.chat("only-on-b")
    assert reply.status == 200, reply.body
    assert reply.header("x-sluice-served-by") == f"node:{b.fingerprint}"
    assert reply.json()["choices"][0]["message"]["content"] == "from b"
    # B's keys: one, named after A's computer, used by A's requests.
    [entry] = await b.get_json("/api/v1/access-keys", admin=True)
    assert entry["name"] == host
    assert entry["lastUsedAt"] is not None
    listed = await sluice(b, "keys", "list")
    assert host.split()[0] in listed.stdout.decode()
    notifications = (await b.get_json("/api/v1/notifications"))["notifications"]
    assert f"{host} connected with a pairing code" in [n["message"] for n in notifications]
    # No secrets in either log, nor in what the CLI printed on A.
    for text in (a.log(), b.log(), added.stdout.decode(), added.stderr.decode()):
        assert re.search(rf"(?<![0-9]){code}(?![0-9])", text) is None, text
        assert key not in text
    assert f"pairing code claimed by {host} ({a.fingerprint}) from 127.0.0.1" in b.log()
