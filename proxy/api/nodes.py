"""The node registry (SPEC §8 "Nodes"): ``/api/v1/nodes`` and ``/api/v1/node/identity``.
A node added with a ``pairingCode`` (SPEC §14) gives its fingerprint and a key for the code
(:mod:`proxy.lan.pairing_client`) instead of being asked who it is.

Nodes live in config.yaml (``nodes:``), their API keys in secrets.yaml (``node_keys``). The
order is the priority: the first node has the largest, the last 1; priorities stay unique in
1..255. Every change is a function of the registry as it is, made by the settings
(:meth:`Settings.edit_nodes`): secrets.yaml (when a key changes) and then config.yaml, each
atomically; if the second write fails the first is undone, so the two always agree. A key is
never echoed: not in answers (``hasApiKey`` only), errors, logs or ``repr()``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
from typing import Any

import attrs
import trio

from protocol.access import check_api_key
from protocol.config import Config, NodeConfig, by_priority
from protocol.config.fields import NODES, check_fields
from protocol.config.writes import structure_field
from protocol.errors import ConfigError, SluiceError, Source, no_such_item, node_exists
from protocol.lan.pairing import CODE_DIGITS, normalize_code
from protocol.names import LABEL_RULE, is_fingerprint, is_label
from protocol.rebinding import is_loopback_ip
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from protocol.views import node_entry, registry_view
from proxy.api.call import Call, saving
from proxy.lan.pairing_client import claim_key, computer_name
from proxy.lan.pairing_join import join, node_port_of
from proxy.settings.store import NodesChange
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import fetch

log = logging.getLogger("sluice.nodes")

PREFIX = "/api/v1/nodes/"
IDENTITY_PATH = b"/api/v1/node/identity"
IDENTITY_TIMEOUT = 3.0  # seconds, at most, to ask a new node who it is
MAX_PRIORITY = 255
RESERVED = frozenset({"order", "routing-stats"})  # sub-paths of /api/v1/nodes/
ADD_FIELDS = ("baseUrl", "apiKey", "name", "weight", "pairingCode")  # what a POST may hold
PATCH_FIELDS = ("name", "enabled", "apiKey", "baseUrl", "weight")


def version() -> str:
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
        return "0+unknown"


def identity(call: Call) -> tuple[int, Any]:
    """``{fingerprint, version}`` (SPEC §8) and ``identity``: the certificate's pin (§16)."""
    pin = call.ctx.identity
    return 200, {"fingerprint": call.ctx.settings.node_id, "version": version(),
                 "identity": None if pin is None else pin.fingerprint}


# ------------------------------------------------------------------------------ helpers


def _renumber(nodes: list[NodeConfig]) -> tuple[NodeConfig, ...]:
    """Priorities N..1 in the given order."""
    count = len(nodes)
    return tuple(attrs.evolve(n, priority=count - i) for i, n in enumerate(nodes))


def _base_url(value: object) -> tuple[str, UpstreamAddress]:
    """A node URL as stored (no trailing slash) and its parsed address; 422 naming
    ``baseUrl`` otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("baseUrl", "expected http://host[:port][/base]")
    url = value.strip().rstrip("/")
    if not url.startswith("http://"):
        raise ConfigError("baseUrl", "expected http://host[:port][/base]")
    try:
        return url, parse_upstream_url(url)
    except ValueError as exc:
        raise ConfigError("baseUrl", str(exc)) from None


def _name(value: object) -> str:
    if not is_label(value):
        raise ConfigError("name", LABEL_RULE)
    return value.strip()


def _api_key(value: object) -> str:
    check_api_key("apiKey", value)  # names the field, never the value
    assert isinstance(value, str)
    return value


def _pairing_code(doc: dict[str, Any]) -> str | None:
    """``pairingCode`` (SPEC §14) as six digits; None when not given. Never with
    ``apiKey``: the code is how the node's key is got."""
    if doc.get("pairingCode") is None:
        return None
    if doc.get("apiKey") is not None:
        raise ConfigError("pairingCode", "give either apiKey or pairingCode, not both")
    code = normalize_code(doc["pairingCode"])
    if code is None:
        raise ConfigError("pairingCode", f"expected the {CODE_DIGITS}-digit code the other "
                                         "computer shows (sluice pair), as a string")
    return code


def _weight(value: object) -> int:
    """A whole number (the converter's rule, 422 naming ``weight``); whether it is within
    the limits is the config's rule (422 naming ``weight`` from :func:`commit`)."""
    weight: int = structure_field(NODES, "weight", value)
    return weight


def derived_fingerprint(address: UpstreamAddress) -> str:
    """A stable fingerprint for a node that does not say who it is: from its address, so
    ``http://h`` and ``http://h:80/`` give the same one."""
    digest = hashlib.sha256(f"{address.key}{address.base_path}".encode()).hexdigest()
    return f"node-{digest[:16]}"


