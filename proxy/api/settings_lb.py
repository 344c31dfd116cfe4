"""``GET|PUT /api/v1/settings/load-balancing`` and ``GET|PUT /api/v1/settings/timeouts``
(SPEC §8). Both apply live: the gateway reads ``settings.config`` on every request.

A PUT takes any subset of the fields (:data:`protocol.config.fields.LOAD_BALANCING`,
:data:`~protocol.config.fields.TIMEOUTS`), written on the whole config and read exactly as
config.yaml is at start, so a PUT is held to the same rules (§3.1) and its errors name the
same dotted YAML paths (``timeouts.request.streaming.total``); a refused PUT answers 422 and
changes nothing. Durations come back as strings (``"30s"``); a PUT may give strings or
numbers of seconds. The timeouts body is the ``timeouts`` tree with the YAML's own keys;
``health_check`` is generated from ``health_checks`` (§3.2): values given for it are
written there, then regenerated.
"""

from __future__ import annotations

from typing import Any

from protocol.config.fields import LOAD_BALANCING, TIMEOUTS
from protocol.views import load_balancing_view, timeouts_view
from proxy.api.call import Call
from proxy.api.settings_write import save_write


def get_load_balancing(call: Call) -> tuple[int, Any]:
    return 200, load_balancing_view(call.ctx.config)


async def put_load_balancing(call: Call) -> tuple[int, Any]:
    stored = await save_write(call, LOAD_BALANCING, call.json_object())
    return 200, load_balancing_view(stored)


def get_timeouts(call: Call) -> tuple[int, Any]:
    return 200, timeouts_view(call.ctx.config)


async def put_timeouts(call: Call) -> tuple[int, Any]:
    return 200, timeouts_view(await save_write(call, TIMEOUTS, call.json_object()))
