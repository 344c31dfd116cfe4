"""Runs one llama.cpp server (the ``xllamacpp`` wheel) in this process.

``python -m proxy.models.launcher --model PATH --alias ID --listen ADDR ...`` where ADDR is a
``*.sock`` path or ``127.0.0.1:PORT`` (port 0 = any free one). It prints one line,
``listening <url>``, on stdout once the server accepts connections, then waits for SIGTERM or
SIGINT (or for its parent, the gateway, to be gone: :func:`watch_parent`) and exits 0.
llama.cpp's own log goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

INSTALL_HINT = ("llama.cpp support is not installed: run  pip install 'sluice[llama]'  "
                "(or scripts/serve, which installs it)")


def llama_available() -> bool:
    """Whether the ``xllamacpp`` wheel is installed (found, not imported: importing it is
    slow and loads llama.cpp)."""
    return importlib.util.find_spec("xllamacpp") is not None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m proxy.models.launcher")
    parser.add_argument("--model", required=True, help="path of the GGUF file")
    parser.add_argument("--alias", required=True, help="the model id to serve")
    parser.add_argument("--listen", required=True, help="a *.sock path or 127.0.0.1:PORT")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="0 = all cores")
    parser.add_argument("--embeddings", action="store_true",
                        help="serve /v1/embeddings (llama.cpp then serves no completions)")
    parser.add_argument("--sse-ping-interval", type=int, default=None, metavar="SECONDS",
                        help="seconds between the keep-alive comments of a stream that has "
                             "no event yet (llama.cpp's default: 30)")
    parser.add_argument("--parent", type=int, default=None,
                        help="the gateway's pid: stop once it is gone (default: our parent)")
    return parser


def listen_url(address: str) -> str:
    """The URL sluice uses to reach what llama.cpp reports as its listening address."""
    if address.startswith("unix://"):
        return "unix:" + address[len("unix://"):]
    return address


def watch_parent(parent: int | None = None, interval: float = 0.5) -> None:
    """SIGTERM this process once its parent, the gateway (pid ``parent``; by default the
    parent it has now), is gone, so no server is left orphaned: a thread checks every
    ``interval`` seconds whether we have been handed to another parent. Not
    PR_SET_PDEATHSIG: that fires when the *thread* that started us ends, and trio starts
    processes from a worker thread that exits after 10 s idle."""
    if parent is None:
        parent = os.getppid()
    elif os.getppid() != parent:  # the gateway is already gone
        raise SystemExit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import xllamacpp
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 3
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    if args.listen.endswith(".sock"):
        params.hostnames = [args.listen]
    else:
        host, _, port = args.listen.rpartition(":")
        params.hostnames = [host]
        params.port = int(port)
    params.n_ctx = args.context
    params.n_parallel = args.parallel
    if args.embeddings:
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    if args.sse_ping_interval is not None:
        params.sse_ping_interval = args.sse_ping_interval
    threads = args.threads or (os.cpu_count() or 1)
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    # Block the stop signals before llama.cpp starts its threads (they inherit the mask), so
    # they are taken here by sigwait and not by whichever thread the kernel picks.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    watch_parent(args.parent)
    server = xllamacpp.Server(params)  # returns once it listens
    print(f"listening {listen_url(server.listening_address)}", flush=True)
    signal.sigwait(stop)
    sys.stdout.flush()
    sys.stderr.flush()
    # llama.cpp's worker threads are not joinable from Python; leave at once and cleanly.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
