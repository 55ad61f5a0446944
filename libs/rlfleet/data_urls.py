"""Images as data URLs (`data:image/png;base64,...`), the one form observations travel in
inside chat messages: rlfleet never downloads a picture, so anything else is refused."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any


def data_url_bytes(url: Any, what: str = "image_url") -> bytes:
    """The bytes of an image data URL (or of an OpenAI-style {"url": ...} part); ValueError
    naming `what` for anything else."""
    url = url.get("url") if isinstance(url, Mapping) else url
    if not isinstance(url, str) or not url.startswith("data:image/"):
        raise ValueError(f"{what} must be a data:image/...;base64 URL (no downloads)")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise ValueError(f"{what} must be base64-encoded")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{what}: undecodable base64: {exc}") from exc
