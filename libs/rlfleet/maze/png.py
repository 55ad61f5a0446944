"""A minimal PNG encoder whose output depends only on the pixels.

Pillow's encoder is fine but its choices (filters, chunks, bundled zlib) are not ours to
pin; the env service hashes and caches observation PNGs, so we write the few chunks
ourselves: IHDR, one IDAT (filter 0 on every row, zlib at a fixed level), IEND. No time,
gamma or text chunks, so equal pixels give equal bytes in every process.

`encode_png_rows` takes the scanlines already laid out as PNG wants them (a filter byte,
then the row's RGB bytes); the renderer keeps its backgrounds in that layout so that a
frame goes to zlib without being copied again. Both functions give the same bytes for the
same pixels.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Level 6 is zlib's default trade-off; fixed here because it is part of the output bytes.
_ZLIB_LEVEL = 6
_IEND = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND") & 0xFFFFFFFF)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return b"".join(
        (
            struct.pack(">I", len(data)),
            kind,
            data,
            struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)) & 0xFFFFFFFF),
        )
    )


def encode_png_rows(rows: np.ndarray) -> bytes:
    """Encode (H, 1 + 3W) uint8 scanlines, each a filter-0 byte and W RGB pixels."""
    if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] % 3 != 1:
        raise ValueError(f"expected (H, 1 + 3W) uint8 scanlines, got {rows.shape} {rows.dtype}")
    if rows[:, 0].any():
        raise ValueError("every scanline must start with filter type 0")
    height, width = rows.shape[0], (rows.shape[1] - 1) // 3
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, RGB, no interlace
    # zlib reads the array's buffer directly (no copy); C-contiguous so rows are in order.
    data = np.ascontiguousarray(rows)
    return b"".join(
        (
            _SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(data, _ZLIB_LEVEL)),
            _IEND,
        )
    )


def encode_png_rgb(pixels: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as an 8-bit RGB PNG."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got {pixels.shape} {pixels.dtype}")
    height, width = pixels.shape[:2]
    # Prefix each row with filter type 0 (None).
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)
    rows[:, 1:] = pixels.reshape(height, width * 3)
    return encode_png_rows(rows)
