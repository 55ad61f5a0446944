"""The read half of bench_sync's floor: N reader processes (replicas are processes, so the
floor's reads are too), each reading every file once into its own private buffer with the
replicas' own read code (`rlfleet.storage.adapter_versions`), minus the hashing. Kept apart from
bench_sync so a spawned reader imports only this and the storage module, not torch."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.pool import Pool

from rlfleet.storage.adapter_versions import private_buffer, read_fd_into

_barrier = None


def _init(barrier) -> None:  # noqa: ANN001
    global _barrier
    _barrier = barrier


def read_all(paths: list[str]) -> tuple[float, float]:
    """Reads each path once; returns (start, end) on the machine-wide monotonic clock."""
    assert _barrier is not None
    _barrier.wait()  # one task per reader, all starting together
    start = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            read_fd_into(fd, size, private_buffer(size))
        finally:
            os.close(fd)
    return start, time.perf_counter()


class Readers:
    """`n` reader processes, started once (their start-up is not measured)."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self._barrier = ctx.Barrier(n)
        self._pool: Pool = ctx.Pool(n, initializer=_init, initargs=(self._barrier,))

    def read(self, paths: list[str]) -> float:
        """Seconds from the first reader starting until the last one has read everything."""
        spans = self._pool.map(read_all, [paths] * self.n, chunksize=1)
        return max(e for _, e in spans) - min(s for s, _ in spans)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()
