"""Runs one llama.cpp server (the ``xllamacpp`` wheel) in this process.

``python -m proxy.models.launcher --model PATH --alias ID --listen ADDR ...`` where ADDR is a
``*.sock`` path or ``127.0.0.1:PORT`` (port 0 = any free one). It prints one line,
``listening <url>``, on stdout once the server accepts connections, then waits for SIGTERM or
SIGINT (or for its parent, the gateway, to be gone: :func:`watch_parent`) and exits 0.
llama.cpp's own log goes to stderr.

The bundled llama.cpp's options of a ``models:`` entry (SPEC §11.1: ``--gpu-layers``,
``--flash-attn``, ``--cache-type-k``/``-v``, ``--batch``) are set on its ``CommonParams`` by
:func:`build_params`; one that the installed wheel does not have ends the launcher with one
line on stderr (the model's ``lastError``), before any server starts.

``python -m proxy.models.launcher --backends`` prints instead, as one JSON line, the compute
backends the installed llama.cpp has (``["cpu"]``, ``["cuda", "cpu"]``, ...;
:mod:`protocol.llama_backends`) and exits: the gateway asks it once, in a child process,
since importing llama.cpp there would load it (:mod:`proxy.models.llama_backends`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from protocol.llama_backends import backends_of

INSTALL_HINT = ("llama.cpp support is not installed: run  pip install 'sluice[llama]'  "
                "(or scripts/serve, which installs it)")
# --flash-attn: llama.cpp's llama_flash_attn_type for each of our values.
FLASH_ATTN = {"on": "LLAMA_FLASH_ATTN_TYPE_ENABLED", "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}


def llama_available() -> bool:
    """Whether the ``xllamacpp`` wheel is installed (found, not imported: importing it is
    slow and loads llama.cpp)."""
    return importlib.util.find_spec("xllamacpp") is not None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m proxy.models.launcher")
    parser.add_argument("--backends", action="store_true",
                        help="print the installed llama.cpp's compute backends (JSON) and exit")
    parser.add_argument("--model", help="path of the GGUF file (required)")
    parser.add_argument("--alias", help="the model id to serve (required)")
    parser.add_argument("--listen", help="a *.sock path or 127.0.0.1:PORT (required)")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="0 = all cores")
    parser.add_argument("--embeddings", action="store_true",
                        help="serve /v1/embeddings (llama.cpp then serves no completions)")
    parser.add_argument("--sse-ping-interval", type=int, default=None, metavar="SECONDS",
                        help="seconds between the keep-alive comments of a stream that has "
                             "no event yet (llama.cpp's default: 30)")
    parser.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                        help="layers on the GPU (n_gpu_layers; -1 = all that fit)")
    parser.add_argument("--flash-attn", choices=FLASH_ATTN, default=None)
    parser.add_argument("--cache-type-k", default=None, metavar="TYPE",
                        help="the K cache's type: f16, q8_0, q4_0, ...")
    parser.add_argument("--cache-type-v", default=None, metavar="TYPE",
                        help="the V cache's type")
    parser.add_argument("--batch", type=int, default=None, metavar="N",
                        help="the logical batch size (n_batch)")
    parser.add_argument("--temp", type=float, default=None, metavar="T",
                        help="the sampling temperature of a request that names none "
                             "(llama.cpp's default: 0.8; 0 = always the likeliest token)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="the sampling seed of a request that names none (llama.cpp's "
                             "default: a random one per request)")
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


class Unsupported(Exception):
    """A ``models:`` option the installed llama.cpp does not take (or a value it refuses):
    said in one line, the config key first."""


def _version(xllamacpp: ModuleType) -> str:
    return f"xllamacpp {getattr(xllamacpp, '__version__', '(version unknown)')}"


def _set(params: Any, key: str, field: str, value: object, xllamacpp: ModuleType) -> None:
    """``params.field = value`` for the option ``key`` of ``models:``."""
    if not hasattr(params, field):
        raise Unsupported(f"{key} is not supported by the installed llama.cpp "
                          f"({_version(xllamacpp)} has no CommonParams.{field}); remove "
                          f"{key} from the model's entry or install a newer xllamacpp")
    try:
        setattr(params, field, value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Unsupported(f"{key}: llama.cpp refuses {value}: {exc}") from None


def _member(xllamacpp: ModuleType, key: str, enum: str, member: str, given: str) -> object:
    """``xllamacpp.<enum>.<member>``, the value of option ``key`` given as ``given``."""
    value = getattr(getattr(xllamacpp, enum, None), member, None)
    if value is None:
        raise Unsupported(f"{key}: {given} is not supported by the installed llama.cpp "
                          f"({_version(xllamacpp)} has no {enum}.{member})")
    return value


def build_params(args: argparse.Namespace, xllamacpp: ModuleType) -> Any:
    """llama.cpp's ``CommonParams`` for the parsed launcher arguments; an option left out
    keeps llama.cpp's own default. Raises :class:`Unsupported`."""
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
    threads = args.threads or usable_cores()
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    if args.gpu_layers is not None:
        _set(params, "gpu_layers", "n_gpu_layers", args.gpu_layers, xllamacpp)
    if args.flash_attn is not None:
        member = FLASH_ATTN[args.flash_attn]
        _set(params, "flash_attn", "flash_attn_type",
             _member(xllamacpp, "flash_attn", "llama_flash_attn_type", member, args.flash_attn),
             xllamacpp)
    for key in ("cache_type_k", "cache_type_v"):
        given = getattr(args, key)
        if given is not None:
            value = _member(xllamacpp, key, "ggml_type", f"GGML_TYPE_{given.upper()}", given)
            _set(params, key, key, value, xllamacpp)
    if args.batch is not None:
        _set(params, "batch", "n_batch", args.batch, xllamacpp)
    if args.temp is not None:
        params.sampling.temp = args.temp
    if args.seed is not None:
        params.sampling.seed = args.seed
    return params


def backends() -> list[str] | None:
    """The installed llama.cpp's compute backends, or None when it is not installed."""
    try:
        import xllamacpp
    except ImportError:
        return None
    devices = [str(device.get("name", "")) for device in xllamacpp.get_device_info()]
    return backends_of(xllamacpp.get_system_info(), devices)


def usable_cores() -> int:
    """The cores this process may run on (``threads: 0``): its CPU affinity where the
    system keeps one (a cpuset, ``taskset``), so a server given one core of a container does
    not start a thread per core of the machine, which llama.cpp's spinning threads make
    many times slower than one."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        return max(len(getaffinity(0)), 1)
    return os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.backends:
        print(json.dumps(backends()), flush=True)
        return 0
    missing = [f"--{name}" for name in ("model", "alias", "listen")
               if getattr(args, name) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    try:
        import xllamacpp
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 3
    try:
        params = build_params(args, xllamacpp)
    except Unsupported as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2
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
