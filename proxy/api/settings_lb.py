"""``GET|PUT /api/v1/settings/load-balancing`` and ``GET|PUT /api/v1/settings/timeouts``
(SPEC §8). Both apply live: the gateway reads ``settings.config`` on every request.

A PUT takes any subset of the fields. The change is made on the whole config as YAML data
and parsed back exactly as config.yaml is at start, so a PUT is held to the same rules
(§3.1) and its errors name the same dotted YAML paths (``timeouts.request.streaming.total``);
a refused PUT answers 422 and changes nothing. Durations come back as strings (``"30s"``);
a PUT may give strings or numbers of seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from protocol.config import Config, config_to_dict, parse_config_text
from protocol.durations import format_duration
from protocol.errors import ConfigError
from proxy.api.call import Call, saving

# JSON field -> (YAML section, YAML key)
LB_FIELDS: dict[str, tuple[str, str]] = {
    "enabled": ("load_balancing", "enabled"),
    "strategy": ("load_balancing", "strategy"),
    "failoverEnabled": ("load_balancing", "failover_enabled"),
    "preferLoaded": ("load_balancing", "prefer_loaded"),
    "healthCheckInterval": ("health_checks", "interval"),
}


Edit = Callable[[dict[str, Any]], None]
"""A change made on the whole config as YAML data (in place)."""


async def _apply(call: Call, edit: Edit, renames: dict[str, str] | None = None) -> Config:
    """Make ``edit`` on the current config's YAML data, parse the result as a whole config
    and save it; 422 naming the dotted path otherwise, 500 when the file cannot be written.
    """
    def change(cfg: Config) -> Config:
        data = config_to_dict(cfg)
        edit(data)
        return parse_config_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))

    try:
        with saving("the settings"):
            return await call.ctx.settings.edit(change)
    except ConfigError as exc:
        for written, asked in (renames or {}).items():
            if exc.path == written or exc.path.startswith(written + "."):
                raise ConfigError(asked + exc.path[len(written):],
                                  exc.message.split(": ", 1)[-1]) from None
        raise


def load_balancing_view(cfg: Config) -> dict[str, Any]:
    """The GET body (also the ``settings`` event of section ``loadBalancing``)."""
    lb = cfg.load_balancing
    return {"enabled": lb.enabled, "strategy": lb.strategy,
            "failoverEnabled": lb.failover_enabled, "preferLoaded": lb.prefer_loaded,
            "healthCheckInterval": format_duration(cfg.health_checks.interval)}


def get_load_balancing(call: Call) -> tuple[int, Any]:
    return 200, load_balancing_view(call.ctx.config)


async def put_load_balancing(call: Call) -> tuple[int, Any]:
    doc = call.json_object()
    for field in doc:
        if field not in LB_FIELDS:
            raise ConfigError(field, f"unknown field; expected one of {', '.join(LB_FIELDS)}")

    def edit(data: dict[str, Any]) -> None:
        for field, value in doc.items():
            section, key = LB_FIELDS[field]
            data[section][key] = value

    return 200, load_balancing_view(await _apply(call, edit))


def timeouts_view(cfg: Config) -> dict[str, Any]:
    """The GET body (also the ``settings`` event of section ``timeouts``)."""
    view: dict[str, Any] = config_to_dict(cfg)["timeouts"]
    return view


def get_timeouts(call: Call) -> tuple[int, Any]:
    return 200, timeouts_view(call.ctx.config)


def _merge(target: dict[str, Any], changes: dict[str, Any], path: str) -> None:
    """Deep-merge ``changes`` into ``target``; an unknown key is refused with its path."""
    for key, value in changes.items():
        where = f"{path}.{key}"
        if key not in target:
            raise ConfigError(where, f"unknown key {key!r}")
        if isinstance(target[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(where, "expected a mapping of keys")
            _merge(target[key], value, where)
        else:
            target[key] = value


async def put_timeouts(call: Call) -> tuple[int, Any]:
    """The ``timeouts`` tree, any subset. ``health_check`` is generated from
    ``health_checks`` (§3.2): values given for it are written there, then regenerated."""
    doc = call.json_object()

    def edit(data: dict[str, Any]) -> None:
        _merge(data["timeouts"], doc, "timeouts")
        given = doc.get("health_check")
        if isinstance(given, dict):
            data["health_checks"].update(given)

    renames = {"health_checks": "timeouts.health_check"}
    return 200, timeouts_view(await _apply(call, edit, renames))
