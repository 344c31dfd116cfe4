"""The Ollama API translated to and from OpenAI's, pure (SPEC §12): bytes and values in,
bytes and values out; no clock (times and durations are arguments), no I/O.

The endpoint (``proxy/``) runs the translated request through routing, failover and
timeouts like any ``/v1/*`` request, and hands the answer back here:

- :func:`translate_request` (:mod:`.requests`): an Ollama body -> :class:`Translated`
  (OpenAI path and body, model, stream, keep_alive, :class:`Answer`) or :class:`LoadOnly`;
  bad input raises a 400 :class:`~protocol.errors.SluiceError`.
- :class:`StreamTranslator` (:mod:`.stream`): upstream SSE pieces -> NDJSON lines, event
  by event; ``finish`` gives the last line, ``error`` the line of a broken stream.
- :func:`whole_answer`, :func:`load_answer` (:mod:`.answers`): answers not streamed.
- :func:`upstream_error`, :func:`error_line`, :func:`not_supported`,
  :func:`model_not_found` (:mod:`.errors`).
- :func:`tags_body`, :func:`ps_body`, :func:`show_body`, :func:`show_model`,
  :func:`version_body`, :func:`format_time` (:mod:`.listings`).

Helpers: :mod:`.keep_alive` (durations), :mod:`.options` (options, format),
:mod:`.messages` and :mod:`.images` (chat messages, tools, images), :mod:`.tool_calls`
(tool calls both ways), :mod:`.metrics` (``done_reason``, counts, durations),
:mod:`.sse_reader` (SSE events from pieces), :mod:`.wire` (JSON in and out).
"""

from __future__ import annotations

from protocol.ollama.answers import JSON_TYPE, NDJSON_TYPE, load_answer, whole_answer
from protocol.ollama.errors import (
    error_line,
    invalid,
    model_not_found,
    not_supported,
    upstream_error,
)
from protocol.ollama.keep_alive import parse_keep_alive
from protocol.ollama.listings import (
    OLLAMA_VERSION,
    LoadedModel,
    ModelFacts,
    facts_from_entry,
    format_time,
    ps_body,
    show_body,
    show_model,
    tags_body,
    version_body,
)
from protocol.ollama.metrics import Timing
from protocol.ollama.requests import PATHS, Answer, Kind, LoadOnly, Translated, translate_request
from protocol.ollama.stream import StreamTranslator

__all__ = [
    "JSON_TYPE",
    "NDJSON_TYPE",
    "OLLAMA_VERSION",
    "PATHS",
    "Answer",
    "Kind",
    "LoadOnly",
    "LoadedModel",
    "ModelFacts",
    "StreamTranslator",
    "Timing",
    "Translated",
    "error_line",
    "facts_from_entry",
    "format_time",
    "invalid",
    "load_answer",
    "model_not_found",
    "not_supported",
    "parse_keep_alive",
    "ps_body",
    "show_body",
    "show_model",
    "tags_body",
    "translate_request",
    "upstream_error",
    "version_body",
    "whole_answer",
]
