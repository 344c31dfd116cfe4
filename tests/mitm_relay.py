"""A man in the middle between two gateways, for tests/test_tls_lan.py (SPEC §16): a third
party that relays a gateway's traffic with a certificate of its own and keeps every
plaintext byte it sees.

``python tests/mitm_relay.py --listen ADDR --target HOST --api-port P --node-port N
--cert C --key K --record DIR --ready FILE`` (standard library only):

- a plain port on ADDR relays HTTP to ``HOST:P`` (the gateway's API port), one request a
  connection (``Connection: close`` both ways), and rewrites ``GET /health``'s
  ``nodePort`` to its own TLS port, so a gateway that asks it where the node port is comes
  to the relay (``--hide-node-port``: to null, as if there were none, to draw the clear-text
  claim of SPEC §14 out of the other gateway);
- its TLS port on ADDR (TLS 1.3, certificate C, no client certificate asked) relays, once
  the handshake is done, to ``HOST:N`` over a TLS client connection of its own (no client
  certificate; any server certificate).

Every byte read on either side, after decryption, goes to ``DIR/<n>-<port>-<way>`` (``n``
the connection's number, ``port`` ``plain`` or ``tls``, ``way`` ``up`` from the gateway
that connected, ``down`` towards it), a file per stream so a string split over two reads
is still found. What it does is said on standard output, one line each. Once both ports
listen it writes ``{"plain": port, "tls": port}`` to FILE. It runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import ssl
import sys
import threading
from pathlib import Path

TIMEOUT = 10.0  # seconds for any one read, connect or handshake
HEAD_CAP = 65536

_numbers = itertools.count(1)


def say(line: str) -> None:
    print(line, flush=True)


class Relay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.target = args.target
        self.api_port = args.api_port
        self.node_port = args.node_port
        self.hide_node_port = args.hide_node_port  # answer nodePort null: try a downgrade
        self.record = Path(args.record)
        self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server.minimum_version = ssl.TLSVersion.TLSv1_3
        self.server.load_cert_chain(args.cert, args.key)
        self.server.verify_mode = ssl.CERT_NONE  # asks no client certificate
        self.client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.client.minimum_version = ssl.TLSVersion.TLSv1_3
        self.client.check_hostname = False
        self.client.verify_mode = ssl.CERT_NONE
        self.tls_port = 0

    def keep(self, name: str, data: bytes) -> None:
        with (self.record / name).open("ab") as out:
            out.write(data)

    # -- the plain port -------------------------------------------------------------------

    def plain(self, conn: socket.socket, n: int) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < HEAD_CAP:
                data = conn.recv(65536)
                if not data:
                    return
                self.keep(f"{n}-plain-up", data)
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next((int(v) for k, _, v in (line.partition(b":") for line in lines[1:])
                           if k.strip().lower() == b"content-length"), 0)
            while len(body) < length and (data := conn.recv(65536)):
                self.keep(f"{n}-plain-up", data)
                body += data
            kept = [line for line in lines[1:] if line.split(b":")[0].strip().lower()
                    not in (b"connection", b"keep-alive")]
            request = b"\r\n".join([lines[0], *kept, b"Connection: close", b"", body])
            target = lines[0].split(b" ")[1] if b" " in lines[0] else b""
            say(f"plain {n}: {lines[0].decode(errors='replace')}")
            with socket.create_connection((self.target, self.api_port), TIMEOUT) as up:
                up.sendall(request)
                answer = b""
                while data := up.recv(65536):
                    answer += data
            self.keep(f"{n}-plain-down", answer)
            if target == b"/health":
                answer = self.rewrite_health(answer)
            conn.sendall(answer)

    def rewrite_health(self, answer: bytes) -> bytes:
        """``nodePort`` in the answer's JSON -> the relay's TLS port (Content-Length
        fixed)."""
        head, _, body = answer.partition(b"\r\n\r\n")
        try:
            doc = json.loads(body)
        except ValueError:
            return answer
        if not isinstance(doc, dict) or "nodePort" not in doc:
            return answer
        doc["nodePort"] = None if self.hide_node_port else self.tls_port
        body = json.dumps(doc).encode()
        lines = [line for line in head.split(b"\r\n")
                 if line.split(b":")[0].strip().lower() != b"content-length"]
        lines.append(b"Content-Length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    # -- the TLS port ---------------------------------------------------------------------

    def tls(self, conn: socket.socket, n: int) -> None:
        conn.settimeout(TIMEOUT)
        try:
            near = self.server.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            say(f"tls {n}: the handshake with the gateway that connected failed: {exc}")
            conn.close()
            return
        say(f"tls {n}: handshake done with the gateway that connected")
        try:
            raw = socket.create_connection((self.target, self.node_port), TIMEOUT)
            far = self.client.wrap_socket(raw)
        except (OSError, ssl.SSLError) as exc:
            say(f"tls {n}: no TLS link to the node port: {exc}")
            near.close()
            return
        say(f"tls {n}: relaying to the node port")
        ways = [threading.Thread(target=self.pump, args=(near, far, f"{n}-tls-up"),
                                 daemon=True),
                threading.Thread(target=self.pump, args=(far, near, f"{n}-tls-down"),
                                 daemon=True)]
        for way in ways:
            way.start()
        for way in ways:
            way.join()
        near.close()
        far.close()
        say(f"tls {n}: closed")

    def pump(self, source: ssl.SSLSocket, sink: ssl.SSLSocket, name: str) -> None:
        try:
            while data := source.recv(65536):
                self.keep(name, data)
                sink.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        for sock in (source, sink):  # one side ended: end both
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- accepting ------------------------------------------------------------------------

    def serve(self, listener: socket.socket, handle: str) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=getattr(self, handle), args=(conn, next(_numbers)),
                             daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mitm_relay")
    for name in ("listen", "target", "cert", "key", "record", "ready"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--node-port", type=int, required=True)
    parser.add_argument("--hide-node-port", action="store_true",
                        help="answer GET /health with nodePort null (a downgrade attempt)")
    args = parser.parse_args(argv)
    relay = Relay(args)
    listeners = {}
    for handle in ("plain", "tls"):
        listener = socket.create_server((args.listen, 0))
        listeners[handle] = listener
    relay.tls_port = listeners["tls"].getsockname()[1]
    ports = {handle: sock.getsockname()[1] for handle, sock in listeners.items()}
    for handle, listener in listeners.items():
        threading.Thread(target=relay.serve, args=(listener, handle), daemon=True).start()
    ready = Path(args.ready)
    ready.with_suffix(".tmp").write_text(json.dumps(ports))
    os.replace(ready.with_suffix(".tmp"), ready)
    say(f"listening: {ports}")
    threading.Event().wait()  # until SIGTERM


if __name__ == "__main__":
    main(sys.argv[1:])
