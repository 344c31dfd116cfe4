"""A request's prompt as a chain of prefix-block keys, and its session key (SPEC §15).

Cache-aware routing sends a conversation back to the model server whose KV cache already
holds its beginning. What a server holds is approximated here, without tokenizing: the
request's prompt as one **canonical text** (:func:`prompt_text`), cut into blocks of
``block_chars`` characters, each block keyed by a hash of the previous key and its own text
(:func:`chain`). Two prompts share their first *k* keys exactly when their texts share the
first *k* full blocks, and that holds across dialects of the same conversation too.

The canonical text is a run of segments ``RS + label + US + content``: the ``system`` /
``instructions`` first (without Claude Code's billing block, SPEC §17.2), then ``tools``
(compact JSON), then each message (its role as the label). Nothing in a segment depends
on what follows it, so turn N+1's text starts with turn N's text whenever the client
resends the history unchanged, which is what every chat client does. Text parts count
as their text (whatever else the part carries, such as Anthropic's ``cache_control``,
which clients move to the newest message each turn); any other part (image, tool_use,
tool_result, input_audio...) and a message's ``tool_calls`` /
``images`` count as their compact JSON text, ``cache_control`` left out.

Pure functions of plain values: they never raise on a malformed body (what cannot be read
is written as JSON text or skipped) and run on the hot path, so plain strings are never
re-encoded and the chain encodes its text once.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, cast

from protocol.headers import SESSION
from protocol.json_text import compact_json

if TYPE_CHECKING:
    from collections.abc import Iterable

    from protocol.headers import Header

__all__ = ["BILLING_PREFIX", "MAX_SESSION_KEY", "SESSION_HEADERS", "chain", "prompt_text",
           "session_key"]

RS = "\x1e"  # opens a segment (a message, the system prompt, the tools)
US = "\x1f"  # ends a segment's label (its role)
PS = "\x1d"  # between the parts of one message's content

MAX_SESSION_KEY = 256  # longer session values are replaced by a digest of them

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/api/chat"})
_NO_CACHE_CONTROL = "cache_control"
# Claude Code's first system block: its billing line, which some versions change on every
# request (``cch=``); left out of the routing text (SPEC §17.2), still relayed.
BILLING_PREFIX = "x-anthropic-billing-header:"


def _json(value: Any) -> str:
    """Compact JSON text of a value from a request body; never raises."""
    try:
        return compact_json(value)
    except (TypeError, ValueError, RecursionError):  # not JSON data, or nested too deep
        return "?"


def _part_json(part: dict[str, Any]) -> str:
    if _NO_CACHE_CONTROL in part:
        part = {k: v for k, v in part.items() if k != _NO_CACHE_CONTROL}
    return _json(part)


def _content(content: Any) -> str:
    """A message's content (or a system prompt) as text."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        return _json(content)
    pieces: list[str] = []
    for part in content:
        if isinstance(part, dict):
            text = part.get("text")
            if isinstance(text, str) and part.get("type") in _TEXT_PARTS:
                pieces.append(text)
            else:
                pieces.append(_part_json(part))
        elif isinstance(part, str):
            pieces.append(part)
        else:
            pieces.append(_json(part))
    return pieces[0] if len(pieces) == 1 else PS.join(pieces)


def _message(out: list[str], message: Any) -> None:
    if not isinstance(message, dict):
        out.append(RS + "item" + US + _json(message))
        return
    role = message.get("role")
    if role is None:  # a Responses item that is not a message: function_call, reasoning...
        out.append(RS + "item" + US + _part_json(message))
        return
    out.append(RS + (role if isinstance(role, str) else _json(role)) + US)
    out.append(_content(message.get("content")))
    for extra in ("tool_calls", "images"):  # OpenAI / Ollama assistant calls, Ollama images
        value = message.get(extra)
        if value:
            out.append(PS + _json(value))


def _tools(tools: Any) -> str:
    if isinstance(tools, list):
        tools = [
            {k: v for k, v in t.items() if k != _NO_CACHE_CONTROL}
            if isinstance(t, dict) and _NO_CACHE_CONTROL in t else t
            for t in tools
        ]
    return _json(tools)


