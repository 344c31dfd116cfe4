"""The CLI's side of the admin API. It finds the running gateway through
``<data dir>/state.json`` (its local socket, or the loopback TCP port used when no socket
folder works) and sends the admin token read from secrets.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from protocol.errors import ConfigError
from protocol.secrets import Secrets
from proxy.datadir import SECRETS_FILE, GatewayState, read_state

__all__ = ["CliError", "admin_token", "call", "fetch_pool", "fetch_status"]

TIMEOUT = 5.0  # seconds for one admin call


class CliError(Exception):
    """What the user is told (exit 1)."""


def _client(state: GatewayState, timeout: float = TIMEOUT) -> tuple[httpx.Client, str]:
    if state.socket_path:
        transport = httpx.HTTPTransport(uds=state.socket_path)
        return httpx.Client(transport=transport, timeout=timeout), "http://localhost"
    port = state.local_tcp_port or state.tcp_port
    return httpx.Client(timeout=timeout), f"http://127.0.0.1:{port}"


def admin_token(data_dir: Path) -> str | None:
    """The admin token from ``<data dir>/secrets.yaml``; None when there is none."""
    path = data_dir / SECRETS_FILE
    try:
        return Secrets.from_text(path.read_text(encoding="utf-8"), str(path)).admin_token or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ConfigError) as exc:
        raise CliError(f"cannot read the admin token from {path}: "
                       f"{getattr(exc, 'message', None) or exc.__class__.__name__}") from None


def call(data_dir: Path, method: str, path: str, body: Any = None, *,
         admin: bool = False, timeout: float = TIMEOUT) -> Any:
    """One admin API call to the running gateway; its JSON answer. Raises CliError."""
    state = read_state(data_dir)
    if state is None:
        raise CliError(f"no gateway is running for {data_dir}")
    headers = {}
    if admin:
        token = admin_token(data_dir)
        if token is None:
            raise CliError(f"no admin token in {data_dir / SECRETS_FILE}")
        headers["authorization"] = f"Bearer {token}"
    client, base = _client(state, timeout)
    try:
        with client:
            reply = client.request(method, base + path, json=body, headers=headers)
    except (OSError, httpx.HTTPError) as exc:
        raise CliError(f"cannot reach the gateway for {data_dir}: {exc}") from None
    try:
        doc = reply.json()
    except ValueError:
        doc = None
    if reply.status_code >= 400:
        message = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
        raise CliError(f"{method} {path}: {reply.status_code} {message or reply.reason_phrase}")
    return doc


def _optional(data_dir: Path, path: str) -> Any:
    """One read the status can do without: None when it fails (an older gateway answers
    404 for an endpoint it does not have)."""
    try:
        return call(data_dir, "GET", path)
    except CliError:
        return None


def fetch_pool(data_dir: Path) -> dict[str, Any]:
    """The three views of the node pool, each None when the gateway does not give it:
    ``distributedStatus`` (GET /api/v1/pool/distributed-status: health of the enabled
    nodes), ``routingStats`` (GET /api/v1/pool/routing-stats: counters and circuit
    breakers) and ``nodes`` (GET /api/v1/nodes: the registry, disabled nodes included)."""
    return {"distributedStatus": _optional(data_dir, "/api/v1/pool/distributed-status"),
            "routingStats": _optional(data_dir, "/api/v1/pool/routing-stats"),
            "nodes": _optional(data_dir, "/api/v1/nodes")}


def fetch_status(data_dir: Path) -> dict[str, Any]:
    """The gateway's /api/v1/inference/status plus its notifications and, under ``pool``,
    the node pool (see :func:`fetch_pool`)."""
    status: dict[str, Any] = call(data_dir, "GET", "/api/v1/inference/status")
    try:
        status["notifications"] = call(data_dir, "GET",
                                       "/api/v1/notifications")["notifications"]
    except (CliError, KeyError, TypeError):
        status["notifications"] = []
    status["pool"] = fetch_pool(data_dir)
    return status
