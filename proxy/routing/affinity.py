"""Where conversations are warm (SPEC §15): the router's one prefix index and session map,
asked synchronously on the request path (no await, no lock).

For a request that has several candidates under ``cache-aware``, :meth:`Affinity.conversation`
makes its :class:`Conversation` (the prompt's prefix chain and its session key) and
:meth:`Affinity.look` says how many leading blocks each candidate holds and which one
last served the session. Once an upstream has answered, :meth:`Affinity.served` records the
chain for it (and the session), and, when the upstream was predicted to hold at least
:data:`FEEDBACK_BLOCKS` blocks but reports that it reused no prompt token, drops what the
index believed of it instead. :meth:`Affinity.forget` follows candidates that leave (a node
removed, a model unloaded: its cache is gone with it).

Candidates are named as the request log's ``servedBy``: ``node:<fingerprint>`` or
``local:<backend>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from protocol.affinity import chain, prompt_text, session_key
from protocol.prefix_index import PrefixIndex, SessionMap

if TYPE_CHECKING:
    from protocol.config import AffinityConfig
    from protocol.headers import Header
    from protocol.request_info import RequestInfo
    from proxy.registry.backends import BackendRegistry
    from proxy.registry.nodes import NodeEndpoint

FEEDBACK_BLOCKS = 4  # a candidate predicted to hold this many blocks must report a reuse


class Conversation:
    """One request's facts for cache-aware routing, and what was predicted for it."""

    __slots__ = ("chain", "matches", "model", "session")

    def __init__(self, model: str, blocks: tuple[int, ...], session: str | None) -> None:
        self.model = model
        self.chain = blocks
        self.session = session
        self.matches: dict[str, int] = {}  # candidate -> leading blocks held, when asked

    def __repr__(self) -> str:
        return (f"Conversation({self.model!r}, {len(self.chain)} blocks, "
                f"session={'yes' if self.session else 'no'})")


class Affinity:
    """The index and the session map (see the module docstring)."""

    def __init__(self, config: AffinityConfig) -> None:
        self.index = PrefixIndex(config.max_blocks)
        self.sessions = SessionMap()
        self.block_chars = config.block_chars
        self._warm: dict[str, frozenset[str]] = {}  # candidate -> the models it had loaded

    def __repr__(self) -> str:
        return f"Affinity({len(self.index)} blocks, {len(self.sessions)} sessions)"

    def follow(self, config: AffinityConfig) -> None:
        """A settings change: the new cap applies at once; a new block size makes new
        chains (the old entries age out, least recently used)."""
        self.index.max_blocks = config.max_blocks
        self.block_chars = config.block_chars

    def conversation(self, info: RequestInfo, headers: Sequence[Header]) -> Conversation | None:
        """The request's chain and session key; None when it has neither (no prompt in it:
        embeddings, images, a body the gateway made)."""
        doc = info.doc
        if doc is None:
            return None
        text = prompt_text(info.path, doc)
        blocks = chain(info.model, text, self.block_chars) if text else ()
        session = session_key(headers, doc)
        if not blocks and session is None:
            return None
        if session is not None:  # one session's requests to another model go their own way
            session = f"{info.model}\x00{session}"
        return Conversation(info.model, blocks, session)

    def look(self, conversation: Conversation, names: Iterable[str]) -> str | None:
        """Fill ``conversation.matches`` for ``names``; the one of them that last served its
        session, if any."""
        names = list(names)
        if conversation.chain:
            conversation.matches = self.index.matches(conversation.model, conversation.chain,
                                                      names)
        session = conversation.session
        if session is None:
            return None
        last = self.sessions.get(session)
        return last if last in names else None

    def served(self, conversation: Conversation, name: str,
               cached: Callable[[], int | None]) -> None:
        """``name`` answered the conversation; ``cached()``: the prompt tokens it says it
        reused (None: it does not say), asked only when the index predicted a reuse."""
        model, blocks = conversation.model, conversation.chain
        if blocks:
            predicted = conversation.matches.get(name, 0)
            if predicted >= FEEDBACK_BLOCKS and cached() == 0:
                self.index.drop(model, blocks, name)  # its cache no longer holds them
            else:
                self.index.record(model, blocks, name)
        if conversation.session is not None:
            self.sessions.set(conversation.session, name)

    def forget(self, name: str, model: str | None = None) -> None:
        """``name`` left (``model`` None) or no longer has ``model`` loaded."""
        self.index.forget(name, model)
        if model is None:
            self.sessions.forget(name)
            self._warm.pop(name, None)

    def node_changed(self, endpoint: NodeEndpoint) -> None:
        """A node that has stopped having a model loaded has lost its cache of it. (A node
        that merely missed a health check keeps its entries: they age out, or an answer
        that reused nothing drops them.)"""
        if endpoint.online:
            self._loaded_now(f"node:{endpoint.fingerprint}", endpoint.loaded_ids)

    def backends_changed(self, registry: BackendRegistry) -> None:
        """A local server that is down, or lists a model no more, has lost its cache."""
        for backend in registry.backends:
            models = (frozenset(m["id"] for m in backend.models) if backend.live
                      else frozenset())
            self._loaded_now(backend.served_by.decode(), models)

    def _loaded_now(self, name: str, models: frozenset[str]) -> None:
        before = self._warm.get(name)
        if before is not None and before != models:
            for model in before - models:
                self.index.forget(name, model)
        self._warm[name] = models