def _is_billing(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") != "text":
        return False
    text = block.get("text")
    return isinstance(text, str) and text.startswith(BILLING_PREFIX)


def _preamble(out: list[str], doc: dict[str, Any]) -> None:
    for key in ("system", "instructions"):
        value = doc.get(key)
        if key == "system" and isinstance(value, list) and any(map(_is_billing, value)):
            value = [block for block in value if not _is_billing(block)]
        if value:
            out.append(RS + "system" + US)
            out.append(_content(value))
    tools = doc.get("tools")
    if tools:
        out.append(RS + "tools" + US + _tools(tools))


def _items(out: list[str], items: Any) -> None:
    if isinstance(items, list):
        for item in items:
            _message(out, item)
    elif isinstance(items, str):  # Responses: a bare string is one user message
        if not items:
            return
        out.append(RS + "user" + US)
        out.append(items)
    elif items is not None:
        out.append(RS + "item" + US + _json(items))


def _prompt(out: list[str], prompt: Any) -> None:
    """A completion prompt: a string, token ids, or a list of strings (or of id lists)."""
    if isinstance(prompt, str):
        if not prompt:
            return
        out.append(RS + "prompt" + US)
        out.append(prompt)
    elif isinstance(prompt, list):
        if prompt and all(type(p) is int for p in prompt):  # one prompt as token ids
            out.append(RS + "prompt" + US + ",".join(map(str, prompt)))
            return
        for p in prompt:
            out.append(RS + "prompt" + US)
            out.append(p if isinstance(p, str) else _json(p))
    elif prompt is not None:
        out.append(RS + "prompt" + US + _json(prompt))


def prompt_text(path: str, doc: dict[str, Any]) -> str | None:
    """The request's prompt as canonical text, or None when it carries none.

    ``path`` is the request's path (a query string is ignored); ``doc`` its parsed body.
    Chat-like paths (``/v1/chat/completions``, ``/v1/messages``, ``/api/chat``) read
    ``system``, ``instructions``, ``tools`` and ``messages``; ``/v1/responses`` reads
    ``instructions``, ``tools`` and ``input``; ``/v1/completions`` reads ``prompt``;
    ``/api/generate`` reads ``system``, ``prompt`` and ``images``. Any other path
    (embeddings, images, token counting...) and a body that yields no text give None.
    """
    if not isinstance(cast(object, doc), dict):  # a JSON body that is not an object
        return None
    cut = path.find("?")
    if cut >= 0:
        path = path[:cut]
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    out: list[str] = []
    if path in _CHAT_PATHS:
        _preamble(out, doc)
        _items(out, doc.get("messages"))
    elif path == "/v1/responses":
        _preamble(out, doc)
        _items(out, doc.get("input"))
    elif path == "/v1/completions":
        _prompt(out, doc.get("prompt"))
    elif path == "/api/generate":
        _preamble(out, doc)
        _prompt(out, doc.get("prompt"))
        images = doc.get("images")
        if images:
            out.append(PS + _json(images))
    else:
        return None
    return "".join(out) or None


_SEEDS: dict[str, bytes] = {}


def _seed(model: str) -> bytes:
    seed = _SEEDS.get(model)
    if seed is None:
        seed = hashlib.blake2b(model.encode("utf-8", "surrogatepass"), digest_size=8,
                               person=b"sluice-chain").digest()
        if len(_SEEDS) >= 4096:  # model names come from configuration, but stay bounded
            _SEEDS.clear()
        _SEEDS[model] = seed
    return seed


def chain(model: str, text: str, block_chars: int) -> tuple[int, ...]:
    """The prefix-block keys of ``text`` for ``model``: 64-bit unsigned ints.

    The text is cut into ``block_chars``-character blocks (the last may be shorter; an
    empty text has no blocks). Key 0 is the BLAKE2b-64 of block 0 salted with the model's
    seed, key i that of block i salted with key i-1: the same across processes, and the
    same text sent to two models shares no key. ``block_chars`` < 1 is a ValueError.
    """
    if block_chars < 1:
        raise ValueError(f"block_chars must be at least 1, not {block_chars}")
    if not text:
        return ()
    blake2b = hashlib.blake2b
    salt = _seed(model)
    keys: list[int] = []
    n = len(text)
    if text.isascii():  # one encoding, blocks as byte slices (one char = one byte)
        data = memoryview(text.encode("ascii"))
        for start in range(0, n, block_chars):
            salt = blake2b(data[start:start + block_chars], digest_size=8, salt=salt).digest()
            keys.append(int.from_bytes(salt, "little"))
    else:  # blocks are still counted in characters, each encoded on its own
        for start in range(0, n, block_chars):
            block = text[start:start + block_chars].encode("utf-8", "surrogatepass")
            salt = blake2b(block, digest_size=8, salt=salt).digest()
            keys.append(int.from_bytes(salt, "little"))
    return tuple(keys)


# The headers that carry a session key, best first (SPEC §17.2): sluice's own, Claude Code's,
# Codex's (``session-id``; ``session_id`` as some clients spell it).
SESSION_HEADERS: dict[bytes, int] = {SESSION: 0, b"x-claude-code-session-id": 1,
                                     b"session-id": 2, b"session_id": 2}


def _header_session(headers: Iterable[Header]) -> str | None:
    """The best-ranked non-empty session header's value, in one pass over the headers."""
    best: str | None = None
    rank = len(SESSION_HEADERS)
    ranks = SESSION_HEADERS
    for name, raw in headers:
        at = ranks.get(name)
        if at is not None and at < rank:
            text = raw.decode("latin-1").strip(" \t")
            if text:
                best, rank = text, at
                if at == 0:
                    break
    return best


def _body_session(doc: dict[str, Any]) -> str | None:
    for key in ("prompt_cache_key", "user"):  # Responses' key, then OpenAI's user
        value = doc.get(key)
        if isinstance(value, str) and value:
            return value
    metadata = doc.get("metadata")
    if isinstance(metadata, dict):
        user_id = metadata.get("user_id")  # Anthropic's
        if isinstance(user_id, str) and user_id:
            return user_id
    return None


def session_key(headers: Iterable[Header], doc: dict[str, Any]) -> str | None:
    """The request's session key (SPEC §15, §17.2): the first present, non-empty, of the
    headers ``x-sluice-session``, ``x-claude-code-session-id``, ``session-id`` (or
    ``session_id``), then the body's ``prompt_cache_key``, OpenAI's ``user``, Anthropic's
    ``metadata.user_id``; None when there is none. ``headers`` are h11's (names
    lowercased).

    A value longer than :data:`MAX_SESSION_KEY` characters is replaced by ``"#"`` and the
    hex BLAKE2b-128 digest of it: still one key per distinct value, in bounded memory.
    """
    value = _header_session(headers)
    if value is None and isinstance(cast(object, doc), dict):
        value = _body_session(doc)
    if value is None or len(value) <= MAX_SESSION_KEY:
        return value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16)
    return "#" + digest.hexdigest()
