"""The replica's engine, watched. An engine that died (vLLM's engine core process killed or
crashed, the batcher's engine thread gone) serves nothing again, while the process around
it would go on answering health checks, heartbeating and taking groups. `EngineWatch`
asks the engine every `period_s` (and whenever a call finds it dead) and, the first time
it is dead, runs `on_dead` once: the replica then takes itself out of the fleet and exits
non-zero, so that its Deployment starts a fresh one (`rlfleet_rollout.server`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rlfleet.engines.base import EngineDead

log = logging.getLogger(__name__)


class EngineWatch:
    """Reports an engine's death once. `check` raises EngineDead when the engine cannot
    serve (`Engine.check_health`); `on_dead(reason)` runs on a thread of its own, so
    whoever found the engine dead (a group's call) is not held up by the way out."""

    def __init__(self, check: Callable[[], None], period_s: float = 1.0,
                 on_dead: Callable[[str], None] | None = None) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self._check = check
        self.period_s = period_s
        self.on_dead = on_dead
        self._dead: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-health", daemon=True)

    @property
    def dead(self) -> str | None:
        """Why the engine is dead; None while it is not known to be."""
        return self._dead

    def check(self) -> str | None:
        """Asks the engine now; returns why it is dead (None: alive)."""
        if self._dead is None:
            try:
                self._check()
            except EngineDead as exc:
                self.died(str(exc))
        return self._dead

    def died(self, reason: str) -> None:
        """Records the engine's death (a caller that saw EngineDead); the first call runs
        `on_dead`, later ones do nothing."""
        with self._lock:
            if self._dead is not None:
                return
            self._dead = reason or "the engine is dead"
        self._stop.set()
        log.error("the engine is dead: leaving the fleet and exiting, to be restarted",
                  extra={"reason": self._dead})
        if self.on_dead is not None:
            threading.Thread(target=self.on_dead, args=(self._dead,), name="engine-dead",
                             daemon=True).start()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - a failing check is no verdict; next
                log.warning("engine health check failed", extra={"error": repr(exc)})
