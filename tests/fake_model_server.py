"""A small OpenAI-style model server run as a managed model's ``command`` (SPEC §11.1) by
tests/test_e2e_command_models.py: a real process, standard library only.

    python tests/fake_model_server.py --port ${PORT} [--socket ${SOCKET}] --model ${NAME}
        [--ready-after S] [--busy-health] [--ignore-sigterm] [--exit-on SIGNAL]
        [--fail-start MESSAGE] [--kind llm|embedding]

- ``--ready-after S``: loading takes S seconds: with ``--busy-health`` it listens at once and
  answers GET /health 503 until then (as vLLM does), else it listens only once ready.
- ``--ignore-sigterm``: SIGTERM does nothing (the stop must escalate to SIGKILL).
- ``--fail-start M``: print M on stderr and exit 1 before listening.
- A chat whose last message says ``crash`` makes it exit (status 7) in the middle: after the
  head and one event of a stream, before anything of a whole answer.
- ``FAKE_GREETING`` in its environment is the answer's text (default "hello").
- ``--child``: start a child process that sleeps (a worker it leaves behind on SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STATE: dict[str, Any] = {"ready": False}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        print(f"request: {format % args}", flush=True)

    def address_string(self) -> str:
        return "local"

    def _send(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            if STATE["ready"]:
                self._send(200, {"status": "ok"})
            else:
                self._send(503, {"error": {"message": "Loading model", "code": 503}})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": STATE["model"],
                                                         "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        doc = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/v1/embeddings":
            self._send(200, {"object": "list", "model": STATE["model"],
                             "data": [{"object": "embedding", "index": 0,
                                       "embedding": [0.25, -0.5, 1.0]}],
                             "usage": {"prompt_tokens": 2, "total_tokens": 2}})
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        messages = doc.get("messages") or [{}]
        crash = "crash" in str(messages[-1].get("content", ""))
        text = os.environ.get("FAKE_GREETING", "hello")
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        if not doc.get("stream"):
            if crash:
                os._exit(7)
            self._send(200, {"id": "c1", "object": "chat.completion", "model": STATE["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}],
                             "usage": usage})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def event(payload: Any) -> None:
            data = f"data: {json.dumps(payload)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        chunk = {"id": "c1", "object": "chat.completion.chunk", "model": STATE["model"],
                 "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        event(chunk)
        if crash:
            time.sleep(0.2)
            os._exit(7)
        event({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
               "usage": usage})
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        self.wfile.flush()


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--socket")
    parser.add_argument("--model", default="fake")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--busy-health", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--fail-start")
    parser.add_argument("--kind", default="llm")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    STATE["model"] = args.model
    print(f"fake model server pid {os.getpid()} serving {args.model} ({args.kind})", flush=True)
    # SIGINT stops it (Python's KeyboardInterrupt) even when the run began with SIGINT
    # ignored (a shell's background job): an in-process test gateway catches no signal, so
    # its children would inherit that (`sluice serve` catches it: a caught signal is reset
    # to the default at exec).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"worker pid {child.pid}", flush=True)
    if args.fail_start:
        print(args.fail_start, file=sys.stderr, flush=True)
        return 1
    if not args.busy_health:
        time.sleep(args.ready_after)
    server: socketserver.BaseServer
    if args.socket:
        server = UnixServer(args.socket, Handler)
        where = args.socket
    else:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        where = f"127.0.0.1:{args.port}"
    print(f"listening on {where}", flush=True)
    if args.busy_health:
        threading.Timer(args.ready_after, lambda: STATE.update(ready=True)).start()
    else:
        STATE["ready"] = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
