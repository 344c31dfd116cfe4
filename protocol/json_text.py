"""JSON the fast way: compact text from one encoder made once, and the decoder's C scanner.

``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder for every call, which costs
more than encoding a small object itself; the live feed writes a frame for every request,
so its encoder is made once here and called directly. Where the C accelerator is missing,
the plain ``JSONEncoder.encode`` is used: the text is the same. Likewise ``json.loads``'
layers around the C scanner (sniffing the encoding of bytes, the checks of ``decode``) cost
as much as parsing a small object: :data:`scan_json` is the scanner itself.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ["compact_json", "scan_json"]

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _made_once() -> Callable[[Any], str]:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has the accelerator
        return _ENCODER.encode
    try:  # (markers, default, encoder, indent, key sep, item sep, sort, skipkeys, allow_nan)
        encode = make(None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",",
                      False, False, True)
    except TypeError:  # pragma: no cover - another signature: take the slow path
        return _ENCODER.encode

    def compact(value: Any) -> str:
        return "".join(encode(value, 0))

    return compact


compact_json: Callable[[Any], str] = _made_once()
"""``compact_json(value)``: the text ``JSONEncoder(separators=(",", ":"),
ensure_ascii=False).encode(value)`` makes. Its input is ours: no circular references (they
are not looked for)."""

scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""``scan_json(text, index)``: the JSON value that starts at ``index`` and where it ends;
StopIteration when none starts there, ValueError (JSONDecodeError) when it is broken."""
