"""``GET|PUT /api/v1/settings/discovery`` and ``GET /api/v1/nodes/discovered`` (SPEC §14).

The settings body is ``{announce, browse, announcing, browsing}``: the two switches of
config.yaml's ``discovery:`` and what they do now (read-only, ignored in a PUT):
``announcing`` needs ``api.allow_external_access`` (and this gateway listening on every
address: that setting applies at the next start), ``browsing`` needs
``load_balancing.enabled``. Both apply live (:mod:`proxy.discovery_switch`).

The discovered list is ``[{fingerprint, name, baseUrl, version, added}]``, empty while
not browsing. This module never imports :mod:`proxy.discovery`.
"""

from __future__ import annotations

from typing import Any

import attrs

from protocol.config import Config, discovery_effect
from protocol.errors import ConfigError
from proxy.api.call import Call, saving

__all__ = ["DISCOVERED_PATH", "PATH", "discovered", "discovery_view", "get_discovery",
           "put_discovery"]

PATH = "/api/v1/settings/discovery"
DISCOVERED_PATH = "/api/v1/nodes/discovered"
FIELDS = ("announce", "browse")  # JSON field = YAML key under discovery:
READ_ONLY = frozenset({"announcing", "browsing"})  # computed: ignored in a PUT (SPEC §8)


def discovery_view(cfg: Config, external: bool) -> dict[str, Any]:
    """The GET body (also the ``settings`` event of section ``discovery``)."""
    announcing, browsing = discovery_effect(cfg, external)
    return {"announce": cfg.discovery.announce, "browse": cfg.discovery.browse,
            "announcing": announcing, "browsing": browsing}


def _external(call: Call) -> bool:
    return call.ctx.listening.external


def get_discovery(call: Call) -> tuple[int, Any]:
    return 200, discovery_view(call.ctx.config, _external(call))


async def put_discovery(call: Call) -> tuple[int, Any]:
    """Any subset of ``announce`` and ``browse`` (true or false); 422 naming
    ``discovery.<key>`` for anything else, and nothing changes."""
    doc = call.json_object()
    changes: dict[str, bool] = {}
    for field, value in doc.items():
        if field in READ_ONLY:
            continue
        if field not in FIELDS:
            raise ConfigError(field, f"unknown field; expected one of {', '.join(FIELDS)}")
        if not isinstance(value, bool):
            raise ConfigError(f"discovery.{field}", "expected true or false")
        changes[field] = value

    def change(old: Config) -> Config:
        return attrs.evolve(old, discovery=attrs.evolve(old.discovery, **changes))

    with saving("the settings"):
        stored = await call.ctx.settings.edit(change)
    return 200, discovery_view(stored, _external(call))


def discovered(call: Call) -> tuple[int, Any]:
    """The computers found on the LAN (SPEC §14); nobody is contacted for this."""
    switch = call.ctx.discovery
    return 200, [] if switch is None else switch.computers()
