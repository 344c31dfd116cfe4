"""``sluice status``: ask the running gateway, over its local listener, how it is doing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from proxy.server import STATE_FILE


def _client(state: dict[str, Any]) -> tuple[httpx.Client, str]:
    if state.get("socketPath"):
        transport = httpx.HTTPTransport(uds=state["socketPath"])
        return httpx.Client(transport=transport, timeout=5), "http://localhost"
    port = state.get("localTcpPort") or state.get("tcpPort")
    return httpx.Client(timeout=5), f"http://127.0.0.1:{port}"


def fetch_status(data_dir: Path) -> dict[str, Any]:
    """The gateway's /api/v1/inference/status; raises OSError/httpx.HTTPError when it is
    not running."""
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        raise OSError(f"no gateway is running for {data_dir}") from None
    client, base = _client(state)
    with client:
        reply = client.get(base + "/api/v1/inference/status")
        reply.raise_for_status()
        result: dict[str, Any] = reply.json()
        return result


def show(status: dict[str, Any]) -> str:
    where = status.get("socketPath") or f"127.0.0.1:{status.get('localTcp')}"
    lines = [f"gateway: running; local socket {where}; "
             f"TCP port {status.get('routerPort') or 'off'}",
             f"models: {', '.join(status['loadedModels']) or '(none available)'}"]
    for backend in status.get("backends", []):
        state = "online" if backend["online"] else f"offline ({backend['lastError']})"
        lines.append(f"  backend {backend['name']}: {state}")
    for model in status.get("managedModels", []):
        lines.append(f"  model server {model['name']}: {model['state']}, pid {model['pid']}, "
                     f"{model['address'] or 'no address'}, restarts {model['restarts']}"
                     + (f", last error: {model['lastError']}" if model["lastError"] else ""))
    return "\n".join(lines)


def status_main(data_dir: Path, as_json: bool) -> int:
    try:
        status = fetch_status(data_dir)
    except (OSError, httpx.HTTPError) as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else show(status))
    return 0
