"""``python -m tools.faults --listen 127.0.0.1:8199`` (or ``--listen unix:/path.sock``)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from tools.faults.server import FaultServer
from tools.faults.specs import listing, parse_spec
from tools.serve_loop import check_listen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="faulty-upstream",
        description="An OpenAI-compatible upstream (llama.cpp's wire format) that misbehaves "
                    "on request: header 'x-fault: <name>[;param=value...]' or model "
                    "'fault:<name>' (e.g. fault:reset-after-3).")
    parser.add_argument("--listen", default="127.0.0.1:8199",
                        help="127.0.0.1:PORT or unix:/path.sock (default 127.0.0.1:8199)")
    parser.add_argument("--list", action="store_true", help="print the behaviours and exit")
    parser.add_argument("--model", action="append", default=None,
                        help="a model id for /v1/models (repeatable; default 'faulty')")
    parser.add_argument("--default", default="ok",
                        help="the fault of requests that name none (default ok)")
    parser.add_argument("--loading-seconds", type=float, default=0,
                        help="answer 503 'Loading model' to everything for this long")
    parser.add_argument("--loading-requests", type=int, default=0,
                        help="answer 503 'Loading model' to the first N requests")
    args = parser.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    try:
        parse_spec(args.default)
    except ValueError as exc:
        parser.error(f"--default: {exc}")
    try:
        check_listen(args.listen)
    except ValueError as exc:
        print(f"faulty-upstream: {exc}", file=sys.stderr)
        return 2
    server = FaultServer(models=tuple(args.model or ["faulty"]), default=args.default,
                         loading_seconds=args.loading_seconds,
                         loading_requests=args.loading_requests)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(server.serve, args.listen))
            print(f"faulty upstream listening on {server.url}", flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 0
    except (OSError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is None:
            raise
        print(f"faulty-upstream: {error}", file=sys.stderr)
        return 2
    return 0


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError (a bind that failed) in ``exc`` or its groups, if any."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _os_error(inner)) is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
