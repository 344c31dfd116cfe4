"""The data folder (SPEC §2) as both sides know it: where it is, the names of its files, and
the state file by which a running gateway tells the CLI where it listens.

Shared by the gateway and the CLI, so it imports nothing of either (stdlib, ``proxy.files``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from proxy.files import atomic_write

__all__ = [
    "CONFIG_FILE", "NODE_ID_FILE", "SECRETS_FILE", "STATE_FILE", "GatewayState",
    "ServerRecord", "make_data_dir", "read_state", "resolve_data_dir", "write_state",
]

CONFIG_FILE = "config.yaml"
SECRETS_FILE = "secrets.yaml"
NODE_ID_FILE = "node.id"
STATE_FILE = "state.json"  # where the running gateway listens (for the CLI)


def resolve_data_dir(arg: str | None) -> Path:
    """``--data-dir``, else ``$SLUICE_DATA_DIR``, else ``$XDG_DATA_HOME/sluice``, else
    ``~/.local/share/sluice``."""
    if arg:
        return Path(arg).expanduser().absolute()
    env = os.environ.get("SLUICE_DATA_DIR")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore relative paths
        return Path(xdg) / "sluice"
    return Path.home() / ".local" / "share" / "sluice"


def make_data_dir(data_dir: Path) -> None:
    """Create the data folder (and its parents) with mode 0700 if it does not exist."""
    if not data_dir.exists():
        data_dir.mkdir(mode=0o700, parents=True)
        os.chmod(data_dir, 0o700)  # whatever the umask says


@attrs.frozen
class ServerRecord:
    """A model server the gateway runs (SPEC §11): its pid and when that process started
    (so a pid reused by another process is never taken for it), for a next gateway to stop
    it should this one die without stopping it."""

    name: str
    pid: int
    start_time: str
    stop_signal: str = "SIGTERM"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "startTime": self.start_time,
                "stopSignal": self.stop_signal}

    @classmethod
    def from_json(cls, doc: object) -> ServerRecord | None:
        if not isinstance(doc, dict):
            return None
        pid, start = _int(doc.get("pid")), doc.get("startTime")
        if pid is None or pid <= 0 or not isinstance(start, str) or not start:
            return None
        name, sig = doc.get("name"), doc.get("stopSignal")
        return cls(name if isinstance(name, str) else "", pid, start,
                   sig if isinstance(sig, str) else "SIGTERM")


@attrs.frozen
class GatewayState:
    """What state.json says: the gateway's pid and where it listens (its local socket, else
    the loopback TCP port used when no socket folder works; and the API port and the node
    listener's TLS port, if any); and the model servers it runs."""

    pid: int
    socket_path: str | None = None
    local_tcp_port: int | None = None
    tcp_port: int | None = None
    node_port: int | None = None
    model_servers: tuple[ServerRecord, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "socketPath": self.socket_path,
                "localTcpPort": self.local_tcp_port, "tcpPort": self.tcp_port,
                "nodePort": self.node_port,
                "modelServers": [record.to_json() for record in self.model_servers]}


def write_state(data_dir: Path, state: GatewayState) -> None:
    """Write ``<data dir>/state.json`` atomically, mode 0600."""
    atomic_write(data_dir / STATE_FILE, json.dumps(state.to_json()).encode(), 0o600)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_state(data_dir: Path) -> GatewayState | None:
    """The state a gateway wrote for this data folder; None when there is none (no gateway
    runs, or the file cannot be read as a state)."""
    try:
        doc = json.loads((data_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    socket_path = doc.get("socketPath")
    return GatewayState(pid=_int(doc.get("pid")) or 0,
                        socket_path=socket_path if isinstance(socket_path, str) else None,
                        local_tcp_port=_int(doc.get("localTcpPort")),
                        tcp_port=_int(doc.get("tcpPort")),
                        node_port=_int(doc.get("nodePort")),
                        model_servers=tuple(filter(None, map(
                            ServerRecord.from_json, _list(doc.get("modelServers"))))))


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []
