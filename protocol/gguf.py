"""The header of a GGUF model file (llama.cpp's format) and the KV cache its model needs.

A model's memory is estimated before loading as its file size plus its KV cache. Here:
:func:`parse_gguf_header` reads the metadata at the start of the file from bytes the caller
read (tensor infos are not needed), :func:`kv_cache_bytes` gives llama.cpp's default KV cache.

Any bytes give a :class:`GgufInfo` or a :class:`GgufError`. Only the values needed are decoded;
the rest (the tokenizer's string arrays) is skipped by walking lengths, each length and count
checked against the bytes left first, so a lying header costs neither memory nor time.
"""

from __future__ import annotations

import struct
from typing import NoReturn

import attrs

__all__ = ["MAX_HEADER_BYTES", "GgufError", "GgufInfo", "kv_cache_bytes", "parse_gguf_header"]

MAX_HEADER_BYTES = 1 << 30  # without the file size, a claim beyond this is a lie, not a cut
MAX_ENTRIES = 100_000  # metadata entries; real files have a few dozen
MAX_DEPTH = 4  # arrays of arrays; llama.cpp itself writes none
MAX_VALUE = 1 << 20  # layers, heads and lengths (real ones are below 100_000)
MAX_KEY = 65_535  # bytes in a key, the GGUF spec's limit

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_STRING, _ARRAY = 8, 9
_INTS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 10: "Q", 11: "q"}
_SIZES = {**{t: struct.calcsize(f) for t, f in _INTS.items()}, 6: 4, 7: 1, 12: 8}
_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING",
          "ARRAY", "UINT64", "INT64", "FLOAT64")
# The keys read, after "{architecture}"; a model's keys may come before general.architecture.
_SUFFIXES = (".block_count", ".context_length", ".embedding_length", ".attention.head_count",
             ".attention.head_count_kv", ".attention.key_length", ".attention.value_length")
_ARCH_KEY = "general.architecture"
_Value = int | tuple[int, ...] | str  # a str is the architecture, or an _Other
_VERSION_NOTES = {1: " (too old: convert the model again with llama.cpp)",
                  2 << 24: " (a big-endian file)", 3 << 24: " (a big-endian file)"}


class GgufError(ValueError):
    """A header that cannot be used, with a message for the user; ``truncated`` means the
    bytes ended inside the header, so reading more of the file may help."""

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


@attrs.frozen
class GgufInfo:
    """What a GGUF header says about the model's attention. ``head_count_kv`` has one entry
    per layer, as the KV cache is kept per layer (0 for a layer without attention, as in hybrid
    models); ``head_count`` is the most of any layer; ``context_length`` is the training
    context, None if not given."""

    architecture: str
    block_count: int
    head_count: int
    head_count_kv: tuple[int, ...]
    embedding_length: int
    key_length: int
    value_length: int
    context_length: int | None


class _Other(str):
    """The kind of a value that is not read (a float, a string, an array of those...)."""

    __repr__ = str.__str__  # shown as it is in error messages


class _Reader:
    """A position in the bytes, and what is being read there, for error messages."""

    def __init__(self, data: bytes, file_size: int | None) -> None:
        self.data = data
        self.pos = 0
        # No byte of the header lies past this: a claim beyond it is a lie, not a cut.
        self.limit = max(len(data), MAX_HEADER_BYTES if file_size is None else file_size)
        self.end = "past any real header" if file_size is None else "past the end of the file"
        self.doing = "reading the magic"

    def fail(self, end: int) -> NoReturn:
        """The bytes end before ``end``: a cut if the header may go on, else a lie."""
        if end > self.limit:
            raise GgufError(f"GGUF header at byte {self.pos} claims data up to byte {end}, "
                            f"{self.end} ({self.doing})")
        raise GgufError(f"truncated GGUF header at byte {self.pos} ({self.doing})",
                        truncated=True)

    def take(self, size: int) -> int:
        """Step over ``size`` bytes and return where they start."""
        start, end = self.pos, self.pos + size
        if end > len(self.data):
            self.fail(end)
        self.pos = end
        return start

    def room(self, count: int, least: int) -> int:
        """``count``, once ``count`` items of ``least`` bytes or more are known to fit."""
        if self.pos + count * least > len(self.data):
            self.fail(self.pos + count * least)
        return count

    def uint(self, form: struct.Struct) -> int:
        return int(form.unpack_from(self.data, self.take(form.size))[0])

    def text(self, cap: int, what: str) -> str:
        """A GGUF string of at most ``cap`` bytes, as text."""
        at, size = self.pos, self.uint(_U64)
        if size > cap:
            raise GgufError(f"GGUF {what} at byte {at} is {size} bytes long")
        try:
            return self.data[self.take(size):self.pos].decode()
        except UnicodeDecodeError:
            raise GgufError(f"GGUF {what} at byte {at} is not UTF-8") from None


def _skip(r: _Reader, kind: int, depth: int = 0) -> None:
    """Step over one value of type ``kind`` without keeping it."""
    if kind in _SIZES:
        r.take(_SIZES[kind])
    elif kind == _STRING:
        r.take(r.uint(_U64))
    elif kind == _ARRAY and depth < MAX_DEPTH:
        item, count = r.uint(_U32), r.uint(_U64)
        if item in _SIZES:
            r.take(count * _SIZES[item])
        elif item == _STRING:  # a tokenizer's vocabulary: walk the lengths alone, fast
            data, pos, end = r.data, r.pos, len(r.data)
            for _ in range(r.room(count, 8)):
                r.pos = pos
                if pos + 8 > end:
                    r.fail(pos + 8)
                pos += 8 + _U64.unpack_from(data, pos)[0]
            r.take(pos - r.pos)
        elif item == _ARRAY:
            for _ in range(r.room(count, 12)):
                _skip(r, _ARRAY, depth + 1)
        else:
            raise GgufError(f"unknown GGUF value type {item} at byte {r.pos - 12} ({r.doing})")
    elif kind == _ARRAY:
        raise GgufError(f"GGUF arrays nested over {MAX_DEPTH} deep ({r.doing})")
    else:
        raise GgufError(f"unknown GGUF value type {kind} at byte {r.pos - 4} ({r.doing})")


def _value(r: _Reader, key: str, kind: int) -> _Value:
    """A value the model's numbers are read from: ints and arrays of ints are decoded."""
    if kind in _INTS:
        return int(struct.unpack_from("<" + _INTS[kind], r.data, r.take(_SIZES[kind]))[0])
    if kind == _STRING and key == _ARCH_KEY:
        return r.text(256, "architecture name")
    item = _U32.unpack_from(r.data, r.pos)[0] if r.pos + 4 <= len(r.data) else -1
    if kind != _ARRAY or item not in _INTS:
        _skip(r, kind)
        return _Other(f"an array of {_NAMES[item]}" if kind == _ARRAY else f"a {_NAMES[kind]}")
    r.take(4)
    count = r.uint(_U64)
    if count > MAX_VALUE:
        raise GgufError(f"{key} is an array of {count} items")
    start = r.take(count * _SIZES[item])
    return tuple(struct.unpack_from(f"<{count}{_INTS[item]}", r.data, start))


def parse_gguf_header(data: bytes, file_size: int | None = None) -> GgufInfo:
    """The model's numbers from ``data``, the start of a GGUF file (as much as the caller read);
    ``file_size``, if given, lets a claim past the end of the file be told from a cut."""
    r = _Reader(data, file_size)
    if data[:4] != b"GGUF"[:len(data[:4])]:
        raise GgufError(f"not a GGUF file (magic {data[:4]!r})")
    r.take(4)
    r.doing = "reading the version"
    version = r.uint(_U32)
    if version not in (2, 3):
        raise GgufError(f"unsupported GGUF version {version}{_VERSION_NOTES.get(version, '')}")
    r.doing = "reading the counts"
    r.uint(_U64)  # tensors: not needed
    entries = r.uint(_U64)
    if entries > MAX_ENTRIES:
        raise GgufError(f"GGUF header says {entries} metadata entries")
    found: dict[str, _Value] = {}
    for index in range(entries):
        r.doing = f"reading key #{index}"
        key = r.text(MAX_KEY, "key")
        r.doing = f"reading key {key!r}"
        kind = r.uint(_U32)
        if key == _ARCH_KEY or key.endswith(_SUFFIXES):
            if key in found:
                raise GgufError(f"GGUF key {key!r} appears twice")
            found[key] = _value(r, key, kind)
        else:
            _skip(r, kind)
    return _info(found)


def _info(found: dict[str, _Value]) -> GgufInfo:
    """Check the values read and make the model's numbers from them."""
    arch = found.get(_ARCH_KEY)
    if not isinstance(arch, str) or isinstance(arch, _Other) or not arch:
        raise GgufError(f"missing {_ARCH_KEY}" if arch is None else f"{_ARCH_KEY} is {arch!r}")

    def number(suffix: str, default: int | None = None) -> int:
        key = arch + suffix
        value = found.get(key, default)
        if value is None:
            raise GgufError(f"missing {key}")
        if not isinstance(value, int) or not 0 < value <= MAX_VALUE:
            raise GgufError(f"{key} is {value!r}, not a count from 1 to {MAX_VALUE}")
        return value

    def per_layer(suffix: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        key = arch + suffix
        value = found.get(key)
        if value is None and default is not None:
            return default
        if not isinstance(value, tuple):
            return (number(suffix),) * layers
        if len(value) != layers:
            raise GgufError(f"{key} has {len(value)} entries for {layers} layers")
        if not all(0 <= v <= MAX_VALUE for v in value) or not any(value):
            raise GgufError(f"{key} has counts out of range: {list(value[:8])}")
        return value

    layers = number(".block_count")
    heads = per_layer(".attention.head_count")
    kv_heads = per_layer(".attention.head_count_kv", heads)
    if any(kv > h for kv, h in zip(kv_heads, heads, strict=True)):
        raise GgufError(f"{arch}.attention.head_count_kv exceeds {arch}.attention.head_count")
    embedding = number(".embedding_length")
    head_size = embedding // max(heads)
    context = found.get(arch + ".context_length")
    return GgufInfo(
        architecture=arch, block_count=layers, head_count=max(heads), head_count_kv=kv_heads,
        embedding_length=embedding,
        key_length=number(".attention.key_length", head_size or None),
        value_length=number(".attention.value_length", head_size or None),
        context_length=context if isinstance(context, int) and context > 0 else None)


def kv_cache_bytes(info: GgufInfo, context: int) -> int:
    """llama.cpp's default KV cache (f16 keys and values) for ``context`` tokens, in bytes."""
    if context < 0:
        raise ValueError(f"context must not be negative, got {context}")
    per_token = sum(kv * (info.key_length + info.value_length) for kv in info.head_count_kv)
    return context * per_token * 2
