"""A lean HTTP/1.1 *client-side* codec for the hot path to model servers (RFC 9112).

Sans-I/O: bytes in, values out. The gateway builds request heads itself and reads upstream
responses with :func:`parse_response_head` and the body readers below; a chunked body can be
walked with :class:`ChunkedScanner` so its framing is forwarded verbatim instead of being
decoded and re-encoded. Anything malformed raises :class:`ProtocolError`.
"""

from __future__ import annotations

import re

from protocol.headers import Header
from protocol.sse import TAIL

MAX_CHUNK_LINE = 4096  # longest chunk-size line (with extensions) accepted
MAX_TRAILERS = 16 * 1024  # trailer section bytes accepted (and dropped)

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# Bytes a header value may hold (RFC 9110 §5.5: HTAB, visible and obs-text) and a name's
# (a token): what bytes.translate deletes, so that whatever is left is not allowed.
_VALUE_BYTES = b"\t" + bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))
_TOKEN_BYTES = b"-!#$%&'*+.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SEEN_LINES: dict[bytes, Header] = {}  # header line -> its pair, for lines seen lately
_SEEN_MAX = 512  # lines kept; then forgotten all at once
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: (.*))?")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
# The common chunk-size line, matched in one step: hex digits, maybe an extension, (CR)LF.
# Whatever it accepts the general path accepts too, with the same size.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\n]*)?\r?\n")


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 framing. From :meth:`ChunkedScanner.feed`, ``forward`` holds
    the bytes of that read before the break, still good to forward."""

    forward: bytes = b""


class ResponseHead:
    __slots__ = ("chunked", "content_length", "headers", "http_minor", "idle_timeout",
                 "keep_alive", "reason", "status_code")

    def __init__(self, status_code: int, reason: bytes, headers: list[Header], http_minor: int,
                 content_length: int | None, chunked: bool, keep_alive: bool,
                 idle_timeout: float | None = None) -> None:
        self.status_code = status_code
        self.reason = reason
        self.headers = headers
        self.http_minor = http_minor
        self.content_length = content_length
        self.chunked = chunked
        self.keep_alive = keep_alive
        # Seconds the server keeps an idle connection open, as its Keep-Alive header says
        # (llama.cpp and Node send "timeout=5"); None when it does not say.
        self.idle_timeout = idle_timeout

    def __repr__(self) -> str:
        framing = "chunked" if self.chunked else (
            f"length={self.content_length}" if self.content_length is not None else "close")
        return f"ResponseHead({self.status_code}, {framing}, keep_alive={self.keep_alive})"


def build_request_head(method: bytes, target: bytes, headers: list[Header]) -> bytes:
    """The request line and headers. Names and values must already be valid (they come from
    a parsed client request or from the gateway's own settings)."""
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def parse_response_head(head: bytes, *, request_method: bytes = b"POST") -> ResponseHead:
    """Parse a response head (status line and header lines, without the blank line)."""
    cut = head.find(b"\n")
    status_line = (head if cut < 0 else head[:cut]).rstrip(b"\r")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise ProtocolError(f"invalid status line {status_line[:80]!r}")
    fields = b"" if cut < 0 else head[cut + 1:]
    pairs = _plain_fields(fields)
    if pairs is None:
        pairs = _checked_fields(fields)
    return _framed(match, pairs, request_method)


def _plain_fields(fields: bytes) -> list[Header] | None:
    """The (lowercased name, value) pairs of CRLF-ended header lines whose bytes are all
    allowed, checked a block at a time (bytes.translate) rather than by a regular
    expression a line; None for anything else, left to :func:`_checked_fields`. A model
    server sends mostly the same lines in every answer: a line seen lately is looked up."""
    if fields.translate(None, _VALUE_BYTES).replace(b"\r\n", b""):
        return None  # a control byte, or a CR or LF that is not a CRLF
    seen = _SEEN_LINES
    pairs: list[Header] = []
    for line in fields.split(b"\r\n"):
        pair = seen.get(line)
        if pair is None:
            name, sep, value = line.partition(b":")
            if not sep or not name or name.translate(None, _TOKEN_BYTES):
                if line:
                    return None
                continue  # a blank line
            pair = (name.lower(), value.strip(b" \t"))
            if len(seen) >= _SEEN_MAX:
                seen.clear()
            seen[line] = pair
        pairs.append(pair)
    return pairs


def _checked_fields(fields: bytes) -> list[Header]:
    """Header lines one by one: the (lowercased name, value) pairs, or the reason they are
    not valid."""
    pairs: list[Header] = []
    for raw in fields.split(b"\n"):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            continue
        if line[0] in b" \t":
            raise ProtocolError("obsolete header line folding")
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise ProtocolError(f"invalid header line {line[:80]!r}")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            raise ProtocolError(f"invalid character in header {name[:40]!r}")
        pairs.append((name.lower(), value))
    return pairs


def _framed(match: re.Match[bytes], headers: list[Header], request_method: bytes) -> ResponseHead:
    """The head's framing (RFC 9112 §6.3) from its status line and header pairs."""
    minor = int(match.group(1))
    status = int(match.group(2))
    reason = match.group(3) or b""
    named = dict(headers)
    if len(named) == len(headers):  # each name once: the usual head
        length = named.get(b"content-length")
        transfer_encoding = named.get(b"transfer-encoding")
        connection = named.get(b"connection")
        keep_alive_value = named.get(b"keep-alive")
    else:  # repeated names: Content-Length must agree, the others are lists
        length = transfer_encoding = connection = None
        keep_alive_value = named.get(b"keep-alive")  # the last one
        for name, value in headers:
            if name == b"content-length":
                if length is not None and _content_length(length) != _content_length(value):
                    raise ProtocolError("conflicting Content-Length headers")
                length = value
            elif name == b"transfer-encoding":
                transfer_encoding = value if transfer_encoding is None \
                    else transfer_encoding + b", " + value
            elif name == b"connection":
                connection = value if connection is None else connection + b"," + value
    content_length = None if length is None else _content_length(length)
    chunked = False
    if status < 200 or status in (204, 304) or request_method == b"HEAD":
        content_length, transfer_encoding = 0, None
    if transfer_encoding is not None and content_length is not None:
        # RFC 9112 §6.3: "ought to be handled as an error" (request smuggling, response
        # splitting); a gateway that guessed which one frames the body could relay half of it.
        raise ProtocolError("both Transfer-Encoding and Content-Length")
    if transfer_encoding is not None:
        chunked = transfer_encoding.rpartition(b",")[2].strip().lower() == b"chunked"
    if connection is None:
        keep_alive = minor == 1
    else:
        tokens = {t.strip() for t in connection.lower().split(b",")}
        keep_alive = (minor == 1 and b"close" not in tokens) or (
            minor == 0 and b"keep-alive" in tokens)
    if not chunked and content_length is None:
        keep_alive = False  # the body ends when the connection does
    idle_timeout = None if keep_alive_value is None else _idle_timeout(keep_alive_value)
    return ResponseHead(status, reason, headers, minor, content_length, chunked, keep_alive,
                        idle_timeout)


def _idle_timeout(value: bytes) -> float | None:
    """:func:`keep_alive_timeout`, looked up for a value seen lately (a server sends the
    same one with every answer)."""
    seen = _SEEN_KEEP_ALIVE
    if value in seen:
        return seen[value]
    if len(seen) >= _SEEN_MAX:
        seen.clear()
    timeout = seen[value] = keep_alive_timeout(value)
    return timeout


_SEEN_KEEP_ALIVE: dict[bytes, float | None] = {}


def keep_alive_timeout(value: bytes) -> float | None:
    """The ``timeout`` of a ``Keep-Alive: timeout=5, max=100`` value (RFC 2068 §19.7.1.1):
    how many seconds the server keeps an idle connection; None when it is not given or is
    not a whole number."""
    for param in value.split(b","):
        name, _, number = param.partition(b"=")
        if name.strip().lower() == b"timeout":
            number = number.strip().strip(b'"')
            return float(number) if number.isdigit() and len(number) <= 9 else None
    return None


def _content_length(value: bytes) -> int:
    if not value.isdigit() or len(value) > 18:
        raise ProtocolError(f"invalid Content-Length {value[:40]!r}")
    return int(value)


_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedScanner:
    """Walks a chunked body as it arrives.

    :meth:`feed` returns the bytes that belong to data chunks, framing included, so they can be
    forwarded verbatim; the terminating zero-size chunk and any trailers are consumed and not
    returned (the caller writes its own ``0\\r\\n\\r\\n``). A chunk-size line split across
    reads is held back until it is complete. With ``collect=True`` the decoded payload is also
    appended to ``parts``. ``tail`` keeps the last payload bytes (for an SSE boundary check),
    ``leftover`` any bytes after the body.
    """

    __slots__ = ("_line", "_remaining", "_state", "_trailer_bytes", "_trailer_line", "collect",
                 "leftover", "parts", "tail")

    def __init__(self, *, collect: bool = False) -> None:
        self._state = _SIZE
        self._remaining = 0  # payload bytes left in the chunk, or CRLF bytes left after it
        self._line = b""  # an unfinished chunk-size line
        self._trailer_bytes = 0
        self._trailer_line = b""  # start of a trailer line begun in an earlier read
        self.collect = collect
        self.parts: list[bytes] = []
        self.tail = b""
        self.leftover = b""

    def __repr__(self) -> str:
        names = ("size", "data", "data-end", "trailer", "done")
        return f"ChunkedScanner({names[self._state]}, remaining={self._remaining})"

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        """The bytes to forward for ``data`` (plus any held-back size line)."""
        if self._line:
            data = self._line + data
            self._line = b""
        pos = 0
        end = len(data)
        forward_to = 0
        size_line = _SIZE_LINE.match
        try:
            while pos < end:
                state = self._state
                if state == _SIZE and (m := size_line(data, pos)) is not None:
                    # Fast path: whole chunks (size line, payload, CRLF) inside this read, one
                    # after another (an SSE upstream sends one per event); ``tail`` is cut
                    # once, at the end of the last one, unless a chunk is shorter than it.
                    parts = self.parts if self.collect else None
                    tail_end = 0  # where the payload's last TAIL bytes end, when whole
                    first = pos
                    while m is not None:
                        start = m.end()
                        size = int(m[1], 16)
                        stop = start + size
                        if not size or stop + 2 > end:
                            break
                        if data[stop:stop + 2] != b"\r\n":
                            forward_to = pos
                            raise ProtocolError("chunk data not followed by CRLF")
                        if size >= TAIL:
                            tail_end = stop
                        else:
                            self.tail = ((data[tail_end - TAIL:tail_end] if tail_end
                                          else self.tail) + data[start:stop])[-TAIL:]
                            tail_end = 0
                        if parts is not None:
                            parts.append(data[start:stop])
                        pos = stop + 2
                        m = size_line(data, pos) if pos < end else None
                    if tail_end:
                        self.tail = data[tail_end - TAIL:tail_end]
                    if pos > first:
                        forward_to = pos
                        continue
                if state == _DATA:
                    stop = min(pos + self._remaining, end)
                    self._remaining -= stop - pos
                    self.tail = (self.tail + data[max(pos, stop - TAIL):stop])[-TAIL:]
                    if self.collect:
                        self.parts.append(data[pos:stop])
                    pos = forward_to = stop
                    if not self._remaining:
                        self._state, self._remaining = _DATA_END, 2
                elif state == _DATA_END:
                    while self._remaining and pos < end:
                        if data[pos] != b"\r\n"[2 - self._remaining]:
                            raise ProtocolError("chunk data not followed by CRLF")
                        pos += 1
                        self._remaining -= 1
                    forward_to = pos
                    if not self._remaining:
                        self._state = _SIZE
                elif state == _SIZE:
                    newline = data.find(b"\n", pos)
                    if newline < 0:
                        if end - pos > MAX_CHUNK_LINE:
                            raise ProtocolError("chunk-size line too long")
                        self._line = data[pos:]
                        break
                    size_text = data[pos:newline].split(b";", 1)[0].strip(b" \t\r")
                    if _HEX.fullmatch(size_text) is None:
                        raise ProtocolError(f"invalid chunk size {data[pos:newline][:40]!r}")
                    size = int(size_text, 16)
                    pos = newline + 1
                    if size:
                        self._state, self._remaining = _DATA, size
                        forward_to = pos
                    else:
                        self._state = _TRAILER  # the last chunk: not forwarded
                elif state == _TRAILER:
                    newline = data.find(b"\n", pos)
                    stop = end if newline < 0 else newline + 1
                    self._trailer_bytes += stop - pos
                    if self._trailer_bytes > MAX_TRAILERS:
                        raise ProtocolError("trailer section too long")
                    if newline < 0:
                        self._trailer_line = (self._trailer_line + data[pos:end])[:2]
                        pos = end
                        break
                    if (self._trailer_line + data[pos:newline][:2]) in (b"", b"\r"):
                        self._state = _DONE  # the blank line that ends the trailers
                        self.leftover = data[stop:]
                        pos = end
                        break
                    self._trailer_line = b""
                    pos = stop
                else:  # _DONE
                    self.leftover += data[pos:]
                    break
        except ProtocolError as exc:
            exc.forward = data[:forward_to]  # the good bytes before the break
            raise
        return data if forward_to == end else data[:forward_to]


# ---------------------------------------------------------------- responses we write

LAST_CHUNK = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def build_response_head(status: int, reason: bytes, headers: list[Header]) -> bytes:
    """A response status line and headers (names and values already valid: relayed from a
    parsed upstream head, or the gateway's own)."""
    if not reason:
        reason = _REASONS.get(status, b"")
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def frame_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (empty data frames to nothing: it would end the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""


def body_allowed(status: int) -> bool:
    return status >= 200 and status not in (204, 304)


_REASONS = {
    200: b"OK", 201: b"Created", 202: b"Accepted", 204: b"No Content",
    400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
    405: b"Method Not Allowed", 408: b"Request Timeout", 409: b"Conflict",
    413: b"Content Too Large", 422: b"Unprocessable Content", 426: b"Upgrade Required",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
    501: b"Not Implemented", 502: b"Bad Gateway", 503: b"Service Unavailable",
    504: b"Gateway Timeout", 505: b"HTTP Version Not Supported",
}
