"""The unified model list (SPEC §7.5), as ``/v1/models`` and the Ollama API's listings
read it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.aliases import alias_entries
from protocol.openai import merge_model_lists

if TYPE_CHECKING:
    from proxy.context import GatewayContext


def model_entries(ctx: GatewayContext) -> list[dict[str, Any]]:
    """SPEC §7.5: local models, then (load balancing on) the nodes' as ``remote``; then the
    exact aliases whose target is listed (SPEC §12)."""
    local = ctx.backends.model_entries()
    if ctx.ondemand is not None:
        local = ctx.ondemand.listed(local)
    config = ctx.config
    if config.load_balancing.enabled:
        local = merge_model_lists([("", local)], ctx.nodes.remote_models())
    return alias_entries(config.aliases, local) if config.aliases else local
