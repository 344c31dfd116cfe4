"""The ``apis`` setting and what the probes learn (SPEC §17.1): the config key on backends[]
and models[] (validated, written only when not ``auto``), the modes it starts from (the
bundled llama.cpp's ``auto`` is native), each probe answer's verdict, and the registry's
updates (a probe's verdict, the safety net's mark)."""

from __future__ import annotations

import pytest
import yaml

from protocol.api_modes import API_OF_PATH, NATIVE, ApiModes, initial_modes, verdict
from protocol.config import BackendConfig, config_to_dict, parse_config_text
from protocol.errors import ConfigError
from protocol.upstream_url import parse_upstream_url
from proxy.registry.backends import BackendRegistry


def test_the_key_is_validated_and_written_only_when_not_auto() -> None:
    cfg = parse_config_text(yaml.safe_dump({
        "backends": [{"name": "mlx", "url": "http://h:1", "apis": "translate"},
                     {"name": "vllm", "url": "http://h:2"}],
        "models": [{"name": "m", "path": "m.gguf", "apis": "native"},
                   {"name": "n", "path": "n.gguf"}]}))
    assert [b.apis for b in cfg.backends] == ["translate", "auto"]
    assert [m.apis for m in cfg.models] == ["native", "auto"]
    data = config_to_dict(cfg)
    assert [b.get("apis") for b in data["backends"]] == ["translate", None]
    assert [m.get("apis") for m in data["models"]] == ["native", None]
    for doc, path in (
            ({"backends": [{"name": "b", "url": "http://h", "apis": "chat"}]},
             "backends[0].apis"),
            ({"models": [{"name": "m", "path": "m.gguf", "apis": "yes"}]}, "models[0].apis")):
        with pytest.raises(ConfigError) as caught:
            parse_config_text(yaml.safe_dump(doc))
        assert caught.value.path == path


def test_initial_modes() -> None:
    assert initial_modes("auto").view() == {"messages": None, "responses": None}
    assert initial_modes("auto", bundled=True).view() == NATIVE.view()
    assert initial_modes("native").view() == NATIVE.view()
    assert initial_modes("translate", bundled=True).view() == {
        "messages": "translate", "responses": "translate"}
    assert not initial_modes("auto").known()
    assert initial_modes("translate").known()


@pytest.mark.parametrize(("status", "body", "want"), [
    (400, b'{"type":"error","error":{"type":"invalid_request_error"}}', "native"),
    (422, b'{"detail":[{"loc":["body","model"]}]}', "native"),
    (404, b'{"error":{"code":404,"message":"File Not Found"}}', "translate"),
    (405, b"", "translate"),
    (200, b'{"error":"Unexpected endpoint or method. (POST /v1/messages)"}', "translate"),
    (200, b'{"id":"msg_1","type":"message"}', None),
    (200, b"not json", None),
    (500, b"boom", None),
    (401, b'{"error":"no key"}', None),
])
def test_probe_verdicts(status: int, body: bytes, want: str | None) -> None:
    assert verdict(status, body) == want


def test_the_registry_records_verdicts_and_the_safety_net() -> None:
    registry = BackendRegistry([BackendConfig(name="a", url="http://127.0.0.1:9")], {})
    (backend,) = registry.backends
    seen: list[ApiModes] = []
    registry.changes.subscribe(lambda r: seen.append(r.backends[0].apis))
    elsewhere = parse_upstream_url("http://127.0.0.1:10")
    registry.found_apis(backend, elsewhere, {"messages": "native"})  # it moved meanwhile
    assert backend.apis.messages is None
    assert seen == []
    assert backend.address is not None
    registry.found_apis(backend, backend.address, {"messages": "native"})
    assert backend.apis.view() == {"messages": "native", "responses": None}
    registry.found_apis(backend, backend.address, {"messages": "translate"})  # known stays
    assert backend.apis.messages == "native"
    registry.lacks(backend, "responses")
    assert backend.apis.view() == {"messages": "native", "responses": "translate"}
    assert len(seen) == 2
    assert backend.status()["apis"] == backend.apis.view()


def test_every_translated_path_is_one_the_exchange_looks_at() -> None:
    from protocol.translate import COUNT_PATHS, TRANSLATORS

    for path, translator in {**TRANSLATORS, **COUNT_PATHS}.items():
        assert API_OF_PATH[path] == translator.NAME

