"""The routing facts of a multipart/form-data upload (SPEC §17.2 "Forms"): Whisper's
transcriptions and translations, image edits and variations.

A :class:`FormReader` is fed the body's chunks as they arrive (the connection reads it, up to
``api.max_body_size``) and reads two fields from it: ``model`` (required) and ``stream``
(optional, ``true`` or ``false``). Wherever they stand, before or after the file, the whole
body's framing is checked: a body that is not a complete multipart message is a 400
``invalid_request``, as is one without ``model``. The body itself is never changed (it is
forwarded byte for byte), so aliases do not apply to a form's model.

The parsing is python-multipart's streaming parser (imported by the first form, so a
gateway that never sees one does not hold it); this module keeps only the two fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.errors import SluiceError, bad_request
from protocol.request_info import RequestInfo, timeout_class_for

if TYPE_CHECKING:
    from protocol.headers import Header

__all__ = ["FORM_PATHS", "MAX_FIELD", "FormReader", "form_reader"]

FORM_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations",
                        "/v1/images/edits", "/v1/images/variations"})
MAX_FIELD = 4096  # bytes of a `model` or `stream` value (a model id is far shorter)
MAX_PART_HEADERS = 16 * 1024  # bytes of one part's header block
_WANTED = frozenset({"model", "stream"})


def _content_type(headers: list[Header]) -> bytes | None:
    for name, value in headers:
        if name == b"content-type":
            return value
    return None


def form_reader(path: str, headers: list[Header]) -> FormReader | None:
    """A reader for the body of a request to one of the form paths that says it is
    multipart/form-data; None for any other request (read as JSON, SPEC §6)."""
    if path not in FORM_PATHS:
        return None
    content_type = _content_type(headers)
    if content_type is None or not content_type.lstrip().lower().startswith(
            b"multipart/form-data"):
        return None
    return FormReader(content_type)


class FormReader:
    """One upload's ``model`` and ``stream`` fields, read as its body streams in (see the
    module docstring). :meth:`feed` each chunk in order, then :meth:`info`."""

    __slots__ = ("_error", "_fields", "_finished", "_headers", "_keep", "_name", "_parser",
                 "_part", "_size", "_value")

    def __init__(self, content_type: bytes) -> None:
        from python_multipart.multipart import MultipartParser, parse_options_header

        self._error: str | None = None
        self._fields: dict[str, bytes] = {}
        self._finished = False
        self._name = bytearray()  # the current header's name and value, as they come
        self._headers = bytearray()
        self._size = 0  # bytes of the current part's headers before the current one
        self._part: list[tuple[bytes, bytes]] = []  # the current part's headers
        self._keep: str | None = None  # the field whose value is being read
        self._value = bytearray()
        self._parser: Any = None
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if not boundary:
            self._error = "the multipart/form-data body has no boundary in its Content-Type"
            return
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin,
            "on_header_begin": self._header_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        })

    def __repr__(self) -> str:
        return f"FormReader(fields={sorted(self._fields)}, error={self._error!r})"

    # ------------------------------------------------------------------ the parser's callbacks

    def _part_begin(self) -> None:
        self._part = []
        self._size = 0
        self._keep = None
        self._value.clear()

    def _header_begin(self) -> None:
        self._name.clear()
        self._headers.clear()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]
        self._grown()

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._headers += data[start:end]
        self._grown()

    def _grown(self) -> None:
        if len(self._name) + len(self._headers) + self._size > MAX_PART_HEADERS:
            raise _Malformed("a part's headers are too large")

    def _header_end(self) -> None:
        self._size += len(self._name) + len(self._headers)
        self._part.append((bytes(self._name), bytes(self._headers)))

    def _headers_finished(self) -> None:
        name = _field_name(self._part)
        self._keep = name if name in _WANTED and name not in self._fields else None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._keep is not None:
            self._value += data[start:end]
            if len(self._value) > MAX_FIELD:
                raise _Malformed(f"the form field {self._keep!r} is longer than "
                                 f"{MAX_FIELD} bytes")

    def _part_end(self) -> None:
        if self._keep is not None:
            self._fields[self._keep] = bytes(self._value)
            self._keep = None

    def _end(self) -> None:
        self._finished = True

    # ------------------------------------------------------------------ the reader's side

    def feed(self, data: bytes) -> None:
        """The next chunk of the body; raises a 400 at the first malformed byte."""
        if self._error is not None:
            raise self._refusal()
        if self._finished:
            return  # the epilogue after the closing boundary: ignored, as RFC 2046 says
        try:
            self._parser.write(data)
        except _Malformed as exc:
            self._error = str(exc)
        except ValueError as exc:  # python-multipart's MultipartParseError
            self._error = f"the multipart/form-data body is malformed: {exc}"
        if self._error is not None:
            raise self._refusal()

    def info(self, path: str) -> RequestInfo:
        """The request's routing facts once the whole body was fed; raises a 400 when the
        body is not a complete form or has no ``model``."""
        if self._error is None and not self._finished:
            self._error = ("the multipart/form-data body ends before its closing boundary")
        if self._error is not None:
            raise self._refusal()
        raw = self._fields.get("model")
        try:
            model = None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request("the form field \"model\" is not UTF-8", param="model") from None
        if not model:
            raise bad_request("the form has no \"model\" field (multipart/form-data: a part "
                              "named model, before or after the file)", param="model")
        stream = self._fields.get("stream", b"").strip().lower() in (b"true", b"1")
        return RequestInfo(model, stream, timeout_class_for(path), None, path)

    def _refusal(self) -> SluiceError:
        return bad_request(self._error or "malformed form")


class _Malformed(Exception):
    """Raised inside a parser callback: the form breaks one of our limits."""


def _field_name(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The ``name`` of a part's Content-Disposition (``form-data; name="model"``)."""
    from python_multipart.multipart import parse_options_header

    for field, value in headers:
        if field.strip().lower() == b"content-disposition":
            kind, options = parse_options_header(value.strip())
            if kind != b"form-data":
                return None
            name = options.get(b"name")
            return None if name is None else name.decode("utf-8", "replace")
    return None