async def ask_identity(call: Call, address: UpstreamAddress, key: str | None) -> str | None:
    """The node's own fingerprint from its ``GET /api/v1/node/identity``; None when it does
    not answer one in time (or answers something that is not a fingerprint)."""
    with trio.move_on_after(min(IDENTITY_TIMEOUT, call.ctx.config.timeouts.health_check.timeout)):
        try:
            status, body = await fetch(call.ctx.connections, address, IDENTITY_PATH, api_key=key,
                                       cap=64 * 1024)
        except (UpstreamFailure, OSError, ValueError) as exc:
            log.info("node %r did not answer its identity: %s", address, type(exc).__name__)
            return None
        if status != 200:
            log.info("node %r answered its identity with status %d", address, status)
            return None
        try:
            fingerprint = json.loads(body).get("fingerprint")
        except (ValueError, AttributeError, UnicodeDecodeError):
            return None
        if is_fingerprint(fingerprint) and fingerprint not in RESERVED:
            return fingerprint
        return None
    log.info("node %r did not answer its identity within %ss", address, IDENTITY_TIMEOUT)
    return None


async def commit(call: Call, change: NodesChange) -> Config:
    """Make ``change`` to the registry through the settings, which validate it, write
    secrets.yaml (when a key changed) and then config.yaml, and undo the first write if the
    second fails. A refused change answers 422 naming the JSON field where there is one; a
    failed write 500; either way nothing changes."""
    try:
        with saving("the node registry"):
            return await call.ctx.settings.edit_nodes(change)
    except ConfigError as exc:
        raise NODES.renamed(exc) from None


def _discovered_name(call: Call, fingerprint: str) -> str:
    """The name a computer announced on the LAN (SPEC §14), if it was found there and the
    name is one a node may have; else "" (the URL's host names it)."""
    switch = call.ctx.discovery
    found_here = [] if switch is None else switch.computers()
    for found in found_here:
        if found["fingerprint"] == fingerprint and is_label(found["name"]):
            return str(found["name"])
    return ""


def _fingerprint(call: Call) -> str:
    return call.path[len(PREFIX):]


def _find(cfg: Config, fingerprint: str) -> NodeConfig:
    for node in cfg.nodes:
        if node.fingerprint == fingerprint:
            return node
    raise no_such_item("node", "fingerprint", fingerprint)


def _saved(cfg: Config, fingerprint: str) -> NodeConfig:
    return next(n for n in cfg.nodes if n.fingerprint == fingerprint)


def _check_room(cfg: Config) -> None:
    if len(cfg.nodes) >= MAX_PRIORITY:
        raise ConfigError("nodes", f"at most {MAX_PRIORITY} nodes can be registered")


# ----------------------------------------------------------------------------- handlers


def list_nodes(call: Call) -> tuple[int, Any]:
    return 200, registry_view(call.ctx.config, call.ctx.settings.secrets.node_keys)


def _on_this_machine(address: UpstreamAddress) -> bool:
    host = address.host or ""
    return host == "localhost" or is_loopback_ip(host)


async def _pair(call: Call, address: UpstreamAddress, url: str,
                code: str) -> tuple[str, str, str | None, str]:
    """Pair with the gateway at ``url`` by its code: ``(fingerprint, access key, pin,
    its name)``. Over its node port with SPAKE2 when it has one (SPEC §16: the node is then
    pinned); else, only for a gateway on this machine, §14's claim, with no pin."""
    ctx = call.ctx
    timeout = ctx.config.timeouts.connection
    node_port = await node_port_of(ctx.connections, address, url, connect_timeout=timeout)
    if node_port is None and not _on_this_machine(address):
        # Never the clear-text claim across the network: whoever answered GET /health could
        # be someone in between, asking for the code (SPEC §16: it is served locally only).
        raise ConfigError("baseUrl", f"{url} names no node port in GET /health, so the code "
                                     "cannot be proved over TLS: turn on external access on "
                                     "that computer and restart it (a sluice without pinned "
                                     "links cannot pair by code over the network)")
    if node_port is None:
        fingerprint, key = await claim_key(
            ctx.connections, address, url, code=code, fingerprint=ctx.settings.node_id,
            name=computer_name(), connect_timeout=timeout)
        return fingerprint, key, None, ""
    if ctx.identity is None:
        raise SluiceError(503, "this gateway has no identity (identity/ in its data dir) to "
                               "pair with; restart it", type="server_error",
                          code="no_identity", source=Source.GATEWAY)
    joined = await join(address, node_port, url, code=code, identity=ctx.identity,
                        node_id=ctx.settings.node_id, name=computer_name(),
                        connect_timeout=timeout)
    return joined.node_id, joined.access_key, joined.pin, joined.name


