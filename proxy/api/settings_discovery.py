"""``GET|PUT /api/v1/settings/discovery`` and ``GET /api/v1/nodes/discovered`` (SPEC §14).

The settings body is ``{announce, browse, announcing, browsing}``: the two switches of
config.yaml's ``discovery:`` and what they do now (read-only, ignored in a PUT):
``announcing`` needs ``api.allow_external_access`` (and this gateway listening on every
address: that setting applies at the next start), ``browsing`` needs
``load_balancing.enabled``. Both apply live (:mod:`proxy.lan.discovery_switch`).

The discovered list is ``[{fingerprint, name, baseUrl, version, added}]``, empty while
not browsing. This module never imports :mod:`proxy.lan.discovery`.
"""

from __future__ import annotations

from typing import Any

from protocol.config.fields import DISCOVERY
from protocol.views import discovery_view
from proxy.api.call import Call
from proxy.api.settings_write import save_write

__all__ = ["DISCOVERED_PATH", "PATH", "discovered", "get_discovery", "put_discovery"]

PATH = "/api/v1/settings/discovery"
DISCOVERED_PATH = "/api/v1/nodes/discovered"


def _external(call: Call) -> bool:
    return call.ctx.listening.external


def get_discovery(call: Call) -> tuple[int, Any]:
    return 200, discovery_view(call.ctx.config, _external(call))


async def put_discovery(call: Call) -> tuple[int, Any]:
    """Any subset of ``announce`` and ``browse`` (true or false); 422 naming
    ``discovery.<key>`` for anything else, and nothing changes."""
    stored = await save_write(call, DISCOVERY, call.json_object())
    return 200, discovery_view(stored, _external(call))


def discovered(call: Call) -> tuple[int, Any]:
    """The computers found on the LAN (SPEC §14); nobody is contacted for this."""
    switch = call.ctx.discovery
    return 200, [] if switch is None else switch.computers()
