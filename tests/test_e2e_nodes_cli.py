"""``sluice nodes`` as a child process against an in-process gateway, weights included (the
nodes API: tests/test_nodes_api.py; weights through the API: tests/test_weights_api.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

from protocol.upstream_url import parse_upstream_url
from proxy.api.nodes import derived_fingerprint
from tests.conftest import StartGateway
from tests.test_nodes_api import KEY, closed_port_url, files

SLUICE = [sys.executable, "-m", "proxy"]


async def sluice(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*SLUICE, *args], capture_stdout=True, capture_stderr=True,
                                  stdin=stdin, check=False)


async def test_nodes_cli(start_gateway: StartGateway, short_tmp: Path) -> None:
    gw = await start_gateway([])
    folder = ["--data-dir", str(gw.gateway.settings.data_dir)]
    key_file = short_tmp / "node.key"
    key_file.write_text(KEY + "\n")
    first, second = closed_port_url(), closed_port_url()
    added = await sluice("nodes", "add", first, "--name", "studio", "--api-key-file",
                         str(key_file), *folder)
    assert added.returncode == 0, added.stderr
    fp1 = derived_fingerprint(parse_upstream_url(first))
    assert fp1 in added.stdout.decode()
    added = await sluice("nodes", "add", second, "--api-key-stdin", "--json", *folder,
                         stdin=b"sk-from-stdin\n")
    assert added.returncode == 0, added.stderr
    fp2 = json.loads(added.stdout)["fingerprint"]
    assert files(gw)[1] == {fp1: KEY, fp2: "sk-from-stdin"}
    listed = await sluice("nodes", "list", *folder)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.decode().splitlines()
    assert "FINGERPRINT" in lines[0]
    assert fp1 in lines[1]
    assert "studio" in lines[1]
    assert first in lines[1]
    assert fp2 in lines[2]
    ordered = await sluice("nodes", "order", fp2, *folder)  # fp2 to the top
    assert ordered.returncode == 0, ordered.stderr
    assert [n.fingerprint for n in sorted(gw.gateway.ctx.config.nodes,
                                          key=lambda n: -n.priority)] == [fp2, fp1]
    off = await sluice("nodes", "disable", fp1, *folder)
    assert off.returncode == 0, off.stderr
    listed = await sluice("nodes", "list", "--json", *folder)
    assert [n["enabled"] for n in json.loads(listed.stdout)] == [True, False]
    assert (await sluice("nodes", "enable", fp1, *folder)).returncode == 0
    assert all(n.enabled for n in gw.gateway.ctx.config.nodes)
    removed = await sluice("nodes", "remove", fp1, *folder)
    assert removed.returncode == 0, removed.stderr
    assert files(gw)[1] == {fp2: "sk-from-stdin"}
    missing = await sluice("nodes", "remove", fp1, *folder)
    assert missing.returncode == 1
    assert "404" in missing.stderr.decode()
    bad_key = short_tmp / "bad.key"
    bad_key.write_text("sk-bad key-SECRETVALUE")
    refused = await sluice("nodes", "add", closed_port_url(), "--api-key-file", str(bad_key),
                           *folder)
    assert refused.returncode == 1
    assert "apiKey" in refused.stderr.decode()
    everything = b"".join(r.stdout + r.stderr for r in (added, listed, refused))
    assert b"SECRETVALUE" not in everything
    assert KEY.encode() not in everything
    # A key on the command line is not an option.
    plain = await sluice("nodes", "add", closed_port_url(), "--api-key", KEY, *folder)
    assert plain.returncode == 2


async def test_nodes_cli_weights(start_gateway: StartGateway) -> None:
    gw = await start_gateway([])
    folder = ["--data-dir", str(gw.gateway.settings.data_dir)]
    added = await sluice("nodes", "add", closed_port_url(), "--name", "big", "--weight", "3",
                         "--json", *folder)
    assert added.returncode == 0, added.stderr
    fp = json.loads(added.stdout)["fingerprint"]
    other = await sluice("nodes", "add", closed_port_url(), "--json", *folder)
    fp2 = json.loads(other.stdout)["fingerprint"]
    listed = await sluice("nodes", "list", *folder)
    assert listed.returncode == 0, listed.stderr
    head, *rows = listed.stdout.decode().splitlines()
    column = head.split().index("WEIGHT")
    assert [row.split()[column] for row in rows] == ["3", "1"]
    assert [row.split()[1] for row in rows] == [fp, fp2]
    weighed = await sluice("nodes", "weight", fp2, "12", *folder)
    assert weighed.returncode == 0, weighed.stderr
    assert weighed.stdout.decode().strip() == f"node {fp2}: weight 12"
    assert {n.fingerprint: n.weight for n in gw.gateway.ctx.config.nodes} == {fp: 3, fp2: 12}
    # Out of range: the server's refusal, naming the field; not a number: argparse's.
    refused = await sluice("nodes", "weight", fp2, "0", *folder)
    assert refused.returncode == 1
    assert "weight" in refused.stderr.decode()
    assert "between 1 and 100" in refused.stderr.decode()
    nonsense = await sluice("nodes", "weight", fp2, "heavy", *folder)
    assert nonsense.returncode == 2
    assert "invalid int value" in nonsense.stderr.decode()
    missing = await sluice("nodes", "weight", "node-nope", "2", *folder)
    assert missing.returncode == 1
    assert "404" in missing.stderr.decode()
    as_json = await sluice("nodes", "list", "--json", *folder)
    assert [n["weight"] for n in json.loads(as_json.stdout)] == [3, 12]
