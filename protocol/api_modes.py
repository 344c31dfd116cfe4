"""Which of a server's APIs are translated (SPEC §17.1), pure: a server's ``apis``
setting and what its probes found, as :class:`ApiModes`, and the probe's verdict.

Each API (``messages``, ``responses``) is ``"native"`` (relayed byte for byte),
``"translate"`` (sent to ``/v1/chat/completions``) or None (not known yet: relayed, and
a 404/405 before any byte sends the request again translated and marks it). ``native`` and
``translate`` settings fix both; ``auto`` is ``native`` for the bundled llama.cpp and for
sluice nodes, else probed with each health check until known: ``POST <path> {}``.
"""

from __future__ import annotations

import json
from typing import Final, Literal

__all__ = ["API_NAMES", "API_OF_PATH", "NATIVE", "PROBES", "ApiModes", "Mode", "initial_modes",
           "verdict"]

Mode = Literal["native", "translate"]
API_NAMES: Final = ("messages", "responses")
PROBES: Final = {"messages": b"/v1/messages", "responses": b"/v1/responses"}
# The client paths of those APIs (the exchange's one test per request; the translators are
# imported by the first such request: :mod:`protocol.translate`).
API_OF_PATH: Final = {"/v1/messages": "messages", "/v1/messages/count_tokens": "messages",
                      "/v1/responses": "responses", "/v1/responses/input_tokens": "responses"}


class ApiModes:
    """A server's mode per API (None: not known yet). Replaced, never changed in place
    by anyone but its owner (the backend registry)."""

    __slots__ = ("messages", "responses", "setting")

    def __init__(self, setting: str, messages: Mode | None, responses: Mode | None) -> None:
        self.setting = setting
        self.messages = messages
        self.responses = responses

    def __repr__(self) -> str:
        return f"ApiModes({self.setting}, {self.messages}, {self.responses})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ApiModes) and self.setting == other.setting
                and self.messages == other.messages and self.responses == other.responses)

    def __hash__(self) -> int:
        return hash((self.setting, self.messages, self.responses))

    def of(self, name: str) -> Mode | None:
        return self.messages if name == "messages" else self.responses \
            if name == "responses" else "native"

    def known(self) -> bool:
        return self.messages is not None and self.responses is not None

    def with_mode(self, name: str, mode: Mode | None) -> ApiModes:
        if name == "messages":
            return ApiModes(self.setting, mode, self.responses)
        return ApiModes(self.setting, self.messages, mode)

    def view(self) -> dict[str, str | None]:
        """As the API shows it: ``{"messages": ..., "responses": ...}``."""
        return {"messages": self.messages, "responses": self.responses}


NATIVE: Final = ApiModes("native", "native", "native")


def initial_modes(setting: str, *, bundled: bool = False) -> ApiModes:
    """What a server's ``apis`` setting says before any probe."""
    if setting == "translate":
        return ApiModes(setting, "translate", "translate")
    if setting == "native" or bundled:
        return ApiModes(setting, "native", "native")
    return ApiModes(setting, None, None)


def verdict(status: int, body: bytes) -> Mode | None:
    """A ``POST <path> {}`` probe's answer: 400 or 422 (it read the request and refused
    it) -> native; 404, 405, or a 2xx whose body is an error (LM Studio's "Unexpected
    endpoint") -> translate; anything else (5xx, 401...) -> unknown."""
    if status == 400 or status == 422:
        return "native"
    if status == 404 or status == 405:
        return "translate"
    if 200 <= status < 300:
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if isinstance(doc, dict) and "error" in doc:
            return "translate"
    return None
