"""The observers of ``scripts/bench --watch``: one live-events subscriber and one Prometheus
scrape a second, both on the gateway's Unix socket, while a load runs (issue 12's cost
target: with them, gateway CPU within +10% of nobody watching).

Standard library only: the subscriber is a minimal RFC 6455 client that does the handshake
and then reads (and drops) every frame as fast as they come, as a console would; the scraper
GETs ``/metrics`` every second and checks that it answers 200.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

SCRAPE_EVERY = 1.0  # seconds between two GET /metrics


class Watcher(threading.Thread):
    """Subscribes to ``/api/v1/events`` and scrapes ``/metrics`` until :meth:`stop`."""

    def __init__(self, unix_path: str, get: Callable[[str], int]) -> None:
        super().__init__(daemon=True)
        self.path = unix_path
        self._get = get  # GET path -> status
        self.done = threading.Event()
        self.frames_bytes = 0
        self.frames = 0
        self.scrapes = 0
        self.errors: list[str] = []
        self._sock = self._subscribe()
        self._scraper = threading.Thread(target=self._scrape, daemon=True)

    def _subscribe(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(self.path)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n"
                      f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                raise RuntimeError("the gateway closed the events handshake")
            head += data
        if not head.startswith(b"HTTP/1.1 101"):
            first = head.split(b"\r\n", 1)[0]
            raise RuntimeError(f"events handshake refused: {first!r}")
        self._early = head.split(b"\r\n\r\n", 1)[1]
        self.frames_bytes = len(self._early)
        sock.settimeout(0.5)
        return sock

    def _frames(self, buffer: bytearray) -> None:
        """Drop the whole frames at the start of ``buffer``; answer a ping with its pong
        (the gateway drops a subscriber that leaves a ping unanswered)."""
        while len(buffer) >= 2:
            opcode, size, at = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if size == 126:
                if len(buffer) < 4:
                    return
                size, at = int.from_bytes(buffer[2:4], "big"), 4
            elif size == 127:
                if len(buffer) < 10:
                    return
                size, at = int.from_bytes(buffer[2:10], "big"), 10
            if len(buffer) < at + size:
                return
            payload = bytes(buffer[at:at + size])
            del buffer[:at + size]
            if opcode == 0x9:  # ping -> pong, masked as a client must
                mask = os.urandom(4)
                masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                self._sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + masked)
            self.frames += 1

    def run(self) -> None:
        self._scraper.start()
        buffer = bytearray(self._early)
        while not self.done.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                self.errors.append(f"events: {exc}")
                return
            if not data:
                self.errors.append("events: the gateway closed the feed")
                return
            self.frames_bytes += len(data)
            buffer += data
            self._frames(buffer)

    def _scrape(self) -> None:
        while not self.done.wait(SCRAPE_EVERY):
            try:
                status = self._get("/metrics")
            except OSError as exc:
                self.errors.append(f"scrape: {exc}")
                continue
            if status != 200:
                self.errors.append(f"scrape: status {status}")
            self.scrapes += 1

    def stop(self) -> dict[str, Any]:
        self.done.set()
        self.join(timeout=5)
        self._scraper.join(timeout=5)
        self._sock.close()
        return {"events_bytes": self.frames_bytes, "frames": self.frames,
                "scrapes": self.scrapes,
                "errors": self.errors[:5]}


def started(unix_path: str, get: Callable[[str], int]) -> Watcher:
    watcher = Watcher(unix_path, get)
    watcher.start()
    time.sleep(0.05)  # the hello frame
    return watcher
