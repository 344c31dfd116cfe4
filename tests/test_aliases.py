"""Model aliases, the pure parts (SPEC §12): the resolution order, ``*`` patterns (against a
reference matcher, with hypothesis), the model-id rule, the unified list's alias entries,
and ``aliases:`` in config.yaml (order kept, each problem naming ``aliases.<name>``)."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.aliases
from protocol.aliases import (
    MAX_MODEL_ID,
    AliasTable,
    alias_entries,
    model_id_problem,
    resolve,
)
from protocol.config import default_config, dump_config_yaml, parse_config_text
from protocol.errors import ConfigError, alias_target_not_available

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None)


def table(*items: tuple[str, str]) -> AliasTable:
    return AliasTable(items)


def nothing_exists(model: str) -> bool:
    return False


# --------------------------------------------------------------------- the resolution


def test_an_existing_model_is_never_aliased() -> None:
    aliases = table(("gpt-4o", "small"), ("gpt-*", "big"), ("*", "any"))
    asked: list[str] = []

    def exists(model: str) -> bool:
        asked.append(model)
        return model == "gpt-4o"

    assert resolve(aliases, "gpt-4o", exists) is None
    assert resolve(aliases, "gpt-4o-mini", exists) == "big"
    assert asked == ["gpt-4o", "gpt-4o-mini"]  # only the asked id, never the target


def test_exact_names_before_patterns_whatever_the_file_order() -> None:
    aliases = table(("claude-*", "pattern"), ("claude-3-opus", "exact"))
    assert resolve(aliases, "claude-3-opus", nothing_exists) == "exact"
    assert resolve(aliases, "claude-3-haiku", nothing_exists) == "pattern"


def test_the_first_matching_pattern_in_file_order() -> None:
    aliases = table(("claude-3-*", "three"), ("claude-*", "any-claude"), ("*", "fallback"))
    assert resolve(aliases, "claude-3-5-sonnet", nothing_exists) == "three"
    assert resolve(aliases, "claude-sonnet-4-5", nothing_exists) == "any-claude"
    assert resolve(aliases, "gpt-4o", nothing_exists) == "fallback"
    reordered = table(("*", "fallback"), ("claude-3-*", "three"))
    assert resolve(reordered, "claude-3-5-sonnet", nothing_exists) == "fallback"


def test_no_rule_no_question() -> None:
    def exists(model: str) -> bool:
        raise AssertionError("asked although no alias applies")

    assert resolve(table(("a", "b"), ("c-*", "d")), "x", exists) is None
    assert resolve(AliasTable(), "x", exists) is None


def test_targets_are_not_looked_up_again() -> None:
    aliases = table(("a", "b"), ("b", "c"), ("c*", "d"))
    assert resolve(aliases, "a", nothing_exists) == "b"  # not c, not d


@pytest.mark.parametrize(("pattern", "model", "matches"), [
    ("claude-*", "claude-", True),  # * matches the empty run too
    ("claude-*", "claude-3-5-sonnet-20241022", True),
    ("claude-*", "xclaude-3", False),  # the whole id
    ("*-mini", "gpt-4o-mini", True),
    ("*-mini", "gpt-4o-mini-2", False),
    ("a*b*c", "abc", True),
    ("a*b*c", "a-x-b-y-c", True),
    ("a*b*c", "acb", False),
    ("gpt-4?", "gpt-4o", False),  # ? is itself, not a wildcard
    ("gpt-4?", "gpt-4?", True),
    ("q[12]*", "q1x", False),  # [ ] are themselves
    ("q[12]*", "q[12]x", True),
    ("a.b*", "axb", False),  # . is itself
    ("a+*", "aa", False),
    ("**", "", True),
    ("Claude-*", "claude-3", False),  # case matters, as in model ids
    ("x*", "x\ny", True),  # any character
])
def test_patterns(pattern: str, model: str, matches: bool) -> None:
    assert (table((pattern, "t")).target_of(model) == "t") is matches


@functools.cache
def reference(pattern: str, model: str) -> bool:
    """A plain recursive matcher: ``*`` any run, every other character itself."""
    if not pattern:
        return not model
    if pattern[0] == "*":
        return reference(pattern[1:], model) or (bool(model) and reference(pattern, model[1:]))
    return bool(model) and model[0] == pattern[0] and reference(pattern[1:], model[1:])


ALPHABET = st.sampled_from("ab*.?[]\\+-")


@pytest.mark.slow
@PROPERTY
@given(st.text(ALPHABET, max_size=8), st.text(ALPHABET.filter(lambda c: c != "*"), max_size=8))
def test_patterns_match_the_reference(pattern: str, model: str) -> None:
    name = pattern if "*" in pattern else pattern + "*"
    assert (table((name, "t")).target_of(model) == "t") is reference(name, model)


def test_patterns_are_compiled_once_per_table(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = protocol.aliases._compile
    monkeypatch.setattr(protocol.aliases, "_compile", lambda p: calls.append(p) or real(p))
    aliases = table(("a-*", "x"), ("b", "y"), ("*-c", "z"))
    assert calls == ["a-*", "*-c"]
    for model in ("a-1", "b", "q-c", "none") * 50:
        aliases.target_of(model)
    assert calls == ["a-*", "*-c"]


def test_the_table() -> None:
    assert not AliasTable()
    assert len(AliasTable()) == 0
    aliases = table(("b", "1"), ("a*", "2"))
    assert aliases
    assert len(aliases) == 2
    assert list(aliases) == [("b", "1"), ("a*", "2")]
    assert aliases.as_dict() == {"b": "1", "a*": "2"}
    assert list(aliases.as_dict()) == ["b", "a*"]
    assert dict(aliases.exact) == {"b": "1"}
    assert aliases == table(("b", "1"), ("a*", "2"))
    assert aliases != table(("a*", "2"), ("b", "1"))  # the order is part of it
    assert hash(aliases) == hash(table(("b", "1"), ("a*", "2")))
    assert repr(aliases) == "AliasTable({'b': '1', 'a*': '2'})"


def test_the_error_names_the_alias_and_its_target() -> None:
    err = alias_target_not_available("gpt-4o", "smollm2")
    assert (err.status, err.code, err.param, err.type) == (503, "model_not_available", "model",
                                                            "server_error")
    assert "'gpt-4o'" in err.message
    assert "'smollm2'" in err.message


# ------------------------------------------------------------------------ model ids


@pytest.mark.parametrize("value", ["gpt-4o", "qwen2.5-coder:7b", "meta-llama/Llama-3.1-8B",
                                   "fault:reset-after-3", "é", "x" * MAX_MODEL_ID])
def test_model_ids(value: str) -> None:
    assert model_id_problem(value) is None
    assert model_id_problem(value, pattern=True) is None


@pytest.mark.parametrize(("value", "words"), [
    ("", "empty"), ("a b", "without spaces"), ("a\tb", "without spaces"),
    ("a\x00", "printable"), ("a\u2028b", "without spaces"), ("x" * (MAX_MODEL_ID + 1), "at most"),
    (3, "a string"), ("claude-*", "'*'"),
])
def test_not_model_ids(value: Any, words: str) -> None:
    problem = model_id_problem(value)
    assert problem is not None
    assert words in problem
    assert (model_id_problem(value, pattern=True) is None) is (value == "claude-*")


# --------------------------------------------------------------- the unified model list


def test_alias_entries() -> None:
    listed = [{"id": "small", "object": "model", "created": 7, "owned_by": "llama"},
              {"id": "managed", "object": "model", "created": 0, "owned_by": "sluice",
               "sluice": {"state": "unloaded"}},
              {"id": "far", "object": "model", "created": 0, "owned_by": "remote"}]
    aliases = table(("gpt-4o", "small"), ("claude-*", "small"), ("ghost", "nobody"),
                    ("small", "far"), ("mini", "managed"), ("o1", "far"))
    assert alias_entries(aliases, listed) == [
        *listed,
        {"id": "gpt-4o", "object": "model", "created": 7, "owned_by": "llama",
         "sluice": {"aliasOf": "small"}},
        {"id": "mini", "object": "model", "created": 0, "owned_by": "sluice",
         "sluice": {"state": "unloaded", "aliasOf": "managed"}},
        {"id": "o1", "object": "model", "created": 0, "owned_by": "remote",
         "sluice": {"aliasOf": "far"}},
    ]
    assert listed[1]["sluice"] == {"state": "unloaded"}  # the target's entry is not changed
    assert alias_entries(table(("claude-*", "small")), listed) is listed


# ----------------------------------------------------------------------- config.yaml


def test_config_keeps_the_file_order() -> None:
    cfg = parse_config_text("aliases:\n  z-*: a\n  gpt-4o: smollm2-135m\n  '*': b\n"
                            "  claude-*: qwen2.5-coder-7b\n")
    assert list(cfg.aliases) == [("z-*", "a"), ("gpt-4o", "smollm2-135m"), ("*", "b"),
                                 ("claude-*", "qwen2.5-coder-7b")]
    text = dump_config_yaml(cfg)
    assert parse_config_text(text) == cfg
    assert list(yaml.safe_load(text)["aliases"]) == ["z-*", "gpt-4o", "*", "claude-*"]
    assert "# names clients send -> models that exist" in text


@pytest.mark.parametrize("text", ["", "aliases:\n", "aliases: {}\n", "aliases: null\n"])
def test_no_aliases(text: str) -> None:
    assert parse_config_text(text).aliases == AliasTable()
    assert not default_config().aliases
    assert "aliases: {}" in dump_config_yaml(default_config())


@pytest.mark.parametrize(("text", "path", "words"), [
    ("aliases: [gpt-4o]", "aliases", "a mapping of names"),
    ("aliases: gpt-4o", "aliases", "a mapping of names"),
    ("aliases: {gpt-4o: 4}", "aliases.gpt-4o", "a string"),
    ("aliases: {gpt-4o: null}", "aliases.gpt-4o", "a string"),
    ("aliases: {gpt-4o: [a]}", "aliases.gpt-4o", "a string"),
    ("aliases: {12: smollm2}", "aliases.12", "in quotes"),
    ("aliases: {yes: smollm2}", "aliases.True", "in quotes), got a boolean"),
    ("aliases: {'gpt 4o': smollm2}", "aliases.gpt 4o", "without spaces"),
    ("aliases: {gpt-4o: 'small model'}", "aliases.gpt-4o", "without spaces"),
    ("aliases: {'claude-*': 'qwen-*'}", "aliases.claude-*", "'*'"),
    ("aliases: {'': smollm2}", "aliases.", "empty"),
    ("aliases: {gpt-4o: ''}", "aliases.gpt-4o", "empty"),
    ("aliases: {gpt-4o: gpt-4o}", "aliases.gpt-4o", "itself"),
    ("aliases: {ok: fine, gpt-4o: \"a\\x01\"}", "aliases.gpt-4o", "printable"),
    (f"aliases: {{gpt-4o: {'x' * 300}}}", "aliases.gpt-4o", "at most 256"),
    ("aliases: {gpt-4o: a, gpt-4o: b}", "", "duplicate key"),
])
def test_config_refusals_name_the_alias(text: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text)
    assert caught.value.path == path
    assert words in caught.value.message
    assert caught.value.status == 422


MODEL_IDS = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp", "Co",
                                                        "Cn")), min_size=1, max_size=12)


@pytest.mark.slow
@PROPERTY
@given(st.dictionaries(MODEL_IDS, MODEL_IDS.filter(lambda t: "*" not in t), max_size=5))
def test_any_valid_table_round_trips(mapping: dict[str, str]) -> None:
    mapping = {name: target for name, target in mapping.items() if name != target}
    mapping = {n: t for n, t in mapping.items()
               if model_id_problem(n, pattern=True) is None and model_id_problem(t) is None}
    cfg = attrs.evolve(default_config(), aliases=AliasTable.of(mapping))
    again = parse_config_text(dump_config_yaml(cfg))
    assert again == cfg
    assert list(again.aliases) == list(mapping.items())
