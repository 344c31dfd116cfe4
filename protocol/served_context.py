"""The context a model server actually serves one request (SPEC §17.2 "Served context").

Apps size their prompts from a model's context (Cline, Aider, Open WebUI; Codex warns
without it), so every ``/v1/models`` entry whose context is known carries it twice, as the
two names clients read: ``context_length`` and ``max_model_len``. Where it comes from, best
first:

- llama.cpp's ``GET /props``: ``default_generation_settings.n_ctx``, one slot's context
  (llama.cpp divides its whole context among its ``total_slots``, and caps a slot at the
  model's training context);
- the entry's own ``max_model_len`` (vLLM, a sluice node) or ``meta.n_ctx``;
- a managed model that is not loaded: what its configuration will give one slot.

A managed model whose configured ``context`` is larger than what its server serves (all
slots together) is worth a warning: llama.cpp capped it, and requests sized for the
configured context fail with llama.cpp's "exceeds the available context size".

Pure functions of plain values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["CONTEXT_FIELDS", "Served", "capped_message", "entry_context", "props_context",
           "with_context"]

CONTEXT_FIELDS = ("context_length", "max_model_len")


def _count(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


class Served:
    """What llama.cpp's ``/props`` says: one slot's context and how many slots."""

    __slots__ = ("per_slot", "slots")

    def __init__(self, per_slot: int, slots: int) -> None:
        self.per_slot = per_slot
        self.slots = slots

    @property
    def whole(self) -> int:
        """The server's whole context, all its slots together."""
        return self.per_slot * self.slots

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Served) and (self.per_slot, self.slots) == (
            other.per_slot, other.slots)

    def __hash__(self) -> int:
        return hash((self.per_slot, self.slots))

    def __repr__(self) -> str:
        return f"Served({self.per_slot} x {self.slots})"


def props_context(doc: Any) -> Served | None:
    """The served context in a llama.cpp ``/props`` document, or None when it has none."""
    if not isinstance(doc, dict):
        return None
    settings = doc.get("default_generation_settings")
    per_slot = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if per_slot is None:
        return None
    return Served(per_slot, _count(doc.get("total_slots")) or 1)


def entry_context(entry: dict[str, Any]) -> int | None:
    """The context a model-list entry states itself: ``max_model_len`` (vLLM's, and every
    sluice's), else ``meta.n_ctx``."""
    found = _count(entry.get("max_model_len"))
    if found is None:
        meta = entry.get("meta")
        if isinstance(meta, dict):
            found = _count(meta.get("n_ctx"))
    return found


def with_context(entry: dict[str, Any], context: int | None) -> dict[str, Any]:
    """``entry`` with ``context_length`` and ``max_model_len`` set to ``context`` (a copy;
    the entry itself when it says so already, or when ``context`` is None)."""
    if context is None or (entry.get("context_length") == context
                           and entry.get("max_model_len") == context):
        return entry
    return {**entry, "context_length": context, "max_model_len": context}


def capped_message(capped: Iterable[tuple[str, int, int]]) -> str:
    """The warning for managed models served less context than configured:
    ``(name, configured, served)`` each."""
    parts = [f"{name} is configured with context {configured} but its server serves "
             f"{served} tokens" for name, configured, served in capped]
    return ("; ".join(parts) + " (llama.cpp caps each slot at the model's training context): "
            "requests sized for the configured context will be refused; lower `context` "
            "in models: to what is served")
