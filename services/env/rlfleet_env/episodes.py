"""The live episodes of the env service: a bounded, expiring, thread-safe table.

Bounded so that a client that opens and vanishes leaks nothing: an episode idle longer
than `ttl_s` expires, and opening beyond `max_episodes` answers RESOURCE_EXHAUSTED. Each
episode has its own lock, so thousands of episodes step concurrently.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rlfleet.maze.render import FRAME_CACHE
from rlfleet.rpc.errors import NotFound, ResourceExhausted
from rlfleet.tasks import TaskEpisode

OPEN_EPISODES = Gauge("rlfleet_env_open_episodes", "episodes held by the env service")
EXPIRED_EPISODES = Counter("rlfleet_env_expired_episodes_total", "idle episodes expired")


class FrameCacheCollector:
    """The observation frame cache (`rlfleet.maze.render.FRAME_CACHE`) as metrics, read
    when scraped so the render path only bumps plain counters."""

    def collect(self):  # noqa: ANN201
        info = FRAME_CACHE.info()
        yield CounterMetricFamily("rlfleet_env_frame_cache_hits_total", "observation frames served "
                                  "from the frame cache", value=info.hits)
        yield CounterMetricFamily("rlfleet_env_frame_cache_misses_total", "observation frames "
                                  "rendered and PNG-encoded", value=info.misses)
        yield CounterMetricFamily("rlfleet_env_frame_cache_evictions_total", "frames evicted from "
                                  "the frame cache", value=info.evictions)
        yield GaugeMetricFamily("rlfleet_env_frame_cache_entries", "frames in the frame cache",
                                value=info.entries)
        yield GaugeMetricFamily("rlfleet_env_frame_cache_bytes", "what the cached frames "
                                "cost, PNG bytes plus per-entry overhead", value=info.bytes)
        yield GaugeMetricFamily("rlfleet_env_frame_cache_max_bytes", "the frame cache's bound",
                                value=info.max_bytes)


REGISTRY.register(FrameCacheCollector())


def _release(episode: TaskEpisode) -> None:
    """Lets an episode free what it holds (a SkyRL env's `close`), if it holds anything."""
    close = getattr(episode, "close", None)
    if close is not None:
        close()


@dataclass
class Entry:
    episode: TaskEpisode
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    request_id: str = ""  # the Open call's, when it named itself (closed by it)


class EpisodeTable:
    def __init__(self, max_episodes: int = 100_000, ttl_s: float = 600.0) -> None:
        self.max_episodes = max_episodes
        self.ttl_s = ttl_s
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_forever, name="reaper", daemon=True)
        self._reaper.start()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, episodes: list[TaskEpisode], request_id: str = "") -> list[str]:
        """Adds all or none; `request_id` names them for `opened_by`."""
        now = time.monotonic()
        with self._lock:
            self._expire_locked(now)
            if len(self._entries) + len(episodes) > self.max_episodes:
                raise ResourceExhausted(
                    f"env service holds {len(self._entries)} episodes, limit "
                    f"{self.max_episodes}; close finished episodes or retry later"
                )
            ids = [secrets.token_hex(12) for _ in episodes]
            for episode_id, episode in zip(ids, episodes, strict=True):
                self._entries[episode_id] = Entry(episode, now, request_id=request_id)
            OPEN_EPISODES.set(len(self._entries))
        return ids

    def get_all(self, ids: list[str]) -> list[Entry]:
        """The entries for `ids`, all or NotFound naming the first missing one."""
        now = time.monotonic()
        with self._lock:
            entries = []
            for episode_id in ids:
                entry = self._entries.get(episode_id)
                if entry is None or now - entry.last_used > self.ttl_s:
                    raise NotFound(f"unknown or expired episode id {episode_id[:64]!r}")
                entries.append(entry)
            for entry in entries:
                entry.last_used = now
        return entries

    def opened_by(self, request_ids: list[str]) -> list[str]:
        """The ids of the open episodes that Open calls named `request_ids` opened (a scan:
        only a caller whose Open answer was lost asks)."""
        wanted = set(request_ids) - {""}
        with self._lock:
            return [k for k, e in self._entries.items() if e.request_id in wanted]

    def pop(self, ids: list[str]) -> tuple[list[tuple[str, TaskEpisode]], list[str]]:
        closed, missing = [], []
        with self._lock:
            for episode_id in ids:
                entry = self._entries.pop(episode_id, None)
                if entry is None:
                    missing.append(episode_id)
                else:
                    closed.append((episode_id, entry.episode))
            OPEN_EPISODES.set(len(self._entries))
        for _, episode in closed:
            _release(episode)
        return closed, missing

    def expire(self) -> int:
        with self._lock:
            return self._expire_locked(time.monotonic())

    def _expire_locked(self, now: float) -> int:
        stale = [k for k, e in self._entries.items() if now - e.last_used > self.ttl_s]
        for key in stale:
            _release(self._entries.pop(key).episode)
        if stale:
            EXPIRED_EPISODES.inc(len(stale))
            OPEN_EPISODES.set(len(self._entries))
        return len(stale)

    def _reap_forever(self) -> None:
        while not self._stop.wait(min(30.0, max(self.ttl_s / 4, 0.05))):
            self.expire()

    def close(self) -> None:
        self._stop.set()
