"""OpenAI shapes: model lists and their merge, and the one error body."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from protocol import errors
from protocol.errors import ConfigError, SluiceError, Source, error_dict
from protocol.openai import merge_model_lists, model_entry, model_list_body, parse_model_list

ERROR_KEYS = {"message", "type", "code", "param"}

# --- parse_model_list -----------------------------------------------------------------------

LLAMA_CPP_MODELS = (
    b'{"models":[{"name":"smollm2","model":"smollm2","modified_at":"","size":"",'
    b'"digest":"","type":"model","description":"","tags":[""],"capabilities":["completion"],'
    b'"parameters":"","details":{"parent_model":"","format":"gguf","family":"",'
    b'"families":[""],"parameter_size":"","quantization_level":""}}],"object":"list",'
    b'"data":[{"id":"smollm2","object":"model","created":1760000000,"owned_by":"llamacpp",'
    b'"meta":{"vocab_type":2,"n_vocab":49152}}]}'
)


def test_parse_llama_cpp_model_list() -> None:
    entries = parse_model_list(LLAMA_CPP_MODELS)
    assert [e["id"] for e in entries] == ["smollm2"]
    assert entries[0]["owned_by"] == "llamacpp"
    assert entries[0]["created"] == 1760000000


def test_parse_skips_entries_without_a_string_id() -> None:
    body = json.dumps({"data": [
        {"id": "a"}, {"id": ""}, {"id": 3}, {"id": None}, {"name": "b"}, "c", 4, None, [],
        {"id": "d", "owned_by": "x"}, {"id": "é-😀"},
    ]}).encode()
    assert [e["id"] for e in parse_model_list(body)] == ["a", "d", "é-😀"]


def test_parse_empty_list() -> None:
    assert parse_model_list(b'{"object":"list","data":[]}') == []


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"{", b"[]", b'[{"id": "a"}]', b"null", b"{}", b'{"data": null}',
     b'{"data": {"id": "a"}}', b'{"data": "a"}', b'{"models": []}', b"\xff\xfe"],
)
def test_parse_refuses_what_is_not_a_model_list(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"\S"):  # json.JSONDecodeError is a ValueError
        parse_model_list(body)


# --- model_entry / merge_model_lists ------------------------------------------------------------


def test_model_entry_has_the_openai_keys_and_keeps_the_upstreams_others() -> None:
    """SPEC §17.2: what an upstream sends beyond id/object/created/owned_by is kept (vLLM's
    max_model_len, llama.cpp's meta), the four OpenAI keys normalized."""
    raw = {"id": "m", "object": "weird", "created": 5, "owned_by": "me", "meta": {"x": 1},
           "max_model_len": 4096}
    assert model_entry(raw, "backend") == {"id": "m", "object": "model", "created": 5,
                                           "owned_by": "me", "meta": {"x": 1},
                                           "max_model_len": 4096}


@pytest.mark.parametrize("owner", [None, "", 3, ["x"]])
def test_model_entry_owner_defaults_to_backend(owner: object) -> None:
    raw: dict[str, Any] = {"id": "m"}
    if owner is not None:
        raw["owned_by"] = owner
    assert model_entry(raw, "llama")["owned_by"] == "llama"


@pytest.mark.parametrize("created", [None, "1700000000", 1.5, [1]])
def test_model_entry_created_defaults_to_zero(created: object) -> None:
    raw: dict[str, Any] = {"id": "m"}
    if created is not None:
        raw["created"] = created
    assert model_entry(raw, "b")["created"] == 0


def test_merge_local_first_then_remote() -> None:
    merged = merge_model_lists(
        [("llama", [{"id": "smollm2", "owned_by": "llamacpp", "created": 7}]),
         ("vllm", [{"id": "qwen"}])],
        [{"id": "gpt-x", "owned_by": "node-b"}, {"id": "remote-only"}],
    )
    assert merged == [
        {"id": "smollm2", "object": "model", "created": 7, "owned_by": "llamacpp"},
        {"id": "qwen", "object": "model", "created": 0, "owned_by": "vllm"},
        {"id": "gpt-x", "object": "model", "created": 0, "owned_by": "remote"},
        {"id": "remote-only", "object": "model", "created": 0, "owned_by": "remote"},
    ]


def test_merge_local_wins_on_duplicate_ids() -> None:
    merged = merge_model_lists(
        [("a", [{"id": "m", "owned_by": "first"}, {"id": "m", "owned_by": "again"}]),
         ("b", [{"id": "m", "owned_by": "second"}, {"id": "n"}])],
        [{"id": "m", "owned_by": "remote-node"}, {"id": "n"}, {"id": "r"}, {"id": "r"}],
    )
    assert [(e["id"], e["owned_by"]) for e in merged] == [
        ("m", "first"), ("n", "b"), ("r", "remote")]


def test_merge_empty() -> None:
    assert merge_model_lists([]) == []
    assert merge_model_lists([("a", [])], []) == []
    assert merge_model_lists([], [{"id": "r"}]) == [
        {"id": "r", "object": "model", "created": 0, "owned_by": "remote"}]


def test_merge_accepts_iterators_and_does_not_mutate_input() -> None:
    local_entries = [{"id": "m", "extra": 1}]
    remote_entries = [{"id": "r", "owned_by": "x"}]
    merged = merge_model_lists(iter([("b", iter(local_entries))]), iter(remote_entries))
    assert [e["id"] for e in merged] == ["m", "r"]
    assert local_entries == [{"id": "m", "extra": 1}]
    assert remote_entries == [{"id": "r", "owned_by": "x"}]


def test_merge_of_parsed_lists_round_trips_through_the_body() -> None:
    local = parse_model_list(LLAMA_CPP_MODELS)
    remote = parse_model_list(model_list_body(merge_model_lists([("x", [{"id": "other"}])])))
    body = model_list_body(merge_model_lists([("llama", local)], remote))
    doc = json.loads(body)
    assert doc["object"] == "list"
    assert [(e["id"], e["owned_by"]) for e in doc["data"]] == [
        ("smollm2", "llamacpp"), ("other", "remote")]


def test_model_list_body_is_compact_json() -> None:
    body = model_list_body([{"id": "é", "object": "model", "created": 0, "owned_by": "b"}])
    assert isinstance(body, bytes)
    assert b", " not in body
    assert b": " not in body
    assert json.loads(body) == {"object": "list", "data": [
        {"id": "é", "object": "model", "created": 0, "owned_by": "b"}]}
    assert json.loads(model_list_body([])) == {"object": "list", "data": []}


# --- errors ----------------------------------------------------------------------------------

CONSTRUCTORS: dict[str, tuple[Callable[[], SluiceError], int, str, Source]] = {
    "bad_request": (lambda: errors.bad_request("bad"), 400, "invalid_request", Source.CLIENT),
    "bad_request_code": (lambda: errors.bad_request("bad", code="missing_model",
                                                    param="model"),
                         400, "missing_model", Source.CLIENT),
    "not_found": (lambda: errors.not_found("no"), 404, "not_found", Source.CLIENT),
    "method_not_allowed": (lambda: errors.method_not_allowed("PUT", ("GET", "POST")), 405,
                           "method_not_allowed", Source.CLIENT),
    "request_timeout": (lambda: errors.request_timeout("slow"), 408, "request_timeout",
                        Source.CLIENT),
    "payload_too_large": (lambda: errors.payload_too_large(1024), 413, "request_too_large",
                          Source.CLIENT),
    "headers_too_large": (lambda: errors.headers_too_large("big"), 431,
                          "request_header_fields_too_large", Source.CLIENT),
    "version_not_supported": (lambda: errors.version_not_supported("1.0"), 505,
                              "http_version_not_supported", Source.CLIENT),
    "model_not_available": (lambda: errors.model_not_available("m"), 503,
                            "model_not_available", Source.GATEWAY),
    "overloaded": (lambda: errors.overloaded("busy"), 503, "server_overloaded",
                   Source.GATEWAY),
    "upstream_unreachable": (lambda: errors.upstream_unreachable("down"), 502,
                             "upstream_connection_error", Source.UPSTREAM),
    "upstream_bad_response": (lambda: errors.upstream_bad_response("junk"), 502,
                              "upstream_protocol_error", Source.UPSTREAM),
    "upstream_timeout": (lambda: errors.upstream_timeout("late"), 504, "upstream_timeout",
                         Source.UPSTREAM),
    "internal": (lambda: errors.internal("oops"), 500, "internal_error", Source.GATEWAY),
    "config": (lambda: ConfigError("timeouts.total", "must be positive"), 422,
               "invalid_config", Source.CONFIG),
}


@pytest.mark.parametrize(("make", "status", "code", "source"), list(CONSTRUCTORS.values()),
                         ids=list(CONSTRUCTORS))
def test_every_error_has_an_openai_body(make: Callable[[], SluiceError], status: int, code: str,
                                        source: Source) -> None:
    error = make()
    assert isinstance(error, SluiceError)
    assert isinstance(error, Exception)
    assert error.status == status
    assert error.code == code
    assert error.source is source
    doc = json.loads(error.body())
    assert set(doc) == {"error"}
    body = doc["error"]
    assert set(body) == ERROR_KEYS
    assert body == error.to_dict()
    assert isinstance(body["message"], str)
    assert body["message"]
    assert body["message"] == error.message == str(error)
    assert body["type"] == ("server_error" if status >= 500 and status != 505
                            else "invalid_request_error")
    assert body["code"] == code
    assert body["param"] is None or isinstance(body["param"], str)
    assert error.body() == json.dumps({"error": body}, separators=(",", ":")).encode()
    assert repr(error).startswith(f"{type(error).__name__}(status={status}, ")


def test_error_params() -> None:
    assert errors.bad_request("x").param is None
    assert errors.bad_request("x", param="stream").param == "stream"
    assert errors.model_not_available("m").param == "model"
    assert errors.payload_too_large(10).param == "api.max_body_size"
    assert "10 bytes" in errors.payload_too_large(10).message
    assert "'m'" in errors.model_not_available("m").message
    assert errors.internal("x").param is None


def test_only_method_not_allowed_has_headers() -> None:
    error = errors.method_not_allowed("DELETE", ("GET", "POST"))
    assert error.headers == ((b"allow", b"GET, POST"),)
    assert "DELETE" in error.message
    assert errors.method_not_allowed("POST", ("GET",)).headers == ((b"allow", b"GET"),)
    for name, (make, *_) in CONSTRUCTORS.items():
        if name != "method_not_allowed":
            assert make().headers == (), name


def test_config_error() -> None:
    error = ConfigError("backends[0].url", "expected http:// or unix:/")
    assert error.status == 422
    assert error.param == "backends[0].url"
    assert error.path == "backends[0].url"
    assert error.code == "invalid_config"
    assert error.type == "invalid_request_error"
    assert error.message == "backends[0].url: expected http:// or unix:/"
    assert json.loads(error.body())["error"]["param"] == "backends[0].url"


def test_config_error_without_path() -> None:
    error = ConfigError("", "the document must be a mapping")
    assert error.param is None
    assert error.path == ""
    assert error.message == "the document must be a mapping"
    assert set(error.to_dict()) == ERROR_KEYS


def test_error_body_keeps_unicode_and_quotes() -> None:
    error = errors.bad_request('modèle "x"\n😀')
    assert json.loads(error.body())["error"]["message"] == 'modèle "x"\n😀'


def test_error_dict() -> None:
    assert error_dict("m", "t") == {"message": "m", "type": "t", "code": None, "param": None}
    assert error_dict("m", "t", "c", "p") == {"message": "m", "type": "t", "code": "c",
                                              "param": "p"}


def test_sluice_error_defaults() -> None:
    error = SluiceError(500, "x", type="server_error")
    assert (error.code, error.param, error.source, error.headers) == (
        None, None, Source.GATEWAY, ())
    assert json.loads(error.body()) == {"error": {"message": "x", "type": "server_error",
                                                  "code": None, "param": None}}
