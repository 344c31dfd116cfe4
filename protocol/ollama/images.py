"""Ollama's ``images`` (base64 strings, no media type) as OpenAI image content parts.

The media type comes from the image's first bytes (PNG, JPEG, GIF, WebP); anything else is
called JPEG, as most vision servers sniff the bytes themselves. A string that is not base64
is refused with a 400, as Ollama refuses it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from protocol.ollama.errors import invalid

__all__ = ["image_part", "image_parts", "media_type"]

_SNIFF = 16  # bytes enough for every signature below


def media_type(head: bytes) -> str:
    """The image media type told by an image's first bytes; ``image/jpeg`` if unknown."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return "image/jpeg"


def image_part(data: str, where: str) -> dict[str, Any]:
    """One ``image_url`` part carrying the base64 image ``data`` as a data URL."""
    text = "".join(data.split())  # base64 wrapped over lines is still base64
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where} is not a base64-encoded image") from None
    if not raw:
        raise invalid(f"{where} is empty")
    url = f"data:{media_type(raw[:_SNIFF])};base64,{text}"
    return {"type": "image_url", "image_url": {"url": url}}


def image_parts(images: object, where: str) -> list[dict[str, Any]]:
    """The parts for a request's or a message's ``images`` (absent or null: none)."""
    if images is None:
        return []
    if not isinstance(images, list):
        raise invalid(f"{where} must be a list of base64-encoded images")
    parts = []
    for i, item in enumerate(images):
        if not isinstance(item, str):
            raise invalid(f"{where}[{i}] must be a base64-encoded image (a string)")
        parts.append(image_part(item, f"{where}[{i}]"))
    return parts
