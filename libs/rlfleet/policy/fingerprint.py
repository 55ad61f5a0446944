"""A base model's identity, cheap to compute: what tells two checkpoints apart without
hashing gigabytes of weights.

The sha256 covers config.json, the weights index (sharded checkpoints), and for every
`*.safetensors` file its name, size and header (tensor names, dtypes, shapes, offsets);
a small file (up to WHOLE_FILE_BYTES) is hashed whole, a large one through SAMPLES
evenly spaced windows of its data. Two fine-tunes of one architecture share config and
headers but differ in (nearly) every tensor, so the samples tell them apart; an 8B
checkpoint costs a few MiB of reads. The learner records it in checkpoints and adapter
manifests; a replica compares it with its own model's before serving an adapter."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

WHOLE_FILE_BYTES = 16 << 20
SAMPLES = 16
SAMPLE_BYTES = 64 << 10
MAX_HEADER_BYTES = 100 << 20  # the limit safetensors itself applies
INDEX_FILES = ("config.json", "model.safetensors.index.json")


def model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """The sha256 (hex) identity of the model in `model_dir` (see the module)."""
    root = Path(model_dir)
    h = hashlib.sha256()
    for name in INDEX_FILES:
        path = root / name
        if path.is_file():
            h.update(f"{name}\0".encode())
            h.update(path.read_bytes())
    for path in sorted(root.glob("*.safetensors")):
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as f:
            if size <= WHOLE_FILE_BYTES:
                h.update(f.read())
                continue
            (n,) = struct.unpack("<Q", f.read(8))
            header = min(n, MAX_HEADER_BYTES)
            h.update(f.read(header))
            start = 8 + header
            span = max(0, size - start - SAMPLE_BYTES)
            for i in range(SAMPLES):
                f.seek(start + span * i // max(1, SAMPLES - 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()
