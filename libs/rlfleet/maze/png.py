"""A minimal PNG encoder whose output depends only on the pixels.

Pillow's encoder is fine but its choices (filters, chunks, bundled zlib) are not ours to
pin; the env service hashes and caches observation PNGs, so we write the few chunks
ourselves: IHDR, one IDAT (filter 0 on every row, zlib at a fixed level), IEND. No time,
gamma or text chunks, so equal pixels give equal bytes in every process.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Level 6 is zlib's default trade-off; fixed here because it is part of the output bytes.
_ZLIB_LEVEL = 6


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def encode_png_rgb(pixels: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as an 8-bit RGB PNG."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got {pixels.shape} {pixels.dtype}")
    height, width = pixels.shape[:2]
    # Prefix each row with filter type 0 (None).
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)
    rows[:, 1:] = pixels.reshape(height, width * 3)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, RGB, no interlace
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), _ZLIB_LEVEL))
        + _chunk(b"IEND", b"")
    )
