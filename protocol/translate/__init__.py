"""Messages and Responses translated to and from Chat Completions, pure (SPEC §17.1): values
in, values and bytes out; no clock, no I/O.

Where a model server lacks the client's API (``apis: translate``, or ``auto`` that found
it missing), the relay sends the client's request to the server's ``/v1/chat/completions``
and writes the client's answer back, through the module of :data:`TRANSLATORS` for the
client's path. Every translator module has the same face (:class:`Translator`), so the next
API is one more row of the table, not new branches:

- ``NAME``: the client's API, as the request log's ``translated`` and ``apis`` say it
  (``"messages"``, ``"responses"``); ``FAMILY``: its :class:`~protocol.errors.Family`.
- ``to_chat(body, *, context)``: the client's request body (a parsed JSON object) -> a
  Chat Completions body; a refused input raises a 400 :class:`~protocol.errors.SluiceError`
  (its body in ``FAMILY``'s shape). ``context``: the served context in tokens when known
  (``max_tokens`` is clamped to it minus the prompt's estimate).
- ``from_chat(answer, *, model, prompt_chars=0)``: a whole Chat answer (parsed) -> the
  client's whole answer; ``model`` is the name the client asked for; ``prompt_chars``: the
  characters of the translated prompt (:func:`~protocol.translate.chat.text_of_prompt`),
  for the input estimate when the answer has no usage.
- ``Stream(model, *, prompt_chars=0)``: one streamed answer, a state machine fed parsed
  chat chunks (:func:`~protocol.translate.chat.read_chunk` reads one into plain values):
  ``start()`` the events to send once the upstream answered 200; ``feed(chunk)`` one
  parsed ``data:`` chunk; ``ping()`` a keep-alive while the prompt is read (may be
  ``b""``); ``finish()`` at ``[DONE]``/the end: close what is open, the terminal events;
  ``fail(code, message)`` the stream was cut or the upstream errored midway (the last bytes
  sent); attributes ``usage`` (:class:`~protocol.translate.chat.Usage`) and
  ``usage_estimated``. After ``finish`` or ``fail`` every method gives ``b""``.
- ``overflow_error(tokens, maximum)``: the server's context overflow as the client's
  error (Messages 400 ``prompt is too long: N tokens > M maximum``; Responses
  ``context_length_exceeded``); ``tokens``/``maximum`` ``None`` when the server said
  neither.
- ``count_answer(tokens)``: the answer of the API's count path (``count_tokens``,
  ``input_tokens``) for the server's exact count.
- ``answer_options(body)``: what the answer needs to know of the request beyond the model
  (e.g. the Responses tools' names), as keywords given to ``from_chat`` and ``Stream``;
  ``{}`` for most.

A stream may also have ``plain(strings, thinking) -> bytes``, the fast path of ``feed`` for
chunks of text alone (their JSON strings' bodies, plain: no escapes); the relay's writer
uses it when it is there.

:data:`TRANSLATORS` maps a client path to its module, :data:`COUNT_PATHS` a count path. A
new API is its module (or a row module giving a module this face, as ``responses_row.py``
does), its rows here, and its paths in :data:`protocol.api_modes.API_OF_PATH` (the
exchange's one test per request; this package is imported by the first such request).
The pieces every translator shares (reading chat chunks and answers into plain values, the
characters ÷ 4 estimate, the server's context overflow) are in :mod:`.chat`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from protocol.errors import Family, SluiceError
from protocol.translate import messages, responses_row
from protocol.translate.chat import Usage

__all__ = ["CHAT_PATH", "COUNT_PATHS", "TRANSLATORS", "StreamTranslator",
           "Translator", "Usage", "translator_for"]

CHAT_PATH = "/v1/chat/completions"


class StreamTranslator(Protocol):
    """One streamed answer (see the module)."""

    usage: Usage
    usage_estimated: bool

    def start(self) -> bytes: ...

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def ping(self) -> bytes: ...

    def finish(self) -> bytes: ...

    def fail(self, code: str, message: str) -> bytes: ...


class Translator(Protocol):
    """The face of a translator module (see the module)."""

    @property
    def NAME(self) -> str: ...

    @property
    def FAMILY(self) -> Family: ...

    # Stream(model, *, prompt_chars=0, **answer_options) -> StreamTranslator
    @property
    def Stream(self) -> Callable[..., StreamTranslator]: ...

    def to_chat(self, body: dict[str, Any], *, context: int | None) -> dict[str, Any]: ...

    # from_chat(answer, *, model, prompt_chars=0, **answer_options) -> the client's answer
    @property
    def from_chat(self) -> Callable[..., dict[str, Any]]: ...

    def overflow_error(self, tokens: int | None, maximum: int | None) -> SluiceError: ...

    def count_answer(self, tokens: int) -> dict[str, Any]: ...

    def answer_options(self, body: dict[str, Any]) -> dict[str, Any]: ...


# The client's path -> its translator.
TRANSLATORS: dict[str, Translator] = {
    "/v1/messages": messages,
    "/v1/responses": responses_row,
}

# The count paths -> the translator whose prompt they count.
COUNT_PATHS: dict[str, Translator] = {
    "/v1/messages/count_tokens": messages,
    "/v1/responses/input_tokens": responses_row,
}


def translator_for(path: str) -> Translator | None:
    """The translator of a client path (a model call or a count), or None: not translated."""
    found = TRANSLATORS.get(path)
    return found if found is not None else COUNT_PATHS.get(path)
