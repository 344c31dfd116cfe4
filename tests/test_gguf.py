"""protocol/gguf.py: the header of a GGUF model file, and the KV cache its model needs.

Checked against the real demo model (SmolLM2-135M, fetched once into .cache/ or
$SLUICE_TEST_CACHE), against headers made here by a small encoder, and against random and
damaged bytes: any input gives a GgufInfo or a GgufError, never another exception.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.gguf import GgufError, GgufInfo, kv_cache_bytes, parse_gguf_header
from tests.workers import demo_model

READ_CAP = 16 << 20  # what a caller reads of a model file to find its header

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL = range(8)
STRING, ARRAY, UINT64, INT64, FLOAT64 = range(8, 13)
FORMS = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i",
         FLOAT32: "f", BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}


# --- a small GGUF encoder -------------------------------------------------------------------

class Raw(bytes):
    """Bytes written as they are in place of a value: for headers that lie."""


Entry = tuple[str | bytes, int, object]


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode_value(kind: int, value: object) -> bytes:
    """One value of type ``kind``; an array is ``(item kind, items)``."""
    if isinstance(value, Raw):
        return bytes(value)
    if kind == STRING:
        assert isinstance(value, str | bytes)
        return gguf_string(value)
    if kind == ARRAY:
        assert isinstance(value, tuple)
        item, items = value
        return struct.pack("<IQ", item, len(items)) + b"".join(
            encode_value(item, one) for one in items)
    return struct.pack("<" + FORMS[kind], value)


def header(entries: Sequence[Entry], *, version: int = 3, tensors: int = 0) -> bytes:
    """A GGUF header with these key/value entries (and no tensor infos after it)."""
    parts = [b"GGUF", struct.pack("<IQQ", version, tensors, len(entries))]
    for key, kind, value in entries:
        parts += [gguf_string(key), struct.pack("<I", kind), encode_value(kind, value)]
    return b"".join(parts)


def model(changes: dict[str, tuple[int, object] | None] | None = None) -> list[Entry]:
    """A small llama-like model's entries; ``changes`` replaces (or, with None, drops) some."""
    values: dict[str, tuple[int, object] | None] = {
        "general.architecture": (STRING, "llama"),
        "llama.block_count": (UINT32, 4),
        "llama.context_length": (UINT32, 2048),
        "llama.embedding_length": (UINT32, 256),
        "llama.attention.head_count": (UINT32, 8),
        "llama.attention.head_count_kv": (UINT32, 2),
    }
    values.update(changes or {})
    return [(key, *pair) for key, pair in values.items() if pair is not None]


MINIMAL = GgufInfo(architecture="llama", block_count=4, head_count=8, head_count_kv=(2,) * 4,
                   embedding_length=256, key_length=32, value_length=32, context_length=2048)

# Entries of every kind, that are not read, around the model's: a header to damage.
NOISE: list[Entry] = [
    ("general.name", STRING, "tiny"),
    ("general.score", FLOAT32, 0.5),
    ("general.flag", BOOL, True),
    ("general.big", UINT64, 2**63),
    ("general.neg", INT64, -5),
    ("general.ratio", FLOAT64, 1e-6),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "hé", ""])),
    ("tokenizer.ggml.token_type", ARRAY, (INT32, [1, 3, 1, 1])),
    ("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0, -1.5])),
    ("general.nested", ARRAY, (ARRAY, [(UINT8, [1, 2]), (STRING, ["a"]), (ARRAY, [])])),
]
RICH = header(NOISE[:5] + model({"llama.attention.head_count_kv": (ARRAY, (INT32, [2, 1, 2, 0]))})
              + NOISE[5:])


def fails(data: bytes, match: str, *, truncated: bool = False,
          file_size: int | None = None) -> GgufError:
    with pytest.raises(GgufError, match=match) as caught:
        parse_gguf_header(data, file_size)
    assert caught.value.truncated is truncated
    return caught.value


# --- the real model -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def gguf() -> Path:
    return demo_model()


