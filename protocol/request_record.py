"""What is kept of one finished request (SPEC §9.1), and how its ``usage`` is found.

A :class:`RequestRecord` is made once, by the settle step of the request, and read by the
request log, the metrics and the live events. It never holds a prompt, a completion, a body,
a header value or a key: only the facts below.

``usage`` is the upstream's own object: for a whole answer it is found by looking for the
``"usage"`` key near where answers put it, without parsing (or decoding) the whole body; for
an SSE stream the :class:`~protocol.sse.SseObserver` keeps the last event line that carries
one, and it is parsed here, once, when the request ends.
"""

from __future__ import annotations

import datetime
import functools
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

import attrs

from protocol.json_text import compact_json, scan_json

if TYPE_CHECKING:
    from protocol.sse import SseObserver

__all__ = ["OUTCOMES", "RequestRecord", "cached_tokens", "iso_utc", "usage_from_event",
           "usage_in_body"]

OUTCOMES = ("success", "failure", "aborted", "refused")
USAGE_WINDOW = 4096  # bytes after the "usage" key read to find its object
USAGE_TRIES = 8  # "usage" keys looked at, from the last one back
_USAGE_KEY = b'"usage"'
_MILLIS = tuple(f".{n:03d}Z" for n in range(1000))  # the tail of a stamp, by millisecond


class _Seconds:
    """The text of the last whole second turned into ISO 8601 (a feed writes many stamps a
    second; formatting a date is most of the cost of one)."""

    second = -1
    text = ""