async def add_node(call: Call) -> tuple[int, Any]:
    doc = call.json_object()
    check_fields(doc, ADD_FIELDS)
    url, address = _base_url(doc.get("baseUrl"))
    code = _pairing_code(doc)
    key = _api_key(doc["apiKey"]) if doc.get("apiKey") is not None else None
    name = _name(doc["name"]) if doc.get("name") is not None else ""
    weight = _weight(doc["weight"]) if doc.get("weight") is not None else 1
    ctx = call.ctx
    if code is None:
        _check_room(ctx.config)  # before asking the node (a code may pair a known one again)
    pin: str | None = None
    if code is not None:  # SPEC §14, §16: the node gives its fingerprint and a key for the code
        fingerprint, key, pin, given = await _pair(call, address, url, code)
        name = name or given
    else:
        fingerprint = await ask_identity(call, address, key) or derived_fingerprint(address)
    if fingerprint == ctx.settings.node_id:
        raise ConfigError("baseUrl", "that URL is this gateway itself")
    name = name or _discovered_name(call, fingerprint)

    repaired = False

    def change(cfg: Config, keys: dict[str, str]) -> tuple[Config, dict[str, str]]:
        # The registry as it is now: another change may have landed during the wait.
        nonlocal repaired
        known = next((n for n in cfg.nodes if n.fingerprint == fingerprint), None)
        if known is not None and pin is not None:  # SPEC §16: paired again, pinned anew
            repaired = True
            again = attrs.evolve(known, base_url=url, pin=pin)
            assert key is not None
            keys[fingerprint] = key
            return attrs.evolve(cfg, nodes=tuple(again if n is known else n
                                                 for n in cfg.nodes)), keys
        _check_room(cfg)
        if known is not None:
            raise node_exists(fingerprint)
        current = by_priority(cfg.nodes)
        lowest = current[-1].priority if current else MAX_PRIORITY + 1
        node = NodeConfig(fingerprint=fingerprint, name=name or (address.host or url),
                          base_url=url, priority=lowest - 1, enabled=True, weight=weight,
                          pin=pin)
        nodes = (*current, node) if lowest > 1 else _renumber([*current, node])
        keys.pop(fingerprint, None)  # never inherit a stale key
        if key is not None:
            keys[fingerprint] = key
        return attrs.evolve(cfg, nodes=nodes), keys

    stored = await commit(call, change)
    log.info("node %s %s (%s)", fingerprint, "paired again" if repaired else "added", url)
    return 200 if repaired else 201, node_entry(_saved(stored, fingerprint),
                                                ctx.settings.secrets.node_keys)


async def patch_node(call: Call) -> tuple[int, Any]:
    fingerprint = _fingerprint(call)
    _find(call.ctx.config, fingerprint)  # 404 before looking at the body
    doc = call.json_object()
    check_fields(doc, PATCH_FIELDS)
    changes: dict[str, Any] = {}
    name = _name(doc["name"]) if "name" in doc else None
    if "enabled" in doc:
        changes["enabled"] = structure_field(NODES, "enabled", doc["enabled"])
    if "baseUrl" in doc:
        changes["base_url"] = _base_url(doc["baseUrl"])[0]
    if "weight" in doc:
        changes["weight"] = _weight(doc["weight"])
    clear_key = "apiKey" in doc and (doc["apiKey"] is None or doc["apiKey"] == "")
    new_key = _api_key(doc["apiKey"]) if "apiKey" in doc and not clear_key else None

    def change(cfg: Config, keys: dict[str, str]) -> tuple[Config, dict[str, str]]:
        node = _find(cfg, fingerprint)
        named: dict[str, Any] = {} if name is None else {"name": name or node.name}
        updated = attrs.evolve(node, **changes, **named)
        if clear_key:
            keys.pop(fingerprint, None)
        elif new_key is not None:
            keys[fingerprint] = new_key
        nodes = tuple(updated if n.fingerprint == fingerprint else n for n in cfg.nodes)
        return attrs.evolve(cfg, nodes=nodes), keys

    stored = await commit(call, change)
    return 200, node_entry(_saved(stored, fingerprint), call.ctx.settings.secrets.node_keys)


async def delete_node(call: Call) -> tuple[int, Any]:
    fingerprint = _fingerprint(call)

    def change(cfg: Config, keys: dict[str, str]) -> tuple[Config, dict[str, str]]:
        _find(cfg, fingerprint)
        keys.pop(fingerprint, None)
        nodes = tuple(n for n in cfg.nodes if n.fingerprint != fingerprint)
        return attrs.evolve(cfg, nodes=nodes), keys

    await commit(call, change)
    log.info("node %s removed", fingerprint)
    return 200, {"fingerprint": fingerprint, "deleted": True}


async def put_order(call: Call) -> tuple[int, Any]:
    doc = call.json_object()
    check_fields(doc, ("order",))
    order = doc.get("order")
    if not isinstance(order, list) or not all(isinstance(fp, str) for fp in order):
        raise ConfigError("order", "expected a list of node fingerprints")
    if len(set(order)) != len(order):
        raise ConfigError("order", "a fingerprint is listed more than once")

    def change(cfg: Config, keys: dict[str, str]) -> tuple[Config, dict[str, str]]:
        by_fp = {n.fingerprint: n for n in cfg.nodes}
        unknown = [fp for fp in order if fp not in by_fp]
        if unknown:
            raise ConfigError("order", f"no node with fingerprint {unknown[0][:64]!r}")
        missing = [fp for fp in by_fp if fp not in order]
        if missing:
            raise ConfigError("order", f"every node must be listed; missing {missing[0]!r}")
        return attrs.evolve(cfg, nodes=_renumber([by_fp[fp] for fp in order])), keys

    await commit(call, change)
    return list_nodes(call)
