"""The ``sluice`` command line's arguments: parsing only (SPEC §1)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["parse_args", "parser"]

# The event types of SPEC §9.3 (as proxy.cli.lines has them, kept here so that parsing the
# arguments loads nothing else).
EVENT_TYPES = ("node", "circuit", "settings", "notification", "request", "stats", "model",
               "pairing", "discovered", "queue")
FEED_TYPES = ("hello", "resync")


def _event_types(text: str) -> frozenset[str]:
    """``--types request,node``: the names, each one a type of the feed."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - frozenset(EVENT_TYPES + FEED_TYPES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"not an event type: {', '.join(unknown) or '(none given)'} "
            f"(the types: {', '.join(EVENT_TYPES + FEED_TYPES)})")
    return names


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="sluice", description="Local-network AI API gateway (OpenAI-compatible).")
    sub = top.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the gateway (the default)")
    serve.add_argument("--data-dir", help="data folder (default: $SLUICE_DATA_DIR, "
                       "$XDG_DATA_HOME/sluice or ~/.local/share/sluice)")
    serve.add_argument("--config", help="config file instead of <data dir>/config.yaml")
    serve.add_argument("--demo", action="store_true",
                       help="also serve the demo model smollm2-135m (downloaded on first use)")
    serve.add_argument("--log-level", default="INFO",
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    check = sub.add_parser("check-config", help="validate the config file")
    check.add_argument("--data-dir", help="data folder holding config.yaml")
    check.add_argument("--config", help="config file to check")
    status = sub.add_parser("status", help="show the running gateway's state")
    status.add_argument("--data-dir", help="data folder of the gateway")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--watch", action="store_true",
                        help="keep the status on screen, redrawn as the gateway's live events "
                             "change it (Ctrl-C to stop)")
    events = sub.add_parser("events", help="print the gateway's live events, one line each "
                                           "(Ctrl-C to stop)")
    events.add_argument("--data-dir", help="data folder of the gateway")
    events.add_argument("--json", action="store_true",
                        help="print each frame as the gateway sends it (JSON, one per line)")
    events.add_argument("--types", type=_event_types, metavar="TYPE,...",
                        help=f"only these event types ({', '.join(EVENT_TYPES + FEED_TYPES)})")
    console = sub.add_parser("console", help="print (and open) the web console's URL with "
                                              "a one-time admin token")
    console.add_argument("--data-dir", help="data folder of the gateway")
    console.add_argument("--no-open", action="store_true",
                         help="only print the URL, even where a browser is at hand")
    _keys_parser(sub)
    _config_parser(sub)
    _nodes_parser(sub)
    pair = sub.add_parser("pair", help="let another computer connect: print a one-time "
                                       "pairing code (6 digits, 5 minutes) for its "
                                       "'sluice nodes add URL --code C'")
    pair.add_argument("--data-dir", help="data folder of the gateway")
    pair.add_argument("--wait", action="store_true",
                      help="then wait until the other computer has used the code")
    pair.add_argument("--json", action="store_true", help="print the raw JSON")
    _models_parser(sub)
    _service_parser(sub)
    return top


def _service_parser(sub: Any) -> None:
    service = sub.add_parser("service", help="run sluice as a service of your session "
                                             "(systemd user unit, launchd agent)")
    service_sub = service.add_subparsers(dest="action", required=True)
    install = service_sub.add_parser(
        "install", help="write the service (same data dir), enable and start it; "
                        "rewrites one already there")
    install.add_argument("--data-dir", help="the data folder the service runs (default: "
                         "$SLUICE_DATA_DIR, $XDG_DATA_HOME/sluice or ~/.local/share/sluice)")
    install.add_argument("--config", help="config file instead of <data dir>/config.yaml")
    install.add_argument("--no-start", action="store_true",
                         help="only write it; print the commands that start it")
    service_sub.add_parser("uninstall", help="stop and disable the service, remove its file")
    service_sub.add_parser("status", help="whether it is installed, what it runs, whether "
                                          "it runs")


def _models_parser(sub: Any) -> None:
    ps = sub.add_parser("ps", help="the managed models: state, size, when each unloads")
    load = sub.add_parser("load", help="load a managed model now (waits until it is loaded)")
    load.add_argument("name", help="the model's name (see: sluice ps)")
    unload = sub.add_parser("unload", help="unload a managed model (once no request is in "
                                           "flight; a later request loads it again)")
    unload.add_argument("name", help="the model's name (see: sluice ps)")
    for command in (ps, load, unload):
        command.add_argument("--data-dir", help="data folder of the gateway")
        command.add_argument("--json", action="store_true", help="print the raw JSON")


def _config_parser(sub: Any) -> None:
    config = sub.add_parser("config", help="config.yaml's earlier versions (each change keeps "
                                           "the file it replaced)")
    config_sub = config.add_subparsers(dest="action", required=True)
    history = config_sub.add_parser("history", help="the kept versions, newest first")
    restore = config_sub.add_parser("restore", help="apply a kept version now (live)")
    restore.add_argument("id", help="the version's id (see: sluice config history)")
    for command in (history, restore):
        command.add_argument("--data-dir", help="data folder of the gateway")
        command.add_argument("--json", action="store_true", help="print the raw JSON")


def _keys_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="access keys for clients, with their limits")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create", help="make a key (printed once)")
    create.add_argument("--name", help="a label, e.g. the client's name")
    _limit_options(create)
    keys_sub.add_parser("list", help="list the keys and their limits (never the keys "
                                     "themselves)")
    update = keys_sub.add_parser("update", help="change a key's name or limits")
    update.add_argument("id", help="the key's id (see: sluice keys list)")
    update.add_argument("--name", help="a new label")
    _limit_options(update, clearing=True)
    revoke = keys_sub.add_parser("revoke", help="revoke a key")
    revoke.add_argument("id", help="the key's id (see: sluice keys list)")
    for command in (create, keys_sub.choices["list"], update, revoke):
        command.add_argument("--data-dir", help="data folder of the gateway")
        command.add_argument("--json", action="store_true", help="print the raw JSON")


def _limit_options(command: Any, *, clearing: bool = False) -> None:
    """--models, --rpm, --priority, --expires; with ``clearing``, each with its way back to
    no limit."""
    models = command.add_mutually_exclusive_group() if clearing else command
    models.add_argument("--models", metavar="M,...",
                        help="the models it may use: ids or patterns with * (e.g. "
                             "'smollm2-135m,qwen*'); default: all")
    rpm = command.add_mutually_exclusive_group() if clearing else command
    rpm.add_argument("--rpm", type=int, metavar="R", help="requests a minute it may send "
                                                           "(default: no limit)")
    command.add_argument("--priority", choices=("interactive", "batch"),
                         help="its requests' class in the queue: batch waits for "
                              "interactive ones (default: interactive)")
    expires = command.add_mutually_exclusive_group() if clearing else command
    expires.add_argument("--expires", metavar="X",
                         help="when it stops working: a duration from now (30d, 12h, 90m, "
                              "2w) or an ISO date or time (2025-06-30: the end of that day, "
                              "UTC); default: never")
    if clearing:
        models.add_argument("--all-models", action="store_true", help="let it use every model")
        rpm.add_argument("--no-rpm", action="store_true", help="remove its rate limit")
        expires.add_argument("--no-expiry", action="store_true", help="never expire")


def _nodes_parser(sub: Any) -> None:
    nodes = sub.add_parser("nodes", help="network nodes (other computers running sluice)")
    nodes_sub = nodes.add_subparsers(dest="action", required=True)
    listed = nodes_sub.add_parser("list", help="the nodes in routing order")
    add = nodes_sub.add_parser("add", help="register a node (added last)")
    add.add_argument("url", help="the node's base URL, e.g. http://192.168.1.50:39080")
    add.add_argument("--name", help="a label (default: the host)")
    add.add_argument("--weight", type=int, help="its share under the weighted strategy, "
                     "1..100 (default 1)")
    key = add.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", metavar="FILE",
                     help="read the node's API key from FILE (never give it as an argument)")
    key.add_argument("--api-key-stdin", action="store_true",
                     help="read the node's API key from standard input")
    key.add_argument("--code", metavar="CODE",
                     help="the pairing code the node shows ('sluice pair' there): the node "
                          "gives this gateway an access key of its own")
    remove = nodes_sub.add_parser("remove", help="unregister a node (and forget its key)")
    remove.add_argument("fingerprint")
    order = nodes_sub.add_parser(
        "order", help="put these nodes first, in this order (the others keep theirs after)")
    order.add_argument("fingerprints", nargs="+", metavar="FP")
    enable = nodes_sub.add_parser("enable", help="include a node in routing")
    enable.add_argument("fingerprint")
    disable = nodes_sub.add_parser("disable", help="leave a node out of routing")
    disable.add_argument("fingerprint")
    weight = nodes_sub.add_parser(
        "weight", help="set a node's weight (1..100): its share under the weighted strategy")
    weight.add_argument("fingerprint")
    weight.add_argument("weight", type=int, help="a whole number from 1 to 100")
    for command in (listed, add, remove, order, enable, disable, weight):
        command.add_argument("--data-dir", help="data folder of the gateway")
        command.add_argument("--json", action="store_true", help="print the raw JSON")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line; ``command`` is None when none is given (``serve``)."""
    return parser().parse_args(argv)
