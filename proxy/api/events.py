"""``GET /api/v1/events``: the live events WebSocket (SPEC §9.3), on every listener.

The request passes the usual phases first (the §5 guard refuses a foreign ``Origin`` with
403, the access rule of GETs applies); :func:`upgrade` then checks that it is a WebSocket
handshake (426 or 400 otherwise, as our other errors) and takes the connection over
(:class:`~proxy.api.call.Takeover`). :func:`serve` runs the subscriber on trio-websocket
(:mod:`proxy.observe.event_socket`):

- the first frame is ``hello``: the bodies of the GET endpoints named in :data:`HELLO`
  (called through the route table, so they are exactly what those endpoints answer), made
  in the same step as the subscription, so no event falls between the two;
- then every hub event, from the subscriber's bounded queue (:mod:`proxy.observe.feed`),
  sent by its own task: a client that does not read blocks nobody but that task;
- a ping every :data:`~proxy.observe.event_socket.PING_INTERVAL`; a client that has not
  answered one by the next is taken for gone and its connection closed;
- a stopping gateway sends close code 1001 (:meth:`EventFeed.close_all`); a client that
  closes is unsubscribed at once. What a client sends is read and ignored.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from protocol.errors import bad_request, upgrade_required
from protocol.headers import Header, connection_tokens
from protocol.json_text import compact_json
from protocol.request_record import iso_utc
from proxy.api.call import Call, Handler, Takeover
from proxy.observe.feed import EventFeed
from proxy.timestamps import wall

if TYPE_CHECKING:
    from proxy.context import GatewayContext

WEBSOCKET_VERSION = b"13"  # RFC 6455

Router = Callable[[bytes, str], Any]
"""``route(method, path) -> handler`` (:func:`proxy.api.routes.route`)."""

# hello's fields: the GET endpoints whose bodies they are. "identity" gives
# fingerprint and version at the top level; "notifications" is the list itself.
HELLO: tuple[tuple[str, str], ...] = (
    ("identity", "/api/v1/node/identity"),
    ("status", "/api/v1/inference/status"),
    ("pool", "/api/v1/pool/distributed-status"),
    ("stats", "/api/v1/pool/routing-stats"),
    ("loadBalancing", "/api/v1/settings/load-balancing"),
    ("timeouts", "/api/v1/settings/timeouts"),
    ("api", "/api/v1/settings/api"),
    ("aliases", "/api/v1/settings/aliases"),
    ("discovery", "/api/v1/settings/discovery"),
    ("notifications", "/api/v1/notifications"),
    ("localModels", "/api/v1/models/local"),
)
_SETTINGS = ("loadBalancing", "timeouts", "api", "aliases", "discovery")


def _only(headers: Sequence[Header], name: bytes) -> bytes | None:
    """The value of a header that must appear once; None when absent or repeated."""
    values = [value for key, value in headers if key == name]
    return values[0] if len(values) == 1 else None


def check_handshake(headers: Sequence[Header]) -> None:
    """An RFC 6455 §4.2.1 opening handshake, or the reason it is not: 426 for a request
    that asks for no WebSocket (or another version), 400 for a broken one. (The method is
    GET: the route table allows no other.)"""
    upgrade = _only(headers, b"upgrade")
    if (upgrade is None or upgrade.strip().lower() != b"websocket"
            or b"upgrade" not in connection_tokens(headers)):
        raise upgrade_required("/api/v1/events is a WebSocket: send a WebSocket handshake "
                               "(Connection: Upgrade, Upgrade: websocket)")
    if _only(headers, b"sec-websocket-version") != WEBSOCKET_VERSION:
        raise upgrade_required("only WebSocket version 13 is spoken here",
                               version=WEBSOCKET_VERSION)
    key = _only(headers, b"sec-websocket-key")
    try:
        valid_key = key is not None and len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid_key = False
    if not valid_key:
        raise bad_request("the WebSocket handshake needs one Sec-WebSocket-Key: 16 bytes "
                          "in base64", code="bad_websocket_handshake")
    host = _only(headers, b"host")
    try:
        host_ok = host is not None and bool(host.decode("idna"))
    except UnicodeError:
        host_ok = False
    if not host_ok:
        raise bad_request("the WebSocket handshake needs one valid Host header",
                          code="bad_websocket_handshake")


def upgrade(call: Call, route: Router) -> tuple[int, Any]:
    """The endpoint: check the handshake, then take the connection over."""
    check_handshake(call.headers)
    ctx = call.ctx
    hello = functools.partial(hello_frame, ctx, route)
    return 101, Takeover(functools.partial(serve, ctx.events, hello), "events")


def hello_frame(ctx: GatewayContext, route: Router) -> str:
    """The ``hello`` frame: the bodies of the :data:`HELLO` endpoints, now."""
    bodies: dict[str, Any] = {}
    for field, path in HELLO:
        handler: Handler = route(b"GET", path)
        status, body = handler(Call(ctx, b"GET", path))
        if status != 200:  # pragma: no cover - these GETs always answer 200
            raise RuntimeError(f"GET {path} answered {status}")
        bodies[field] = body
    identity = bodies.pop("identity")
    data = {"fingerprint": identity["fingerprint"], "version": identity["version"],
            "identity": identity["identity"], "status": bodies["status"],
            "pool": bodies["pool"], "stats": bodies["stats"],
            "settings": {name: bodies[name] for name in _SETTINGS},
            "notifications": bodies["notifications"]["notifications"],
            "localModels": bodies["localModels"]}
    return compact_json({"type": "hello", "at": iso_utc(wall()), "data": data})


async def serve(feed: EventFeed, hello: Callable[[], str], stream: trio.abc.Stream,
                headers: list[Header]) -> None:
    """One subscriber, from the handshake (replayed by ``stream``; ``headers`` go with our
    101) to the end of its connection."""
    # Imported by the first subscriber (once, about 25 ms), not at start: trio-websocket and
    # wsproto are about 2 MB of memory that a gateway nobody watches need not hold.
    from proxy.observe import event_socket

    await event_socket.serve(feed, hello, stream, headers)
