"""The catalogue of managed models (protocol/catalogue.py): names, multi-part sets, config
entries that win, names used twice."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from protocol.catalogue import ConfigModel, Entry, Found, Skipped, build_catalogue, model_name


def test_model_names() -> None:
    assert model_name("SmolLM2-135M-Instruct.Q4_1.gguf") == "smollm2-135m-instruct.q4_1"
    assert model_name("Llama 3 (8B) ünïcode.GGUF") == "llama-3--8b---n-code"
    assert model_name("plain") == "plain"


@given(st.text(max_size=40))
def test_every_name_keeps_to_the_allowed_characters(file_name: str) -> None:
    assert re.fullmatch(r"[a-z0-9._-]*", model_name(file_name))


def test_files_become_models_in_order() -> None:
    entries, skipped = build_catalogue([], [Found("m/A.gguf", 10), Found("m/b.gguf", 20)])
    assert entries == [Entry("a", "m/A.gguf", 10, "folder"), Entry("b", "m/b.gguf", 20, "folder")]
    assert skipped == []


def test_a_multi_part_set_is_one_model_loaded_from_its_first_part() -> None:
    found = [Found(f"m/Big-Q4-0000{n}-of-00003.gguf", 100 * n) for n in (2, 1, 3)]
    entries, _ = build_catalogue([], found)
    assert entries == [Entry("big-q4", "m/Big-Q4-00001-of-00003.gguf", 600, "folder", parts=3)]


def test_a_set_with_a_part_missing_says_which() -> None:
    found = [Found("m/x-00001-of-00003.gguf", 1), Found("m/x-00003-of-00003.gguf", 1)]
    (entry,), _ = build_catalogue([], found)
    assert (entry.parts, entry.missing, entry.size) == (3, (2,), 2)


def test_sets_in_two_folders_are_two_models_and_the_second_name_is_skipped() -> None:
    found = [Found("a/x-00001-of-00002.gguf", 1), Found("a/x-00002-of-00002.gguf", 1),
             Found("b/x-00001-of-00002.gguf", 5), Found("b/x-00002-of-00002.gguf", 5)]
    entries, skipped = build_catalogue([], found)
    assert [(e.name, e.path, e.size) for e in entries] == [("x", "a/x-00001-of-00002.gguf", 2)]
    assert skipped == [Skipped("b/x-00001-of-00002.gguf", "another model is already named 'x'")]


def test_a_config_entry_wins_for_its_file() -> None:
    configured = [ConfigModel("chat", "m/a.gguf"), ConfigModel("gone", "elsewhere/g.gguf")]
    entries, skipped = build_catalogue(configured, [Found("m/a.gguf", 7), Found("m/b.gguf", 9)])
    assert entries == [Entry("chat", "m/a.gguf", 7, "config"),
                       Entry("gone", "elsewhere/g.gguf", 0, "config"),
                       Entry("b", "m/b.gguf", 9, "folder")]
    assert skipped == []


def test_a_config_entry_for_a_multi_part_set_takes_the_whole_size() -> None:
    configured = [ConfigModel("big", "m/x-00001-of-00002.gguf")]
    found = [Found("m/x-00001-of-00002.gguf", 3), Found("m/x-00002-of-00002.gguf", 4)]
    entries, _ = build_catalogue(configured, found)
    assert entries == [Entry("big", "m/x-00001-of-00002.gguf", 7, "config", parts=2)]


def test_a_found_file_named_like_a_config_model_is_skipped() -> None:
    entries, skipped = build_catalogue([ConfigModel("b", "other/b.gguf")],
                                       [Found("m/b.gguf", 1)])
    assert [e.source for e in entries] == ["config"]
    assert skipped == [Skipped("m/b.gguf", "another model is already named 'b'")]


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                          st.sampled_from(["m", "M", "x y", "m-00001-of-00002",
                                           "m-00002-of-00002", "n-00002-of-00003"]),
                          st.integers(0, 1000)), max_size=12, unique_by=lambda t: t[:2]))
def test_names_are_unique_and_every_file_is_accounted_for(
        files: list[tuple[str, str, int]]) -> None:
    found = [Found(f"{folder}/{stem}.gguf", size) for folder, stem, size in files]
    entries, skipped = build_catalogue([], found)
    assert len({e.name for e in entries}) == len(entries)
    paths = {f.path for f in found}
    assert all(e.path in paths for e in entries)
    groups = {(folder, re.sub(r"-\d{5}-of-", "-of-", stem.lower()) if "-of-" in stem else stem)
              for folder, stem, _ in files}
    assert len(entries) + len(skipped) == len(groups)
    assert sum(e.size for e in entries) <= sum(f.size for f in found)
