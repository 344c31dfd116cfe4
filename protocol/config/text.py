"""config.yaml as text, both ways: :func:`parse_config_text` (load, complete, derive,
validate) and :func:`dump_config_yaml` (a complete, commented file that parses back equal)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import yaml

from protocol.config.convert import config_to_dict, describe, structure_config
from protocol.config.schema import STRATEGIES, Config, rebuild_health_check
from protocol.config.validate import validate_config
from protocol.errors import ConfigError
from protocol.yaml_loader import load_yaml

__all__ = ["config_from_data", "dump_config_yaml", "parse_config_text"]


def parse_config_text(text: str) -> Config:
    """Parse, complete (missing keys take their defaults), derive and validate a config.

    An empty file gives :func:`default_config`. ``timeouts.health_check`` is always rebuilt
    from ``health_checks``. Raises :class:`ConfigError` for the first problem found.
    """
    data = load_yaml(text)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", "the top level of the config must be a mapping, "
                              f"not {describe(data)}")
    return config_from_data(data)


def config_from_data(data: Mapping[str, Any]) -> Config:
    """A config from YAML data, as config.yaml is read: structured (missing keys take their
    defaults), ``timeouts.health_check`` derived, validated. Also the end of every settings
    write (:func:`protocol.config.writes.apply_write`)."""
    cfg = rebuild_health_check(structure_config(data))
    validate_config(cfg)
    return cfg


_HEADER = """\
# sluice configuration. Hand edits are fine; the gateway rewrites this file (atomically)
# whenever a setting changes. Unknown keys are refused. Durations: 500ms, 30s, 5m, 1h or a
# number of seconds. Sizes: bytes, KiB, MiB, GiB. Secrets live in secrets.yaml, not here.
"""

_SECTION_NOTES: Final = {
    "backends": "local model servers (llama.cpp, vLLM, Ollama, LM Studio...), e.g.\n"
                "#   - name: llama\n"
                "#     url: http://127.0.0.1:8080   # or unix:/path/to/model.sock\n"
                "#     kind: llm                    # llm | diffusion | embedding\n"
                "#     max_concurrent: null         # its slots when it reports none\n"
                "#     apis: auto                   # auto | native | translate (Messages,\n"
                "#                                  # Responses -> Chat Completions)",
    "models": "managed llama.cpp servers, e.g.\n"
              "#   - name: smollm2-135m             # the model id clients ask for\n"
              "#     path: models/model.gguf        # relative to the data dir\n"
              "#     context: 2048\n"
              "#     parallel: 2                    # concurrent slots\n"
              "#     threads: 0                     # 0 = all cores\n"
              "#     keep_alive: null               # null = model_loading.keep_alive\n"
              "#     preload: false                 # true: loaded at start and after idle\n"
              "#     max_concurrent: null           # cap on its slots (default: parallel)",
    "nodes": "network nodes, e.g.\n"
             "#   - fingerprint: node-abc\n"
             "#     name: studio-mac\n"
             "#     base_url: http://192.168.1.50:39080\n"
             "#     priority: 5                    # 1..255, unique; largest = first\n"
             "#     enabled: true                  # included in routing\n"
             "#     weight: 1                      # 1..100, its share under weighted\n"
             "#     pin: sha256:9f86d0...          # its certificate, set by pairing",
    "discovery": "mDNS/DNS-SD on the LAN; both off until the user turns them on",
    "aliases": "names clients send -> models that exist; a model that exists is never\n"
               "# aliased; else an exact name, else the first matching pattern in this order\n"
               "# ('*' matches any characters), e.g.\n"
               "#   gpt-4o: smollm2-135m\n"
               "#   claude-*: qwen2.5-coder-7b",
}

_KEY_NOTES: Final = {
    ("api", "enabled"): "TCP API server; false = Unix socket only",
    ("api", "allow_external_access"): "true binds 0.0.0.0 (and ::); remote clients need a key",
    ("api", "require_auth"): "true: loopback TCP clients need an access key too",
    ("api", "allowed_hosts"): "extra Host names accepted on TCP (DNS-rebinding guard)",
    ("api", "allowed_origins"): "extra browser origins allowed (CORS)",
    ("api", "max_connections"): "client connections held at once",
    ("local", "socket_dir"): "custom socket folder, at most 62 bytes, applied at restart",
    ("local", "fallback_port"): "loopback TCP port used only when no socket folder works",
    ("ollama_api", "port"): "0 = off; e.g. 11434: a loopback listener for Ollama apps",
    ("api", "node_port"): "TLS 1.3 for paired gateways, with external access; 0 = none",
    ("discovery", "announce"): "takes effect only with api.allow_external_access",
    ("discovery", "browse"): "takes effect only with load_balancing.enabled",
    ("load_balancing", "strategy"): " | ".join(STRATEGIES),
    ("load_balancing", "prefer_loaded"): "nodes that have the model loaded first",
    ("load_balancing", "spill_over"): "true: local slots all busy -> a node with a free one",
    ("affinity", "block_chars"): "prefix block size, in characters of the prompt text",
    ("affinity", "max_blocks"): "index cap (all candidates together), least recently used out",
    ("affinity", "load_bound"): "waiting requests a warm candidate may have beyond the "
                                "least busy",
    ("model_loading", "keep_alive"): "idle time before a model stops; 0s: after each answer",
    ("model_loading", "max_loaded"): "at most this many loaded at once; 0 = no count limit",
    ("model_loading", "memory_budget"): "auto = 75% of physical RAM, or a size (12GiB)",
    ("model_loading", "dirs"): "folders (relative to the data dir) scanned for *.gguf",
    ("scheduling", "queue"): "false: send at once, as before (no queue in sluice)",
    ("scheduling", "max_waiting"): "per model; beyond -> 429 queue_full with Retry-After",
    ("scheduling", "promote_after"): "a batch request waiting this long is interactive",
    ("request", "queue"): "the longest wait for a slot -> 504 queue_timeout (max 1h)",
    ("timeouts", "model_load"): "a model server's start must answer within this (max 10m)",
    ("observability", "request_log_size"): "finished requests kept for /api/v1/requests "
                                           "(0 = off)",
    ("timeouts", "health_check"): "generated from health_checks on every write",
}


def _annotate(section: str, lines: list[str]) -> list[str]:
    """Each key's note: a section's own keys by (section, key), the keys of a mapping one
    level down by (its key, key)."""
    out = []
    parent = ""
    for line in lines:
        note = None
        if line.startswith("  ") and line[2:3] != " ":
            parent = line[2:].split(":", 1)[0]
            note = _KEY_NOTES.get((section, parent))
        elif line.startswith("    ") and line[4:5] not in (" ", "-"):
            note = _KEY_NOTES.get((parent, line[4:].split(":", 1)[0]))
        out.append(f"{line}   # {note}" if note else line)
    return out


def dump_config_yaml(cfg: Config) -> str:
    """A complete, commented config.yaml that parses back to an equal :class:`Config`."""
    parts = [_HEADER]
    for section, value in config_to_dict(cfg).items():
        note = _SECTION_NOTES.get(section)
        if note:
            parts.append(f"# {note}\n")
        text = yaml.safe_dump({section: value}, sort_keys=False, default_flow_style=False,
                              allow_unicode=True, width=1 << 16)
        parts.append("\n".join(_annotate(section, text.splitlines())) + "\n")
    return "".join(parts)