def iso_utc(epoch: float) -> str:
    """``2026-12-01T12:00:00.123Z`` (UTC, milliseconds, cut as datetime cuts them)."""
    second = int(epoch // 1)
    micros = round((epoch - second) * 1_000_000)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    if second != _Seconds.second:
        moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
        _Seconds.text = moment.strftime("%Y-%m-%dT%H:%M:%S")
        _Seconds.second = second
    return _Seconds.text + _MILLIS[micros // 1000]


def _usage_at(data: bytes, key: int, name: bytes = _USAGE_KEY) -> dict[str, Any] | None:
    """The JSON object that follows the key ``name`` found at ``key``, if it is one."""
    after = key + len(name)
    start = data.find(b"{", after, after + 16)
    if start < 0 or data[after:start].strip() != b":":
        return None  # "usage": null (every chunk but the last, with include_usage)
    end = data.find(b"}", start, start + USAGE_WINDOW)
    if end < 0:
        return None
    if data.find(b"{", start + 1, end) < 0:  # a flat object: the usual case
        text = data[start:end + 1].decode("utf-8", "replace")
    else:  # nested details (prompt_tokens_details...): decode the window
        text = data[start:start + USAGE_WINDOW].decode("utf-8", "ignore")
    try:  # the C scanner itself: json.loads' Python layers cost more than the object
        value, _ = scan_json(text, 0)
    except (StopIteration, ValueError):
        return None
    return value if isinstance(value, dict) else None


def usage_in_body(body: bytes, name: bytes = _USAGE_KEY) -> dict[str, Any] | None:
    """The top-level ``usage`` (or another object named ``name``) of a whole JSON answer. A
    key spelled ``"usage"`` can only be a key (inside a JSON string its quotes would be
    escaped); the last one is taken, as answers put it after the choices."""
    key = body.rfind(name)
    for _ in range(USAGE_TRIES):
        if key < 0:
            break
        usage = _usage_at(body, key, name)
        if usage is not None:
            return usage
        key = body.rfind(name, 0, key)
    return None


_TIMINGS_KEY = b'"timings"'
_DETAILS = ("prompt_tokens_details", "input_tokens_details")  # Chat Completions, Responses


def cached_tokens(usage: dict[str, Any] | None, timings_in: bytes | None) -> int | None:
    """The prompt tokens the server reused from its cache (SPEC §15): ``usage``'s
    ``prompt_tokens_details.cached_tokens`` (``input_tokens_details`` in the Responses API)
    or Anthropic's ``cache_read_input_tokens``, else llama.cpp's ``timings.cache_n`` found in
    ``timings_in`` (the answer, or a stream's line that has it); None when nobody says."""
    if usage:
        for name in _DETAILS:
            details = usage.get(name)
            if isinstance(details, dict):
                cached = details.get("cached_tokens")
                if isinstance(cached, int) and cached >= 0:
                    return cached
        cached = usage.get("cache_read_input_tokens")
        if isinstance(cached, int) and cached >= 0:
            return cached
    if timings_in:
        timings = usage_in_body(timings_in, _TIMINGS_KEY)
        cached = None if timings is None else timings.get("cache_n")
        if isinstance(cached, int) and cached >= 0:
            return cached
    return None


def reused_tokens(observer: SseObserver | None, body: bytes | None) -> int | None:
    """:func:`cached_tokens` of one answer: a stream's (what its ``observer`` kept: the
    usage lines, llama.cpp's timings line) or a whole answer's ``body``; None when it does
    not say."""
    if observer is not None:
        usage = (None if observer.usage_line is None
                 else stream_usage(observer.first_usage_line, observer.usage_line))
        return cached_tokens(usage, observer.timings_line)
    if body is not None:
        return cached_tokens(usage_in_body(body), body)
    return None


def usage_from_event(line: bytes | None) -> dict[str, Any] | None:
    """The ``usage`` of one SSE ``data:`` line kept by the observer (a chat completion
    chunk's ``usage``, or a Responses API event's ``response.usage``)."""
    if not line:
        return None
    return usage_in_body(line)


def stream_usage(first: bytes | None, last: bytes | None) -> dict[str, Any] | None:
    """A stream's usage from the first and the last event lines that carry one: the same
    line for OpenAI chunks and the Responses API (``response.completed``); for Anthropic's
    Messages, ``message_start``'s (input tokens) merged with ``message_delta``'s (output
    tokens; its figures win)."""
    later = usage_from_event(last)
    if first is None or first == last:
        return later
    earlier = usage_from_event(first)
    if not earlier or not later:
        return later or earlier
    return {**earlier, **later}


def token_counts(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a usage object, in the Chat Completions, the Responses
    API or Anthropic's spelling (whose cached input tokens count as prompt tokens too); None
    when it has neither."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    for cached in _ANTHROPIC_CACHED:  # Anthropic counts cached input apart from input_tokens
        more = usage.get(cached)
        if isinstance(more, int) and "prompt_tokens" not in usage:
            prompt += more
    return prompt, completion


_ANTHROPIC_CACHED = ("cache_read_input_tokens", "cache_creation_input_tokens")


@attrs.define(slots=True, repr=False)
class RequestRecord:
    """One finished request (SPEC §9.1). Times are seconds; ``started_at`` is wall-clock.
    ``attempts`` are (upstream, outcome) for each upstream tried, for the metrics;
    ``routed`` says the model id was one the gateway routed (so it may be a metric label);
    ``load`` is the wait for a managed model's load (``loadMs``, null when none); ``ttfb``
    the first body byte, ``ttft`` the first SSE event with data (keep-alive comments before
    it are bytes, not tokens; null for a whole answer or a stream with no data event)."""

    id: str
    started_at: float
    method: str
    path: str
    model: str | None
    stream: bool
    transport: str
    served_by: str | None
    status: int
    outcome: str
    failover: str | None
    ttfb: float | None
    duration: float
    bytes_out: int
    events: int | None
    usage: dict[str, Any] | None
    error: str | None
    attempts: tuple[tuple[str, str], ...] = ()
    routed: bool = False
    usage_in: bytes | None = None  # where ``usage`` is still to be found (see find_usage)
    usage_first: bytes | None = None  # a stream's first usage line, when it is not usage_in
    load: float | None = None  # seconds it waited for its managed model to load (SPEC §11)
    served_model: str | None = None  # the model the upstream was asked for (an alias's target)
    ttft: float | None = None  # an SSE answer's first data event to the client (SPEC §3.2)
    timings_in: bytes | None = None  # where llama.cpp's timings are (see find_usage)
    cached: int | None = None  # prompt tokens the server reused (``cachedTokens``, SPEC §15)
    affinity: str | None = None  # hit | miss | session | spill: why it went there (SPEC §15)
    queue: float | None = None  # seconds it waited in the queue (SPEC §18; None: no model)
    priority: str | None = None  # its class in the queue: interactive | batch (SPEC §18)
    translated: str | None = None  # the client's API when sent as Chat Completions (§17.1)
    usage_estimated: bool = False  # usage is characters / 4: the server said none (§17.1)

    def __repr__(self) -> str:
        return (f"RequestRecord({self.id} {self.method} {self.path} {self.status} "
                f"{self.outcome} served_by={self.served_by})")

    def find_usage(self) -> dict[str, Any] | None:
        """``usage``, found (once) in ``usage_in``: the whole answer or the SSE line that
        carries it. Done by the first reader, in the hub's batch, not on the hot path; the
        bytes are let go then."""
        if self.usage_in is not None or self.timings_in is not None:
            if self.usage_in is None:
                self.usage = None
            elif self.usage_first is None:
                self.usage = usage_in_body(self.usage_in)
            else:
                self.usage = stream_usage(self.usage_first, self.usage_in)
            self.cached = cached_tokens(self.usage, self.timings_in)
            self.usage_in = self.usage_first = self.timings_in = None
        return self.usage

    def to_json(self) -> dict[str, Any]:
        self.find_usage()
        return {
            "id": self.id,
            "startedAt": iso_utc(self.started_at),
            "method": self.method,
            "path": self.path,
            "model": self.model,
            "servedModel": self.served_model,
            "stream": self.stream,
            "transport": self.transport,
            "servedBy": self.served_by,
            "status": self.status,
            "outcome": self.outcome,
            "failover": self.failover,
            "ttfbMs": None if self.ttfb is None else round(self.ttfb * 1000, 3),
            "ttftMs": None if self.ttft is None else round(self.ttft * 1000, 3),
            "durationMs": round(self.duration * 1000, 3),
            "bytesOut": self.bytes_out,
            "events": self.events,
            "usage": self.usage,
            "error": self.error,
            "loadMs": None if self.load is None else round(self.load * 1000, 3),
            "cachedTokens": self.cached,
            "affinity": self.affinity,
            "queueMs": None if self.queue is None else round(self.queue * 1000, 3),
            "priority": self.priority,
            "translated": self.translated,
            "usageEstimated": self.usage_estimated,
        }

    def json_text(self) -> str:
        """The JSON text of :meth:`to_json`: the same keys in the same order, the same
        values once parsed (a time is written with three decimals). Written directly,
        because a live feed sends one for every request and the json module's walk of the
        dict cost three times this."""
        self.find_usage()
        usage, ttfb, ttft, events, load, queue = (self.usage, self.ttfb, self.ttft,
                                                  self.events, self.load, self.queue)
        route = _route_json(self.method, self.path, self.model, self.served_model, self.stream,
                            self.transport, self.served_by)
        return (f'{{"id":{encode_basestring(self.id)},'
                f'"startedAt":"{iso_utc(self.started_at)}",{route},'
                f'"status":{self.status:d},"outcome":{encode_basestring(self.outcome)},'
                f'"failover":{_string_or_null(self.failover)},'
                f'"ttfbMs":{"null" if ttfb is None else _millis(ttfb)},'
                f'"ttftMs":{"null" if ttft is None else _millis(ttft)},'
                f'"durationMs":{_millis(self.duration)},"bytesOut":{self.bytes_out:d},'
                f'"events":{"null" if events is None else format(events, "d")},'
                f'"usage":{"null" if usage is None else compact_json(usage)},'
                f'"error":{_string_or_null(self.error)},'
                f'"loadMs":{"null" if load is None else _millis(load)},'
                f'"cachedTokens":{"null" if self.cached is None else format(self.cached, "d")},'
                f'"affinity":{_string_or_null(self.affinity)},'
                f'"queueMs":{"null" if queue is None else _millis(queue)},'
                f'"priority":{_string_or_null(self.priority)},'
                f'"translated":{_string_or_null(self.translated)},'
                f'"usageEstimated":{"true" if self.usage_estimated else "false"}}}')


def _string_or_null(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


def _millis(seconds: float) -> str:
    """Seconds as milliseconds in JSON, three decimals: parsed, the very float that
    ``round(seconds * 1000, 3)`` is (both round the same decimal expansion)."""
    return f"{seconds * 1000:.3f}"


@functools.lru_cache(maxsize=256)
def _route_json(method: str, path: str, model: str | None, served_model: str | None,
                stream: bool, transport: str, served_by: str | None) -> str:
    """The members of a record's JSON from ``method`` to ``servedBy``: the same for every
    request to one model by one route, so made once for them."""
    return (f'"method":{encode_basestring(method)},"path":{encode_basestring(path)},'
            f'"model":{_string_or_null(model)},"servedModel":{_string_or_null(served_model)},'
            f'"stream":{"true" if stream else "false"},'
            f'"transport":{encode_basestring(transport)},"servedBy":{_string_or_null(served_by)}')
