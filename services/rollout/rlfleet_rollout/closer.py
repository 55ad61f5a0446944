"""Closing what a failed group left open on the env service.

A group that fails (the env hung or restarted, a connection closed at its maximum age,
the caller gone) may leave episodes open on the env: ones it knows the ids of, and, when
the answer to its Open was lost, ones it never learnt the ids of (the env opened them
all the same; the Open named itself with a request id for this). They count against the
env's open-episode limit until they expire (the env's TTL, 10 minutes by default), so
they are closed now, and what the env cannot take now is retried in the background
until it can, or until the env would have expired them anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from rlfleet.clients.env import EnvClient
from rlfleet.rpc.errors import RpcError

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    give_up_at: float
    episode_ids: list[str]
    request_ids: list[str]


class EpisodeCloser:
    def __init__(self, env: EnvClient, *, timeout_s: float = 5.0, retry_s: float = 5.0,
                 give_up_s: float = 600.0) -> None:
        self.env = env
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.give_up_s = give_up_s  # the env's default episode TTL: expired by then
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def close(self, episode_ids: Iterable[str] = (), request_ids: Iterable[str] = (), *,
              now: bool = True) -> None:
        """Closes the episodes (and those the Open calls `request_ids` opened): first
        here (`now`), else at once in the background; what fails is retried in the
        background. Never raises. `now=False` costs the caller nothing (a failed Open:
        its answer goes out without waiting for an env that may be down)."""
        pending = _Pending(time.monotonic() + self.give_up_s, sorted(episode_ids),
                           sorted(request_ids))
        if not pending.episode_ids and not pending.request_ids:
            return
        if now and self._try(pending):
            return
        with self._lock:
            self._pending.append(pending)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="episode-closer",
                                                daemon=True)
                self._thread.start()
        if not now:
            self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _try(self, pending: _Pending) -> bool:
        try:
            self.env.close_episodes(pending.episode_ids, request_ids=pending.request_ids,
                                    timeout_s=self.timeout_s)
            return True
        except RpcError as err:
            log.info("closing episodes on the env failed; retrying in the background",
                     extra={"episodes": len(pending.episode_ids),
                            "requests": len(pending.request_ids), "code": err.code.name})
            return False

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.retry_s)  # woken: something to close at once, or stop
            self._wake.clear()
            with self._lock:
                if self._stopped:
                    return
                batch, self._pending = self._pending, []
            keep = [p for p in batch if time.monotonic() < p.give_up_at and not self._try(p)]
            with self._lock:
                self._pending = keep + self._pending

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._wake.set()
