"""Which training seeds the run has trained, so a resumed run trains each exactly once.

Training seeds are ``TRAIN_SEED_BASE + position`` (``rlfleet.maze.tasks.train_seeds``,
which skips positions whose maze is an eval or held-out maze). A seed counts as trained
once a completed optimiser step took its group, whether or not its trajectories carried
a gradient (zero-variance and stale groups are consumed too). Requested-but-untrained
seeds never count: a stopped step gives its seeds back.

In sync mode a step's seeds are consecutive, so ``position`` alone says everything. In
async mode groups finish out of order: ``ahead`` holds the trained positions past the
first untrained one, and the producer skips them after a resume.

A curriculum band (``moves``: data.min_moves..data.max_moves) keeps only the training
mazes whose shortest solution has that many moves; the others are passed over, never
trained, and the position moves past them like past trained ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rlfleet.maze.difficulty import shortest_moves
from rlfleet.maze.tasks import TRAIN_SEED_BASE, train_seeds


@dataclass
class SeedCursor:
    size: int  # maze size, so reserved (eval/held-out) mazes are skipped
    position: int = 0  # every seed before TRAIN_SEED_BASE + position is trained
    ahead: set[int] = field(default_factory=set)  # trained positions >= position
    moves: tuple[int, int | None] = (0, None)  # the curriculum band; (0, None): every maze

    def _in_band(self, pos: int) -> Iterator[tuple[int, int]]:
        """(seed, the position after it) of every in-band training seed from ``pos``."""
        low, high = self.moves
        while True:
            batch = train_seeds(pos, 1, self.size)
            pos = batch.next_cursor
            seed = batch.seeds[0]
            if self.moves != (0, None):
                moves = shortest_moves(seed, self.size)
                if moves < low or (high is not None and moves > high):
                    continue
            yield seed, pos

    def next_seeds(self, count: int) -> list[int]:
        """The next ``count`` untrained seeds, without taking them."""
        out: list[int] = []
        for seed, _ in self._in_band(self.position):
            if len(out) == count:
                break
            if seed - TRAIN_SEED_BASE not in self.ahead:
                out.append(seed)
        return out

    def untrained(self) -> Iterator[int]:
        """Every untrained seed in order, endlessly (the async producer's source); a
        snapshot of the cursor at the call, so seeds trained meanwhile may come again
        only if they were not yet handed out, which the producer never does."""
        ahead = set(self.ahead)
        for seed, _ in self._in_band(self.position):
            if seed - TRAIN_SEED_BASE not in ahead:
                yield seed

    def mark_trained(self, seeds: Iterable[int]) -> None:
        """Record a completed step's seeds; the position moves past every leading one."""
        for seed in seeds:
            pos = seed - TRAIN_SEED_BASE
            if pos < self.position or pos in self.ahead:
                raise ValueError(f"training seed {seed} was already trained")
            self.ahead.add(pos)
        for seed, after in self._in_band(self.position):
            first = seed - TRAIN_SEED_BASE
            if first not in self.ahead:
                return
            self.ahead.remove(first)
            self.position = after

    def to_dict(self) -> dict:
        return {"cursor": self.position, "trained_ahead": sorted(self.ahead)}

    @classmethod
    def from_dict(cls, size: int, data: dict,
                  moves: tuple[int, int | None] = (0, None)) -> SeedCursor:
        return cls(size, int(data["cursor"]), {int(p) for p in data.get("trained_ahead", [])},
                   moves)
