"""WebSocket frames the gateway writes itself (RFC 6455 §5.2), for the events feed's batches.

A server's frames are not masked, and the gateway's handshake accepts no extension, so a
whole text message is a two-to-ten-byte header and the UTF-8 text: framing it here costs a
fraction of a general WebSocket library's path, which a busy feed pays per event.
"""

from __future__ import annotations

import struct

__all__ = ["text_frame"]

_FIN_TEXT = 0x81  # FIN set, opcode 1 (text)


def text_frame(text: str) -> bytes:
    """One unfragmented, unmasked text frame carrying ``text``. A lone surrogate (JSON
    can carry one: ``"\\ud800"``, e.g. in a client's model id) is sent as ``?``: a text
    frame must be valid UTF-8."""
    payload = text.encode("utf-8", "replace")
    size = len(payload)
    if size < 126:
        return bytes((_FIN_TEXT, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", _FIN_TEXT, 126, size) + payload
    return struct.pack("!BBQ", _FIN_TEXT, 127, size) + payload
