"""Appending records to a JSON-lines file (a run's metrics.jsonl) so that no append ever
leaves a torn record behind.

Each record goes down in one write(2) of the whole line on an O_APPEND descriptor, then
fsync. A write the disk cannot take whole (ENOSPC, EFBIG, a short count) is cut back to
where the file ended before it, so the file holds whole lines only, and the error is
raised. A line torn by an earlier crash (the process died inside the write, or an older
writer did this without care) is closed with a newline before the next record, so the
new record never joins it; readers skip that one torn line (rlfleet.local.metrics_jsonl).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _ends_torn(fd: int, size: int) -> bool:
    """Whether a non-empty file does not end with a newline (its last record is torn)."""
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def append_json_line(path: Path | str, record: Mapping[str, Any]) -> None:
    """Appends `record` as one JSON line, durably, all or nothing (see the module doc).
    Raises ValueError for a record that is not JSON, OSError when the disk refuses."""
    line = (json.dumps(dict(record)) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if _ends_torn(fd, size):
            line = b"\n" + line
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"short write to {path} ({written} of "
                              f"{len(line)} bytes): the disk took only part of the record")
            os.fsync(fd)
        except OSError:
            # leave whole lines only: cut the partial record back off
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