def test_the_demo_model(gguf: Path) -> None:
    with gguf.open("rb") as file:
        data = file.read(READ_CAP)
    info = parse_gguf_header(data, gguf.stat().st_size)
    assert info == GgufInfo(architecture="llama", block_count=30, head_count=9,
                            head_count_kv=(3,) * 30, embedding_length=576, key_length=64,
                            value_length=64, context_length=8192)
    assert kv_cache_bytes(info, 2048) == 30 * 2048 * (3 * 64 + 3 * 64) * 2 == 47_185_920
    # Its tokenizer arrays make the header 1.7 MB: a shorter read asks for more.
    error = fails(data[: 1 << 20], "truncated GGUF header", truncated=True)
    assert "tokenizer.ggml" in str(error)


# --- headers made here ----------------------------------------------------------------------

def test_minimal_header() -> None:
    assert parse_gguf_header(header(model())) == MINIMAL
    assert parse_gguf_header(header(model(), version=2)) == MINIMAL


def test_values_not_read_are_skipped_and_order_does_not_matter() -> None:
    entries = model()
    assert parse_gguf_header(RICH) == GgufInfo(
        architecture="llama", block_count=4, head_count=8, head_count_kv=(2, 1, 2, 0),
        embedding_length=256, key_length=32, value_length=32, context_length=2048)
    assert parse_gguf_header(header(NOISE + entries[::-1])) == MINIMAL


def test_head_count_kv_absent_is_head_count() -> None:
    info = parse_gguf_header(header(model({"llama.attention.head_count_kv": None})))
    assert info.head_count_kv == (8,) * 4


