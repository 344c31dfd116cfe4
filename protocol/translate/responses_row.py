"""The Responses API's row of :data:`protocol.translate.TRANSLATORS`: the translator of
:mod:`protocol.translate.responses` with the face every row has
(:class:`protocol.translate.Translator`): its answers need the request's tool names, so that
namespace members and custom tools go back as the client named them
(:func:`answer_options`)."""

from __future__ import annotations

from typing import Any

from protocol.translate.responses import (
    FAMILY,
    NAME,
    Stream,
    count_answer,
    from_chat,
    overflow_error,
    to_chat,
    tool_names,
)

__all__ = ["FAMILY", "NAME", "Stream", "answer_options", "count_answer", "from_chat",
           "overflow_error", "to_chat"]


def answer_options(body: dict[str, Any]) -> dict[str, Any]:
    """The keywords ``from_chat`` and ``Stream`` take for this request: its tools' names."""
    return {"tools": tool_names(body)}
