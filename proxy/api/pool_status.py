"""The node pool as the status endpoints show it (SPEC §8): the ``distributed`` block of
``/api/v1/inference/status`` and ``GET /api/v1/pool/distributed-status``, whose endpoint
entries (:func:`protocol.views.endpoint_entry`) are also the ``node`` events of SPEC §9.3."""

from __future__ import annotations

from typing import Any

from protocol.config import Config, by_priority
from protocol.views import endpoint_entry
from proxy.registry.nodes import NodeIndex


def summary(index: NodeIndex, config: Config) -> dict[str, Any]:
    """The ``distributed`` block of ``/api/v1/inference/status``."""
    lb = config.load_balancing
    return {"enabled": lb.enabled, "strategy": lb.strategy,
            "totalNodes": sum(1 for n in config.nodes if n.enabled),
            "onlineNodes": len(index.online()) if lb.enabled else 0,
            "remoteModels": len(index.holders()) if lb.enabled else 0}


def pool_status(index: NodeIndex, config: Config) -> dict[str, Any]:
    """``GET /api/v1/pool/distributed-status``: the summary, the models (the nodes serving
    each, and those of them that have it loaded, SPEC §11) and each enabled node in
    priority order (``paused`` while load balancing is off)."""
    enabled = config.load_balancing.enabled
    by_fp = {e.fingerprint: e for e in index.endpoints}
    endpoints = [endpoint_entry(cfg, by_fp.get(cfg.fingerprint), enabled)
                 for cfg in by_priority(n for n in config.nodes if n.enabled)]
    head = summary(index, config)
    del head["remoteModels"]
    models = index.holders().items() if enabled else ()
    loaded = index.loaded_on() if enabled else {}
    return {**head, "models": [{"id": m, "availableOn": fps, "loadedOn": loaded.get(m, [])}
                               for m, fps in models],
            "endpoints": endpoints}
