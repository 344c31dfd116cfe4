"""Which compute backends a llama.cpp build has (SPEC §11.1): ``cpu``, ``cuda``, ``metal``,
``vulkan``, ..., read from what llama.cpp says of itself (pure: text in, names out).

- Its system info (``llama_print_system_info``; xllamacpp's ``get_system_info()``) names
  each compiled backend that lists features, as ``NAME : FEATURE = VALUE | ...`` segments:
  ``CPU : SSE3 = 1 | AVX = 1 | ...``; a CUDA build adds ``CUDA : ARCHS = 750,860 | ...``,
  a Metal one ``Metal : EMBED_LIBRARY = 1 | ...`` (named ``MTL`` by newer builds).
- Its devices (``get_device_info()``) name the rest by the device found: ``Vulkan0``,
  ``CUDA0``, ``MTL0``, ``CPU`` (a backend that lists no feature, Vulkan, shows only here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["backend_name", "backends_of"]

_SEGMENT_HEAD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.-]*?)\s+:\s")
_DEVICE = re.compile(r"^([A-Za-z][A-Za-z_-]*?)\d*$")
_ALIASES = {"mtl": "metal"}  # ggml's GGML_METAL_NAME


def backend_name(name: str) -> str:
    """A backend's name as sluice shows it: lowercased, ``MTL`` as ``metal``."""
    low = name.strip().lower()
    return _ALIASES.get(low, low)


def backends_of(system_info: str, devices: Iterable[str] = ()) -> list[str]:
    """The backends named by ``system_info`` and the names of ``devices``, each once, in
    the order first seen (system info first)."""
    found: list[str] = []

    def add(name: str) -> None:
        name = backend_name(name)
        if name and name not in found:
            found.append(name)

    for segment in system_info.split("|"):
        head = _SEGMENT_HEAD.match(segment)
        if head is not None:
            add(head.group(1))
    for device in devices:
        match = _DEVICE.match(device.strip())
        if match is not None:
            add(match.group(1))
    return found
