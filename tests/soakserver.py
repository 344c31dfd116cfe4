"""The soak's fake model server as its own process (its own interpreter and CPU, apart from
the clients): ``python -m tests.soakserver`` serves a :class:`tests.soakload.SoakUpstream`
on 127.0.0.1, prints its URL on one line, and serves until it is sent SIGTERM or its stdin
closes. ``GET /soak/stats`` answers what it counted (:func:`stats`): the connections open
apart from the one asking, and the requests per soak act and per soak id.

:class:`SoakServer` starts and stops it from a test (inside a trio loop).
"""

from __future__ import annotations

import subprocess
import sys
from typing import IO, Any

import trio

from tests.client import request
from tests.fakeupstream import ReceivedRequest, ResponseWriter
from tests.soakload import WARM_PREFIX, SoakUpstream

START_TIMEOUT = 20.0


def stats(up: SoakUpstream) -> dict[str, Any]:
    soaked = [n for soak_id, n in up.attempts.items() if not soak_id.startswith(WARM_PREFIX)]
    return {"open": up.open_connections() - 1,  # not the connection asking
            "opened": up.connections_opened, "acts": dict(up.acts),
            "ids": len(soaked), "attempts": sum(soaked), "attempts_max": max(soaked, default=0)}


async def main() -> None:
    up = SoakUpstream()

    async def answer(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.json(200, stats(up))

    up.on("GET", "/soak/stats", answer)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(up.serve)
        print(url, flush=True)
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        while await stdin.receive_some(1024):  # until the parent goes away
            pass
        nursery.cancel_scope.cancel()


class SoakServer:
    """The process, seen from the test."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def launch(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.soakserver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    async def start(self) -> SoakServer:
        """launch(), then wait (bounded) for the URL it prints."""
        self.launch()
        assert self.proc is not None
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None
        with trio.fail_after(START_TIMEOUT):
            line = await trio.to_thread.run_sync(stdout.readline)
        self.url = line.decode().strip()
        if not self.url.startswith("http://"):
            raise AssertionError(f"the soak server did not start: {line!r}")
        return self

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    async def stats(self) -> dict[str, Any]:
        reply = await request(self.address, "GET", "/soak/stats")
        assert reply.status == 200, reply
        doc: dict[str, Any] = reply.json()
        return doc

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            code = await trio.to_thread.run_sync(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)
            raise AssertionError("the soak server did not stop when asked") from None
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
        if code != 0:  # a handler raised: serve() crashed
            raise AssertionError(f"the soak server exited with {code}")


if __name__ == "__main__":
    trio.run(main)
