"""The node pool as the status endpoints show it (SPEC §8): the ``distributed`` block of
``/api/v1/inference/status`` and ``GET /api/v1/pool/distributed-status``, whose endpoint
entries are also the ``node`` events of SPEC §9.3."""

from __future__ import annotations

from typing import Any

from protocol.config import Config, NodeConfig, by_priority
from proxy.pool.nodes import PAUSED, UNKNOWN, NodeEndpoint, NodeIndex


def summary(index: NodeIndex, config: Config) -> dict[str, Any]:
    """The ``distributed`` block of ``/api/v1/inference/status``."""
    lb = config.load_balancing
    return {"enabled": lb.enabled, "strategy": lb.strategy,
            "totalNodes": sum(1 for n in config.nodes if n.enabled),
            "onlineNodes": len(index.online()) if lb.enabled else 0,
            "remoteModels": len(index.holders()) if lb.enabled else 0}


def endpoint_entry(cfg: NodeConfig, endpoint: NodeEndpoint | None,
                   enabled: bool) -> dict[str, Any]:
    """One entry of ``endpoints``: an enabled node (``cfg``) and what its last check found
    (``endpoint``, None before the poll saw it); ``paused`` while load balancing is off
    (``enabled`` false). Also the data of a ``node`` event (SPEC §9.3)."""
    online = enabled and endpoint is not None and endpoint.online
    latency = endpoint.latency_ms if online and endpoint is not None else None
    return {
        "fingerprint": cfg.fingerprint, "baseUrl": cfg.base_url,
        "status": (UNKNOWN if endpoint is None else endpoint.status) if enabled else PAUSED,
        "latencyMs": None if latency is None else round(latency),
        # the models it has loaded (a sluice node also lists its unloaded managed models)
        "loadedModelCount": len(endpoint.loaded_ids) if online and endpoint else 0,
        "priority": cfg.priority,
        "weight": cfg.weight,  # its share under the weighted strategy (SPEC §13)
        # Beyond SPEC: why the last check failed (never a key: status and address).
        "lastError": endpoint.last_error if enabled and endpoint else None}


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