def test_key_and_value_length() -> None:
    given_lengths = model({"llama.attention.key_length": (UINT32, 128),
                           "llama.attention.value_length": (UINT16, 96)})
    info = parse_gguf_header(header(given_lengths))
    assert (info.key_length, info.value_length) == (128, 96)
    assert kv_cache_bytes(info, 100) == 4 * 100 * (2 * 128 + 2 * 96) * 2
    assert (MINIMAL.key_length, MINIMAL.value_length) == (256 // 8, 256 // 8)  # when absent


def test_per_layer_head_counts() -> None:
    per_layer = {"llama.attention.head_count_kv": (ARRAY, (UINT32, [4, 2, 0, 8]))}
    info = parse_gguf_header(header(model(per_layer)))
    assert info.head_count_kv == (4, 2, 0, 8)
    assert kv_cache_bytes(info, 10) == 10 * (4 + 2 + 0 + 8) * (32 + 32) * 2
    heads = {"llama.attention.head_count": (ARRAY, (INT32, [8, 8, 16, 16])),
             "llama.attention.head_count_kv": None}
    info = parse_gguf_header(header(model(heads)))
    assert (info.head_count, info.head_count_kv, info.key_length) == (16, (8, 8, 16, 16), 16)


@pytest.mark.parametrize(("change", "match"), [
    ({"llama.attention.head_count_kv": (ARRAY, (UINT32, [2, 2, 2]))}, "3 entries for 4 layers"),
    ({"llama.attention.head_count_kv": (ARRAY, (UINT32, [0, 0, 0, 0]))}, "out of range"),
    ({"llama.attention.head_count_kv": (ARRAY, (INT8, [2, -1, 2, 2]))}, "out of range"),
    ({"llama.attention.head_count_kv": (ARRAY, (UINT32, [2, 9, 2, 2]))}, "exceeds"),
    ({"llama.attention.head_count_kv": (ARRAY, (FLOAT32, [2, 2, 2, 2]))}, "array of FLOAT32"),
    ({"llama.attention.head_count_kv": (ARRAY, Raw(struct.pack("<IQ", UINT8, 2_000_000)
                                                   + bytes(2_000_000)))}, "2000000 items"),
])
def test_bad_per_layer_head_counts(change: dict[str, tuple[int, object]], match: str) -> None:
    fails(header(model(change)), match)


def test_big_string_array_before_the_keys() -> None:
    tokens = [f"token{i}" for i in range(50_000)]
    data = header([("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), *model()])
    assert parse_gguf_header(data) == MINIMAL


def test_versions() -> None:
    fails(header(model(), version=1), "unsupported GGUF version 1 .*too old")
    fails(header(model(), version=4), "unsupported GGUF version 4$")
    big_endian = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    fails(big_endian, "big-endian")


def test_not_gguf() -> None:
    fails(b"PK\x03\x04" + bytes(40), r"not a GGUF file \(magic b'PK\\x03\\x04'\)")
    fails(b"GGML", "not a GGUF file")
    fails(b"X", "not a GGUF file")
    fails(b"", "truncated", truncated=True)
    fails(b"GG", "truncated", truncated=True)


def test_every_cut_is_truncated() -> None:
    for size in range(len(RICH)):
        error = fails(RICH[:size], "^truncated GGUF header at byte", truncated=True)
        assert "reading" in str(error)
        # When the file itself is that short, reading more cannot help.
        fails(RICH[:size], "GGUF", file_size=size)
    assert parse_gguf_header(RICH, len(RICH)).head_count_kv == (2, 1, 2, 0)


def test_truncated_message_names_the_key() -> None:
    data = header(model())
    cut = data.index(b"llama.block_count") + len("llama.block_count") + 5
    fails(data[:cut], r"truncated GGUF header at byte \d+ \(reading key 'llama.block_count'\)",
          truncated=True)


@pytest.mark.parametrize(("entry", "match"), [
    (("general.name", STRING, Raw(struct.pack("<Q", 2**62) + b"abc")), "past any real header"),
    (("tokens", ARRAY, Raw(struct.pack("<IQ", STRING, 2**60))), "past any real header"),
    (("bytes", ARRAY, Raw(struct.pack("<IQ", UINT8, 2**60))), "past any real header"),
    (("deep", ARRAY, Raw(struct.pack("<IQ", ARRAY, 2**60))), "past any real header"),
    (("floats", ARRAY, Raw(struct.pack("<IQ", FLOAT64, 2**61 - 1))), "past any real header"),
    (("llama.block_count", ARRAY, Raw(struct.pack("<IQ", UINT32, 2**60))), r"array of \d+ items"),
])
def test_lying_lengths(entry: Entry, match: str) -> None:
    fails(header([entry, *model()]), match)


def test_lying_counts_and_key_lengths() -> None:
    fails(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40), "GGUF header says 1099511627776 metadata")
    fails(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**62), "key at byte 24 is 4611686018427387904")
    # Knowing the file's size, a string longer than the file is a lie, not a cut.
    data = header([("general.name", STRING, Raw(struct.pack("<Q", 100) + b"abc"))])
    fails(data, "truncated", truncated=True)
    fails(data, "past the end of the file", file_size=len(data))
    fails(data, "truncated", truncated=True, file_size=len(data) + 100)


def test_unknown_value_types() -> None:
    fails(header([("general.x", 13, Raw(b"\0" * 8)), *model()]), "unknown GGUF value type 13")
    odd_items = ("general.x", ARRAY, Raw(struct.pack("<IQ", 99, 0)))
    fails(header([odd_items, *model()]), "unknown GGUF value type 99")


def test_arrays_nested_too_deep() -> None:
    value = (UINT8, [1])
    for _ in range(6):
        value = (ARRAY, [value])
    fails(header([("general.deep", ARRAY, value), *model()]), "nested over 4 deep")


@pytest.mark.parametrize(("change", "match"), [
    ({"general.architecture": None}, "missing general.architecture"),
    ({"general.architecture": (UINT32, 7)}, "general.architecture is 7"),
    ({"general.architecture": (STRING, "")}, "general.architecture is ''"),
    ({"general.architecture": (STRING, b"\xff")}, "not UTF-8"),
    ({"llama.block_count": None}, "missing llama.block_count"),
    ({"llama.embedding_length": None}, "missing llama.embedding_length"),
    ({"llama.attention.head_count": None}, "missing llama.attention.head_count"),
    ({"llama.block_count": (UINT32, 0)}, "llama.block_count is 0, not a count"),
    ({"llama.block_count": (UINT64, 2**40)}, "llama.block_count is 1099511627776"),
    ({"llama.block_count": (FLOAT32, 4.0)}, "llama.block_count is a FLOAT32"),
    ({"llama.block_count": (BOOL, True)}, "llama.block_count is a BOOL"),
    ({"llama.attention.head_count": (UINT32, 0)}, "head_count is 0"),
    ({"llama.attention.head_count": (INT32, -8)}, "head_count is -8"),
    ({"llama.attention.head_count_kv": (UINT32, 0)}, "head_count_kv is 0"),
    ({"llama.attention.head_count_kv": (UINT32, 16)}, "head_count_kv exceeds"),
    ({"llama.attention.key_length": (STRING, "64")}, "key_length is a STRING"),
])
def test_bad_model_values(change: dict[str, tuple[int, object] | None], match: str) -> None:
    fails(header(model(change)), match)


def test_other_bad_keys() -> None:
    fails(header([(b"\xff\xfe", UINT8, 1)]), "key at byte 24 is not UTF-8")
    fails(header([*model(), ("llama.block_count", UINT32, 4)]), "appears twice")


def test_context_length_is_optional() -> None:
    assert parse_gguf_header(header(model({"llama.context_length": None}))).context_length is None
    odd = model({"llama.context_length": (FLOAT32, 2048.0)})
    assert parse_gguf_header(header(odd)).context_length is None


def test_kv_cache_bytes() -> None:
    assert kv_cache_bytes(MINIMAL, 0) == 0
    assert kv_cache_bytes(MINIMAL, 4096) == 4 * 4096 * (2 * 32 + 2 * 32) * 2
    with pytest.raises(ValueError, match="negative"):
        kv_cache_bytes(MINIMAL, -1)


# --- any bytes: a result or a GgufError -----------------------------------------------------

def parse_or_error(data: bytes, file_size: int | None = None) -> GgufInfo | GgufError:
    try:
        return parse_gguf_header(data, file_size)
    except GgufError as error:
        return error


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
V3 = b"GGUF" + struct.pack("<I", 3)


@PROPERTY
@given(st.binary(max_size=300), st.sampled_from([b"", b"GGUF", V3, V3 + bytes(8)]))
def test_random_bytes(tail: bytes, start: bytes) -> None:
    parse_or_error(start + tail)
    parse_or_error(start + tail, len(start + tail))


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, len(RICH) - 1), st.integers(0, 255)), max_size=6),
       st.integers(0, len(RICH)))
