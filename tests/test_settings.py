import json
import os
import re
import stat
import time
from pathlib import Path

import attrs
import pytest
import trio
import yaml

import proxy.settings.config_file
import proxy.settings.store
from protocol.config import (
    Config,
    HealthChecksConfig,
    HealthCheckTimeouts,
    NodeConfig,
    default_config,
    dump_config_yaml,
    parse_config_text,
)
from protocol.errors import ConfigError
from protocol.secrets import Secrets
from proxy.datadir import GatewayState, read_state, resolve_data_dir, write_state
from proxy.settings.store import Settings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def fresh(tmp_path: Path) -> Settings:
    return Settings.open(tmp_path / "deep" / "data")


# -------------------------------------------------------------------------- data dir order


def test_resolve_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert resolve_data_dir(str(tmp_path / "arg")) == tmp_path / "arg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("SLUICE_DATA_DIR")
    assert resolve_data_dir(None) == tmp_path / "xdg" / "sluice"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert resolve_data_dir(None) == tmp_path / "home" / ".local" / "share" / "sluice"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert resolve_data_dir(None) == tmp_path / "home" / ".local" / "share" / "sluice"
    assert resolve_data_dir("~/d") == tmp_path / "home" / "d"


def test_state_file_round_trip(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None  # no gateway
    state = GatewayState(pid=42, socket_path="/run/s/sluice.sock", tcp_port=39080,
                         node_port=39443)
    write_state(tmp_path, state)
    assert mode(tmp_path / "state.json") == 0o600
    assert json.loads((tmp_path / "state.json").read_text()) == {
        "pid": 42, "socketPath": "/run/s/sluice.sock", "localTcpPort": None, "tcpPort": 39080,
        "nodePort": 39443, "modelServers": []}  # the model servers it runs (none here)
    assert read_state(tmp_path) == state
    for junk in ("", "[1]", "{", '{"pid": "x", "socketPath": 5, "tcpPort": true}'):
        (tmp_path / "state.json").write_text(junk)
        assert read_state(tmp_path) in (None, GatewayState(pid=0))


# ---------------------------------------------------------------------------- first start


def test_first_start_creates_everything(fresh: Settings) -> None:
    data_dir = fresh.data_dir
    assert mode(data_dir) == 0o700
    assert fresh.config_path == data_dir / "config.yaml"
    assert fresh.config == default_config()
    text = fresh.config_path.read_text()
    assert parse_config_text(text) == default_config()
    data = yaml.safe_load(text)
    assert list(data) == ["api", "local", "backends", "models", "load_balancing", "nodes",
                          "aliases", "ollama_api", "discovery", "model_loading", "scheduling",
                          "observability",
                          "health_checks",
                          "circuit_breaker", "timeouts"]
    assert data["timeouts"]["request"]["streaming"] == {
        "first_byte": "2m", "chunk_interval": "30s", "total": "10m"}
    assert data["timeouts"]["health_check"] == {"timeout": "4s", "interval": "5s"}
    secrets_file = data_dir / "secrets.yaml"
    assert mode(secrets_file) == 0o600
    stored = yaml.safe_load(secrets_file.read_text())
    assert stored["admin_token"] == fresh.secrets.admin_token
    assert len(fresh.secrets.admin_token) >= 40
    assert re.fullmatch(r"node-[0-9a-f]{16}", fresh.node_id)
    assert (data_dir / "node.id").read_text().strip() == fresh.node_id
    assert sorted(p.name for p in data_dir.iterdir()) == ["config.yaml", "node.id",
                                                          "secrets.yaml"]


def test_second_start_keeps_identity_and_token(fresh: Settings) -> None:
    again = Settings.open(fresh.data_dir)
    assert again.node_id == fresh.node_id
    assert again.secrets.admin_token == fresh.secrets.admin_token
    assert again.config == fresh.config


def test_existing_data_dir_is_used_as_is(tmp_path: Path) -> None:
    settings = Settings.open(tmp_path)
    assert settings.data_dir == tmp_path
    assert (tmp_path / "config.yaml").exists()


async def test_secrets_never_shown(fresh: Settings) -> None:
    token = fresh.secrets.admin_token
    fresh.secrets.node_keys["node-a"] = "node-key-value-123"
    fresh.secrets.backend_keys["llama"] = "backend-key-value-456"
    await fresh.save_secrets()
    for text in (fresh.config_path.read_text(), repr(fresh.secrets), str(fresh.secrets),
                 repr(fresh), str(fresh)):
        assert token not in text
        assert "node-key-value-123" not in text
        assert "backend-key-value-456" not in text
    assert "node_keys=1" in repr(fresh.secrets)
    assert "admin_token" not in fresh.config_path.read_text()


async def test_secrets_round_trip_and_stay_private(fresh: Settings) -> None:
    fresh.secrets.node_keys["node-a"] = "k1"
    fresh.keys.load([{"id": "ak1", "name": "phone", "hash": "h"}])
    await fresh.save_secrets()
    assert mode(fresh.secrets_path) == 0o600
    again = Settings.open(fresh.data_dir)
    assert again.secrets.node_keys == {"node-a": "k1"}
    assert again.keys.stored() == [{"id": "ak1", "name": "phone", "hash": "h"}]


def test_loose_secrets_file_is_tightened(fresh: Settings) -> None:
    os.chmod(fresh.secrets_path, 0o644)
    Settings.open(fresh.data_dir)
    assert mode(fresh.secrets_path) == 0o600


def test_broken_secrets_error_does_not_leak(tmp_path: Path) -> None:
    (tmp_path / "secrets.yaml").write_text("admin_token: supersecret\n\tnode_keys: {}\n")
    with pytest.raises(ConfigError) as info:
        Settings.open(tmp_path)
    assert "supersecret" not in str(info.value)
    assert "supersecret" not in repr(info.value)
    assert "line 2" in str(info.value)


@pytest.mark.parametrize(("text", "key", "line"), [
    ("admin_token: first-secret-value\nnode_keys: {}\nadmin_token: second-secret-value\n",
     "admin_token", 3),
    ("admin_token: t\nnode_keys:\n  node-a: first-secret-value\n"
     "  node-a: second-secret-value\n", "node-a", 4),
])
def test_duplicate_key_in_secrets_is_refused(tmp_path: Path, text: str, key: str,
                                             line: int) -> None:
    """One YAML loader for config.yaml and secrets.yaml: a key written twice is refused, the
    message names the key and its line, never a value."""
    (tmp_path / "secrets.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        Settings.open(tmp_path)
    message = str(info.value)
    assert f"duplicate key {key!r}" in message
    assert f"line {line}," in message
    assert str(tmp_path / "secrets.yaml") in message
    for shown in (message, repr(info.value), info.value.body().decode()):
        assert "secret-value" not in shown


def test_mistagged_secret_is_refused_without_its_value(tmp_path: Path) -> None:
    (tmp_path / "secrets.yaml").write_text("admin_token: !!int supersecret\n")
    with pytest.raises(ConfigError) as info:
        Settings.open(tmp_path)
    assert "malformed YAML" in str(info.value)
    assert "supersecret" not in str(info.value) + repr(info.value)


def test_empty_secrets_gets_a_token(tmp_path: Path) -> None:
    (tmp_path / "secrets.yaml").write_text("")
    settings = Settings.open(tmp_path)
    assert settings.secrets.admin_token
    assert yaml.safe_load((tmp_path / "secrets.yaml").read_text())["admin_token"]


def test_secrets_repr_counts_only() -> None:
    s = Secrets(admin_token="t0ps3cret", node_keys={"a": "x1"}, backend_keys={},
                access_keys=[{"hash": "y"}])
    assert repr(s) == "Secrets(admin_token=<set>, node_keys=1, backend_keys=0, access_keys=1)"


# ---------------------------------------------------------------------- loading the config


def test_invalid_config_raises(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("timeouts:\n  connection: 16s\n")
    with pytest.raises(ConfigError) as info:
        Settings.open(tmp_path)
    assert info.value.path == "timeouts.connection"


def test_explicit_config_path(tmp_path: Path) -> None:
    custom = tmp_path / "elsewhere.yaml"
    custom.write_text("api:\n  port: 4242\n")
    settings = Settings.open(tmp_path / "data", custom)
    assert settings.config_path == custom
    assert settings.config.api.port == 4242
    assert not (tmp_path / "data" / "config.yaml").exists()
    assert (tmp_path / "data" / "secrets.yaml").exists()
    assert (tmp_path / "data" / "node.id").exists()


def test_explicit_config_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Settings.open(tmp_path / "data", tmp_path / "missing.yaml")


def test_stale_health_check_in_file_is_derived_in_memory(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "health_checks: {interval: 3s, timeout: 3s}\n"
        "timeouts: {health_check: {timeout: 4s, interval: 5s}}\n")
    settings = Settings.open(tmp_path)
    assert settings.config.timeouts.health_check == HealthCheckTimeouts(timeout=2.0, interval=3.0)


# ---------------------------------------------------------------------------------- update


async def test_update_writes_and_publishes(fresh: Settings) -> None:
    seen: list[Config] = []
    fresh.subscribe(seen.append)
    new = attrs.evolve(fresh.config, health_checks=HealthChecksConfig(interval=10.0, timeout=20.0))
    stored = await fresh.update(new)
    assert stored.timeouts.health_check == HealthCheckTimeouts(timeout=9.0, interval=10.0)
    assert fresh.config == stored
    assert seen == [stored]
    assert parse_config_text(fresh.config_path.read_text()) == stored
    assert fresh.config_path.read_text() == dump_config_yaml(stored)
    # no temp file left; the file the write replaced is kept in the history (SPEC §13)
    assert sorted(p.name for p in fresh.data_dir.iterdir()) == [
        "config-history", "config.yaml", "node.id", "secrets.yaml"]
    [kept] = fresh.file.history.entries()
    assert kept.source == "api"
    assert kept.sections == ("health_checks", "timeouts")


async def test_update_uses_fsync_and_rename(fresh: Settings,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(src: str, dst: Path) -> None:
        calls.append(f"replace->{Path(dst).name}")
        assert Path(src).parent == Path(dst).parent
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    await fresh.update(attrs.evolve(fresh.config,
                                    api=attrs.evolve(fresh.config.api, port=4000)))
    # config.yaml first, then the version it replaced goes to config-history/
    assert calls[:3] == ["fsync", "replace->config.yaml", "fsync"]
    assert calls[3:4] == ["fsync"]
    assert calls[4].startswith("replace->")
    assert calls[4].endswith("-api.yaml")


async def test_failed_write_leaves_the_old_file(fresh: Settings,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    before = fresh.config_path.read_bytes()

    def broken_replace(src: str, dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        await fresh.update(attrs.evolve(fresh.config,
                                        api=attrs.evolve(fresh.config.api, port=4000)))
    assert fresh.config_path.read_bytes() == before
    assert fresh.config == default_config()
    assert sorted(p.name for p in fresh.data_dir.iterdir()) == ["config.yaml", "node.id",
                                                                "secrets.yaml"]


async def test_update_refuses_invalid_without_touching_anything(fresh: Settings) -> None:
    seen: list[Config] = []
    fresh.subscribe(seen.append)
    before = fresh.config_path.read_bytes()
    stat_before = fresh.config_path.stat()
    t = fresh.config.timeouts
    bad = attrs.evolve(fresh.config, timeouts=attrs.evolve(t, request=attrs.evolve(
        t.request, streaming=attrs.evolve(t.request.streaming, total=1201.0))))
    with pytest.raises(ConfigError) as info:
        await fresh.update(bad)
    assert info.value.path == "timeouts.request.streaming.total"
    assert fresh.config_path.read_bytes() == before
    assert fresh.config_path.stat().st_ino == stat_before.st_ino
    assert fresh.config == default_config()
    assert seen == []


async def test_unsubscribe(fresh: Settings) -> None:
    seen: list[Config] = []
    unsubscribe = fresh.subscribe(seen.append)
    unsubscribe()
    await fresh.update(fresh.config)
    assert seen == []


async def test_update_through_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("")
    (tmp_path / "data").mkdir()
    link = tmp_path / "data" / "config.yaml"
    link.symlink_to(real)
    settings = Settings.open(tmp_path / "data")
    await settings.update(attrs.evolve(settings.config,
                                       api=attrs.evolve(settings.config.api, port=5000)))
    assert link.is_symlink()
    assert parse_config_text(real.read_text()).api.port == 5000


# ------------------------------------------------------------- changes made by the owner


def fail_writes_of(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    """Make the settings' writes of these files fail (disk full); returns the names of the
    files written (or tried) in order."""
    tried: list[str] = []
    real = proxy.settings.store.atomic_write

    def write(path: Path, data: bytes, mode: int) -> None:
        tried.append(path.name)
        if path.name in names:
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(proxy.settings.store, "atomic_write", write)

    monkeypatch.setattr(proxy.settings.config_file, "atomic_write", write)
    return tried


async def test_concurrent_edits_never_undo_each_other(fresh: Settings,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each change is made on the config as it is when its turn comes (one writer)."""
    real = proxy.settings.store.atomic_write

    def slow(path: Path, data: bytes, mode: int) -> None:
        time.sleep(0.05)
        real(path, data, mode)

    monkeypatch.setattr(proxy.settings.store, "atomic_write", slow)

    monkeypatch.setattr(proxy.settings.config_file, "atomic_write", slow)

    async def port() -> None:
        await fresh.edit(lambda c: attrs.evolve(c, api=attrs.evolve(c.api, port=4000)))

    async def auth() -> None:
        await fresh.edit(lambda c: attrs.evolve(c, api=attrs.evolve(c.api, require_auth=True)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(port)
        nursery.start_soon(auth)
    assert (fresh.config.api.port, fresh.config.api.require_auth) == (4000, True)
    assert parse_config_text(fresh.config_path.read_text()) == fresh.config


async def test_edit_refused_by_the_change_writes_nothing(fresh: Settings) -> None:
    before = fresh.config_path.read_bytes()

    def refuse(cfg: Config) -> Config:
        raise ConfigError("api.port", "no")

    with pytest.raises(ConfigError):
        await fresh.edit(refuse)
    assert fresh.config_path.read_bytes() == before


def with_node(cfg: Config, fingerprint: str = "node-a") -> Config:
    node = NodeConfig(fingerprint=fingerprint, name="a", base_url="http://192.0.2.1",
                      priority=1)
    return attrs.evolve(cfg, nodes=(*cfg.nodes, node))


async def test_node_registry_writes_secrets_then_config(fresh: Settings,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tried = fail_writes_of(monkeypatch)
    stored = await fresh.edit_nodes(lambda cfg, keys: (with_node(cfg), {**keys, "node-a": "k1"}))
    assert tried == ["secrets.yaml", "config.yaml"]
    assert [n.fingerprint for n in stored.nodes] == ["node-a"]
    assert fresh.config == stored
    assert fresh.secrets.node_keys == {"node-a": "k1"}
    assert yaml.safe_load(fresh.secrets_path.read_text())["node_keys"] == {"node-a": "k1"}
    tried.clear()
    await fresh.edit_nodes(lambda cfg, keys: (attrs.evolve(cfg, nodes=()), keys))
    assert tried == ["config.yaml"]  # no key changed: secrets.yaml is left alone


async def test_failed_config_write_undoes_the_secrets_write(
        fresh: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets_before = fresh.secrets_path.read_bytes()
    config_before = fresh.config_path.read_bytes()
    tried = fail_writes_of(monkeypatch, "config.yaml")
    with pytest.raises(OSError, match="No space"):
        await fresh.edit_nodes(lambda cfg, keys: (with_node(cfg), {**keys, "node-a": "k1"}))
    assert tried == ["secrets.yaml", "config.yaml", "secrets.yaml"]
    assert fresh.secrets_path.read_bytes() == secrets_before
    assert fresh.config_path.read_bytes() == config_before
    assert fresh.secrets.node_keys == {}
    assert fresh.config == default_config()


async def test_access_keys_are_made_and_revoked_by_the_owner(
        fresh: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    entry, key = await fresh.keys.add("phone")
    assert key.startswith("sk-sluice-")
    assert entry["name"] == "phone"
    assert entry["hash"] != key
    assert fresh.keys.all == (entry,)
    assert key not in fresh.secrets_path.read_text()
    assert Settings.open(fresh.data_dir).keys.all == (entry,)
    before = fresh.secrets_path.read_bytes()
    fail_writes_of(monkeypatch, "secrets.yaml")
    with pytest.raises(OSError, match="No space"):
        await fresh.keys.add("tablet")
    with pytest.raises(OSError, match="No space"):
        await fresh.keys.revoke(entry["id"])
    assert fresh.keys.all == (entry,)  # nothing changed in memory
    assert fresh.secrets_path.read_bytes() == before
    monkeypatch.undo()
    assert not await fresh.keys.revoke("ak-none")
    assert await fresh.keys.revoke(entry["id"])
    assert fresh.keys.all == ()
    assert Settings.open(fresh.data_dir).keys.all == ()
