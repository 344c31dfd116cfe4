"""The CLI's side of the admin API: ``sluice status``, ``sluice keys`` and ``sluice nodes``.
It finds the running gateway through ``<data dir>/state.json`` (its local socket, or the
loopback TCP port used when no socket folder works) and sends the admin token read from
secrets.yaml."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from protocol.errors import ConfigError
from proxy.server import STATE_FILE
from proxy.settings import SECRETS_FILE, Secrets


class CliError(Exception):
    """What the user is told (exit 1)."""


def _client(state: dict[str, Any]) -> tuple[httpx.Client, str]:
    if state.get("socketPath"):
        transport = httpx.HTTPTransport(uds=state["socketPath"])
        return httpx.Client(transport=transport, timeout=5), "http://localhost"
    port = state.get("localTcpPort") or state.get("tcpPort")
    return httpx.Client(timeout=5), f"http://127.0.0.1:{port}"


def _admin_token(data_dir: Path) -> str | None:
    path = data_dir / SECRETS_FILE
    try:
        return Secrets.from_text(path.read_text(encoding="utf-8"), str(path)).admin_token or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ConfigError) as exc:
        raise CliError(f"cannot read the admin token from {path}: "
                       f"{getattr(exc, 'message', None) or exc.__class__.__name__}") from None


def call(data_dir: Path, method: str, path: str, body: Any = None, *,
         admin: bool = False) -> Any:
    """One admin API call to the running gateway; its JSON answer. Raises CliError."""
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        raise CliError(f"no gateway is running for {data_dir}") from None
    headers = {}
    if admin:
        token = _admin_token(data_dir)
        if token is None:
            raise CliError(f"no admin token in {data_dir / SECRETS_FILE}")
        headers["authorization"] = f"Bearer {token}"
    client, base = _client(state)
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


def fetch_status(data_dir: Path) -> dict[str, Any]:
    """The gateway's /api/v1/inference/status plus its notifications."""
    status: dict[str, Any] = call(data_dir, "GET", "/api/v1/inference/status")
    try:
        status["notifications"] = call(data_dir, "GET",
                                       "/api/v1/notifications")["notifications"]
    except (CliError, KeyError, TypeError):
        status["notifications"] = []
    return status


def show(status: dict[str, Any]) -> str:
    where = status.get("socketPath") or f"127.0.0.1:{status.get('localTcp')}"
    if status.get("localTcp"):
        where = f"(none; loopback TCP {status['localTcp']})"
    lines = [f"gateway: running; local socket {where}; "
             f"TCP port {status.get('routerPort') or 'off'}",
             f"models: {', '.join(status.get('models', [])) or '(none available)'}"]
    for backend in status.get("backends", []):
        state = "online" if backend["online"] else f"offline ({backend['lastError']})"
        lines.append(f"  backend {backend['name']}: {state}")
    for model in status.get("managedModels", []):
        lines.append(f"  model server {model['name']}: {model['state']}, pid {model['pid']}, "
                     f"{model['address'] or 'no address'}, restarts {model['restarts']}"
                     + (f", last error: {model['lastError']}" if model["lastError"] else ""))
    for note in status.get("notifications", []):
        lines.append(f"{note.get('level', 'warning')}: {note.get('message')}")
    return "\n".join(lines)


def status_main(data_dir: Path, as_json: bool) -> int:
    try:
        status = fetch_status(data_dir)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else show(status))
    return 0


def keys_main(data_dir: Path, action: str, *, name: str | None = None,
              key_id: str | None = None, as_json: bool = False) -> int:
    """``sluice keys create|list|revoke``."""
    try:
        if action == "create":
            body = {"name": name} if name else {}
            made = call(data_dir, "POST", "/api/v1/access-keys", body, admin=True)
            if as_json:
                print(json.dumps(made, indent=2))
            else:
                label = f" ({made['name']})" if made.get("name") else ""
                print(f"created access key {made['id']}{label}", file=sys.stderr)
                print(made["key"])
                print("this key is shown only once: store it now", file=sys.stderr)
        elif action == "list":
            keys = call(data_dir, "GET", "/api/v1/access-keys", admin=True)
            if as_json:
                print(json.dumps(keys, indent=2))
            elif not keys:
                print("no access keys (make one with: sluice keys create --name NAME)")
            else:
                print(f"{'ID':<16} {'NAME':<24} {'CREATED':<21} LAST USED")
                for key in keys:
                    print(f"{key['id']:<16} {key['name'] or '-':<24} {key['createdAt']:<21} "
                          f"{key['lastUsedAt'] or 'never'}")
        else:
            quoted = quote(key_id or "", safe="")
            call(data_dir, "DELETE", f"/api/v1/access-keys/{quoted}", admin=True)
            print(f"revoked access key {key_id}")
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    return 0


def _read_key(args: argparse.Namespace) -> str | None:
    """A node key from --api-key-file or --api-key-stdin (never from the command line, where
    ``ps`` would show it); surrounding whitespace and the final newline are dropped."""
    if args.api_key_file:
        try:
            text = Path(args.api_key_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the API key file {args.api_key_file}: "
                           f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}") from None
    elif args.api_key_stdin:
        text = sys.stdin.read()
    else:
        return None
    key = text.strip()
    if not key:
        raise CliError("the API key is empty")
    return key


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "no nodes (add one with: sluice nodes add http://HOST:39080)"
    lines = [f"{'#':>3} {'FINGERPRINT':<22} {'NAME':<20} {'URL':<32} {'ROUTING':<8} KEY"]
    for i, node in enumerate(nodes, 1):
        lines.append(f"{i:>3} {node['fingerprint']:<22} {node['name'] or '-':<20} "
                     f"{node['baseUrl']:<32} {'on' if node['enabled'] else 'off':<8} "
                     f"{'yes' if node['hasApiKey'] else 'no'}")
    return "\n".join(lines)


def _nodes_action(data_dir: Path, args: argparse.Namespace) -> tuple[Any, str]:
    """Run one ``sluice nodes`` action; its JSON answer and the line to print."""
    action = args.action
    if action == "list":
        nodes = call(data_dir, "GET", "/api/v1/nodes", admin=True)
        return nodes, show_nodes(nodes)
    if action == "add":
        body: dict[str, Any] = {"baseUrl": args.url}
        key = _read_key(args)
        if key is not None:
            body["apiKey"] = key
        if args.name:
            body["name"] = args.name
        node = call(data_dir, "POST", "/api/v1/nodes", body, admin=True)
        return node, (f"added node {node['fingerprint']} ({node['name']}, {node['baseUrl']}), "
                      f"last in the order")
    if action == "order":
        current = [n["fingerprint"] for n in call(data_dir, "GET", "/api/v1/nodes", admin=True)]
        first = list(args.fingerprints)
        order = first + [fp for fp in current if fp not in first]
        nodes = call(data_dir, "PUT", "/api/v1/nodes/order", {"order": order}, admin=True)
        return nodes, show_nodes(nodes)
    path = f"/api/v1/nodes/{quote(args.fingerprint, safe='')}"
    if action == "remove":
        done = call(data_dir, "DELETE", path, admin=True)
        return done, f"removed node {args.fingerprint}"
    enabled = action == "enable"
    node = call(data_dir, "PATCH", path, {"enabled": enabled}, admin=True)
    return node, f"node {args.fingerprint}: routing {'on' if enabled else 'off'}"


def nodes_main(data_dir: Path, args: argparse.Namespace) -> int:
    """``sluice nodes list|add|remove|order|enable|disable``."""
    try:
        doc, text = _nodes_action(data_dir, args)
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else text)
    return 0
