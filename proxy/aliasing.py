"""Model aliases on the request path (SPEC §12): the one phase hook between reading a
model request's body (an OpenAI call's, or the one an Ollama request was translated to) and
routing it.

``Exchange.to_model`` calls :func:`apply` only when the live config has aliases (an empty
:class:`~protocol.aliases.AliasTable` is falsy: a gateway without aliases pays that one
check). The decision is :func:`protocol.aliases.resolve`; the body's ``model`` string is
rewritten by :func:`protocol.json_model.replace_model` (every other byte kept; the relay
sends the new body with its own Content-Length). The exchange keeps the request as asked
(``Exchange.info``, the request log's ``model``); the relay carries the target
(``Relay.info``, the log's ``servedModel``).

"Exists" is what the unified model list (SPEC §7.5) would show and routing could use: a
local backend that lists the id, a managed model on demand (loaded or not), or, with load
balancing on and for a request not forwarded to us by another gateway, an online node that
lists it. Right after start, before the first checks have answered, the same waits as
:meth:`proxy.routing.router.Router.plan` are made, so a model is not taken for missing only
because nobody has been asked yet; these waits happen only for a name some alias matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.aliases import resolve
from protocol.errors import alias_target_not_available, bad_request
from protocol.headers import FORWARDED, Header, header_value
from protocol.json_model import replace_model
from protocol.request_info import RequestInfo

if TYPE_CHECKING:
    from proxy.context import GatewayContext

__all__ = ["apply", "first_checks"]


def _exists(ctx: GatewayContext, model: str, forwarded: bool) -> bool:
    if ctx.backends.holder_of(model) is not None:
        return True
    ondemand = ctx.ondemand
    if ondemand is not None and ondemand.holds(model):
        return True
    if forwarded or not ctx.config.load_balancing.enabled:
        return False
    return any(e.online and model in e.model_ids for e in ctx.nodes.endpoints)


async def first_checks(ctx: GatewayContext, model: str, forwarded: bool) -> None:
    """Right after start: until the local backends have been checked once (or one lists
    ``model``) and, with load balancing on, the nodes' first round (bounded by the
    health-check timeout). No await once they are done."""
    backends = ctx.backends
    if not backends.ready.is_set():
        await backends.wait_for_holder(model)
    config = ctx.config
    if not forwarded and config.load_balancing.enabled:
        await ctx.nodes.first_round(config.timeouts.health_check.timeout)


async def apply(ctx: GatewayContext, info: RequestInfo, headers: list[Header], body: bytes
                ) -> tuple[RequestInfo, bytes]:
    """The request as it is to be served: ``(info, body)`` unchanged when no alias applies;
    else the target's info and the body with its ``model`` rewritten. Raises 503
    ``model_not_available`` naming the alias and its target when the target does not exist
    now (nothing is forwarded), 400 when the body is not UTF-8 JSON (RFC 8259 §8.1)."""
    asked = info.model
    table = ctx.config.aliases
    if table.target_of(asked) is None:  # no alias would apply: nothing to ask
        return info, body
    forwarded = header_value(headers, FORWARDED) is not None
    await first_checks(ctx, asked, forwarded)
    target = resolve(table, asked, lambda model: _exists(ctx, model, forwarded))
    if target is None:  # a model that exists is never aliased
        return info, body
    if not _exists(ctx, target, forwarded):
        raise alias_target_not_available(asked, target)
    spliced = replace_model(body, target, checked=True)  # parse_request_body read it
    if spliced is None:
        raise bad_request(f"model {asked!r} is an alias, and a request for one must be "
                          "UTF-8 JSON", code="invalid_json", param="model")
    return RequestInfo(target, info.stream, info.timeout_class, info.doc, info.path), spliced
