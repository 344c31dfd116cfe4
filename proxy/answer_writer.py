"""What the two answer writers share: :class:`proxy.ollama_out.OllamaOut` (an Ollama answer)
and :class:`proxy.translated_out.TranslatedOut` (a translated one, SPEC §17.1) each stand in
for the client's :class:`~proxy.downstream.Downstream` as the relay's
:class:`~proxy.downstream.AnswerSink`, take the model server's answer and write another API's.

:class:`AnswerWriter` holds what is the same in both: the states and their one table of
moves (:data:`MOVES`; an illegal move is a bug and raises), the client's Downstream, the
headers kept from the server's answer, and an error answer that came chunked: gathered to
its end, then written whole in the client's family (a head while gathering is the next
node's answer after a failover: the gathered one is dropped). Each writer says how a model
server's error answer reads in its API (:meth:`AnswerWriter.upstream_error`).

States:

- ``IDLE`` — nothing of the model server's answer yet;
- ``GATHERING_ERROR`` — its error answer came chunked and is being gathered;
- ``STREAMING`` — the client's head is out, the stream is being written;
- ``DONE`` — the whole answer is out (a whole one, an error answer, a stream's end);
- ``BROKEN`` — an error event or line ended the stream; what follows is dropped.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar

from protocol.headers import AFFINITY, SERVED_BY, Header

if TYPE_CHECKING:
    from protocol.errors import Family, SluiceError
    from protocol.response import Response
    from proxy.downstream import Downstream

__all__ = ["MOVES", "AnswerWriter", "State"]

JSON_TYPE = b"application/json"


class State(enum.Enum):
    IDLE = "idle"
    GATHERING_ERROR = "gathering-error"
    STREAMING = "streaming"
    DONE = "done"
    BROKEN = "broken"


MOVES: dict[State, frozenset[State]] = {
    State.IDLE: frozenset({State.GATHERING_ERROR, State.STREAMING, State.DONE}),
    # Any head again: the next node's answer after a failover.
    State.GATHERING_ERROR: frozenset({State.GATHERING_ERROR, State.STREAMING, State.DONE}),
    State.STREAMING: frozenset({State.DONE, State.BROKEN}),
    State.DONE: frozenset(),
    State.BROKEN: frozenset(),
}


class AnswerWriter:
    """See the module. ``real``: the client's Downstream. The bytes the relay gives are
    never chunk-framed (:attr:`chunked` is false, :meth:`frame` leaves them as they are)."""

    chunked = False
    KIND: ClassVar[str]  # how the writer names itself in a bug's message
    EXTRA_HEADERS: ClassVar[tuple[Header, ...]] = ()  # said on every answer it writes
    ERROR_TYPE: ClassVar[bytes] = JSON_TYPE  # the content type of its error answers

    def __init__(self, real: Downstream) -> None:
        self.real = real
        self.response: Response = real.response
        self.state = State.IDLE
        self._error_status = 0  # GATHERING_ERROR: the model server's error answer so far
        self._error_headers: list[Header] = []
        self._error_body = bytearray()

    @property
    def family(self) -> Family:
        """The client's API family (its error bodies' shape)."""
        raise NotImplementedError

    def upstream_error(self, status: int, body: bytes) -> SluiceError:
        """The model server's error answer (``status`` >= 400, its whole ``body``) as the
        client's error."""
        raise NotImplementedError

    @property
    def closing(self) -> bool:
        return self.real.closing

    def frame(self, data: bytes) -> bytes:
        return data

    def _move(self, new: State) -> None:
        if new not in MOVES[self.state]:
            raise AssertionError(f"illegal {self.KIND} answer move {self.state.value} -> "
                                 f"{new.value}")
        self.state = new

    def _wrong(self, what: str) -> AssertionError:
        return AssertionError(f"{self.KIND} answer: {what} while {self.state.value}")

    def _headers(self, given: list[Header], content_type: bytes) -> list[Header]:
        """The client's answer's headers: its type, the writer's own, and the gateway's
        that came with the server's answer (who served it, the affinity)."""
        return [(b"content-type", content_type), *self.EXTRA_HEADERS,
                *((k, v) for k, v in given if k in (SERVED_BY, AFFINITY))]

    def _new_answer(self) -> None:
        """A head (or a whole answer) of the model server's: before any, or after an error
        answer cut while it was gathered (a failover), whose body is then dropped."""
        if self.state is not State.IDLE and self.state is not State.GATHERING_ERROR:
            raise self._wrong("another answer")
        self._error_status = 0
        self._error_headers = []
        self._error_body = bytearray()

    async def _send_error(self, err: SluiceError, headers: list[Header]) -> None:
        """``err`` as the whole answer, in the client's family."""
        self._move(State.DONE)
        self.real.error_code = err.code
        await self.real.send_whole(err.status, self._headers(headers, self.ERROR_TYPE),
                                   err.body(self.family))

    async def _gather(self, status: int, headers: list[Header], body: bytes, *,
                      end: bool) -> None:
        """An error answer's head came chunked: gather its body (to its end, then write it
        whole)."""
        self._move(State.GATHERING_ERROR)
        self._error_status = status
        self._error_headers = headers
        self._error_body += body
        if end:
            await self._send_gathered()

    async def _send_gathered(self, data: bytes = b"") -> None:
        """The gathered error answer's end (with its last ``data``), written whole."""
        self._error_body += data
        await self._send_error(self.upstream_error(self._error_status, bytes(self._error_body)),
                               self._error_headers)
