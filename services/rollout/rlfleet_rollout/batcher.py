"""How group threads reach the engine.

:class:`DirectGeneration` is for engines that batch continuously themselves (vLLM's
AsyncLLM, ``engine.concurrent``): every group thread calls the engine at once, each turn
of each episode is its own request inside the engine, and nothing of ours merges or waits.

:class:`GenerationBatcher` is for engines that run one batch at a time (hf): one engine
thread, many episodes: requests from every running group are merged into batches (same
sampling params and adapter), so generation is batched across all the episodes a replica
is playing, not just within a group.

Each group thread submits one job per turn (its live episodes) and then steps the env, so
groups drift out of phase and a batch started at the first arrival would hold only a few
of them. The batcher therefore waits, at most ``linger_s``, until every playing group
(``expected()``) has its turn queued: the engine then runs one batch per turn of the whole
replica, which is what makes a forward pass cheap per episode.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from rlfleet.engines.base import (
    Engine,
    EngineDead,
    Generation,
    GenerationRequest,
    SamplingConfig,
)

GENERATE_SECONDS = Histogram("rlfleet_rollout_generate_seconds", "engine time per batch",
                             buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
BATCH_SIZE = Histogram("rlfleet_rollout_batch_requests", "requests per engine batch",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
TOKENS = Counter("rlfleet_rollout_tokens_total", "tokens generated")


@dataclass
class _Job:
    requests: list[GenerationRequest]
    params: SamplingConfig
    adapter: str | None
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        p = self.params
        # A seeded job (through its params, or requests with their own seeds: a
        # deterministic run) is never merged with another: the forward's floats depend
        # on the batch's shape, and a seeded run must replay bit for bit whatever else
        # the replica is playing. Unseeded jobs merge freely.
        seeded = p.seed is not None or any(r.seed is not None for r in self.requests)
        return (p.temperature, p.top_p, p.top_k, p.max_new_tokens, p.seed, self.adapter,
                id(self) if seeded else None)


@dataclass
class _Call:
    fn: Callable[[Engine], Any]
    future: Future = field(default_factory=Future)


class DirectGeneration:
    """Hands every call straight to an engine that takes concurrent calls and batches
    them itself (continuous batching): the group threads' turns interleave inside it."""

    def __init__(self, engine: Engine) -> None:
        if not getattr(engine, "concurrent", False):
            raise ValueError(f"engine {engine.name!r} runs one batch at a time: use "
                             "GenerationBatcher")
        self.engine = engine

    def generate(self, requests: list[GenerationRequest], params: SamplingConfig,
                 adapter: str | None) -> list[Generation]:
        start = time.perf_counter()
        out = self.engine.generate(requests, params, adapter)
        GENERATE_SECONDS.observe(time.perf_counter() - start)
        BATCH_SIZE.observe(len(requests))
        TOKENS.inc(sum(len(g.token_ids) for g in out))
        return out

    def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Runs fn(engine) now: the engine orders adapter loads against its requests."""
        return fn(self.engine)

    def check_health(self) -> None:
        """The engine's own health (EngineDead once it cannot serve)."""
        self.engine.check_health()

    def close(self) -> None:
        """Nothing of ours to stop; the engine is closed by its owner."""


class GenerationBatcher:
    def __init__(self, engine: Engine, max_batch: int = 64, linger_s: float = 0.02,
                 expected: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.linger_s = linger_s
        # how many groups are playing (each queues one job per turn); None: do not wait
        self.expected = expected
        self._queue: queue.Queue[_Job | _Call | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def generate(self, requests: list[GenerationRequest], params: SamplingConfig,
                 adapter: str | None) -> list[Generation]:
        job = _Job(requests, params, adapter)
        self._queue.put(job)
        return job.future.result()

    def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Runs fn(engine) on the engine thread, so adapter loads never race generation."""
        call = _Call(fn)
        self._queue.put(call)
        return call.future.result()

    def check_health(self) -> None:
        """EngineDead once the engine thread is gone (every queued turn would wait
        forever) or the engine itself cannot serve."""
        if not self._thread.is_alive() and not self._closed:
            raise EngineDead("the engine thread of the batcher died")
        self.engine.check_health()

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        pending: list[_Job | _Call] = []
        while True:
            if not pending:
                item = self._queue.get()
                if item is None:
                    return
                pending.append(item)
            deadline = time.monotonic() + self.linger_s
            while True:
                jobs = sum(isinstance(p, _Job) for p in pending)
                waiting = (self.expected is not None and jobs < self.expected()
                           and sum(len(p.requests) for p in pending if isinstance(p, _Job))
                           < self.max_batch)
                timeout = deadline - time.monotonic() if waiting else 0.0
                try:
                    item = (self._queue.get(timeout=timeout) if timeout > 0
                            else self._queue.get_nowait())
                except queue.Empty:
                    break
                if item is None:
                    self._fail_all(pending, RuntimeError("engine closed"))
                    return
                pending.append(item)
            head = pending.pop(0)
            if isinstance(head, _Call):
                self._run_call(head)
                continue
            batch, rest, size = [head], [], len(head.requests)
            for item in pending:
                if (isinstance(item, _Job) and item.key == head.key
                        and size + len(item.requests) <= self.max_batch):
                    batch.append(item)
                    size += len(item.requests)
                else:
                    rest.append(item)
            pending = rest
            self._run_batch(batch)

    def _run_call(self, call: _Call) -> None:
        try:
            call.future.set_result(call.fn(self.engine))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            call.future.set_exception(exc)

    def _run_batch(self, jobs: list[_Job]) -> None:
        requests = [r for job in jobs for r in job.requests]
        start = time.perf_counter()
        try:
            out = self.engine.generate(requests, jobs[0].params, jobs[0].adapter)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting group
            self._fail_all(jobs, exc)
            return
        GENERATE_SECONDS.observe(time.perf_counter() - start)
        BATCH_SIZE.observe(len(requests))
        TOKENS.inc(sum(len(g.token_ids) for g in out))
        i = 0
        for job in jobs:
            job.future.set_result(out[i:i + len(job.requests)])
            i += len(job.requests)

    @staticmethod
    def _fail_all(items: list, exc: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(exc)
