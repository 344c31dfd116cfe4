"""The ``sluice`` command (and ``python -m proxy``): parse the arguments, then run
``serve`` on the gateway's side or any other command on the CLI's, which never loads the
gateway (``sluice status`` imports nothing of the server)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.cli.args import parse_args

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if (args.command or "serve") == "serve":
        from proxy.serve import serve_main

        return serve_main(args)
    from proxy.cli.commands import run

    return run(args)