def test_damaged_headers(changes: list[tuple[int, int]], size: int) -> None:
    data = bytearray(RICH)
    for where, byte in changes:
        data[where] = byte
    parse_or_error(bytes(data))
    parse_or_error(bytes(data[:size]))
    parse_or_error(bytes(data[:size]), size)


INT_RANGES = {UINT8: (0, 2**8 - 1), INT8: (-(2**7), 2**7 - 1), UINT16: (0, 2**16 - 1),
              INT16: (-(2**15), 2**15 - 1), UINT32: (0, 2**32 - 1), INT32: (-(2**31), 2**31 - 1),
              UINT64: (0, 2**64 - 1), INT64: (-(2**63), 2**63 - 1)}


def scalars(kind: int) -> st.SearchStrategy[object]:
    if kind in INT_RANGES:
        return st.integers(*INT_RANGES[kind])
    if kind in (FLOAT32, FLOAT64):
        return st.floats(width=32 if kind == FLOAT32 else 64)
    return st.booleans() if kind == BOOL else st.text(max_size=12)


SCALAR_KINDS = st.sampled_from(sorted({*FORMS, STRING}))
ARRAYS = SCALAR_KINDS.flatmap(lambda kind: st.lists(scalars(kind), max_size=6).map(
    lambda items: (kind, items)))
VALUES = st.one_of(
    SCALAR_KINDS.flatmap(lambda kind: scalars(kind).map(lambda value: (kind, value))),
    ARRAYS.map(lambda array: (ARRAY, array)),
    st.lists(ARRAYS, max_size=3).map(lambda arrays: (ARRAY, (ARRAY, arrays))))
# No dot after "x_": such a key cannot end like a key the parser reads.
EXTRA_KEYS = st.text("abcdefghijklmnopqrstuvwxyz_", max_size=10).map(lambda name: "extra.x_" + name)


@settings(PROPERTY, max_examples=30)
@given(st.data())
def test_other_entries_change_nothing(data: st.DataObject) -> None:
    extras = data.draw(st.lists(st.tuples(EXTRA_KEYS, VALUES), max_size=8))
    entries = model() + [(key, kind, value) for key, (kind, value) in extras]
    entries = data.draw(st.permutations(entries))
    assert parse_gguf_header(header(entries)) == MINIMAL
