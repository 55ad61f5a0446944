"""Path efficiency: a maze solve is worth more the fewer turns it took.

    reward = solved × shortest / turns

where `shortest` is the fewest turns that solve the maze (the BFS shortest path's moves,
plus the stop) and `turns` the turns the policy took. An optimal solve scores 1.0, a solve
that wandered twice as long 0.5, anything that is not a true solve (the stop issued on the
target) 0. Components: ``task`` (1.0 for a solve), ``efficiency`` (shortest / turns).

Written against rlfleet's public reward API only (`rlfleet.reward`): the episode it gets
is replayed by rlfleet from the task spec (nothing the client claims is trusted), and
`episode.maze` is the replayed maze (layout, counters).
"""

from __future__ import annotations

from rlfleet.maze.oracle import distance_to_target
from rlfleet.reward import Episode, RewardFunction, Score

__version__ = "1.0.0"


class PathEfficiency(RewardFunction):
    name = "path-efficiency"
    version = __version__
    components = ("task", "efficiency")
    tasks = ("maze_2d", "maze_2d_hard")

    def score(self, episode: Episode) -> Score:
        maze = episode.maze
        shortest = distance_to_target(maze.layout) + 1  # the moves, then the stop
        efficiency = min(shortest / episode.turns, 1.0) if episode.turns else 0.0
        solved = episode.solved
        return Score(float(solved) * efficiency,
                     {"task": float(solved), "efficiency": efficiency}, solved=solved)


reward = PathEfficiency()

__all__ = ["PathEfficiency", "reward"]
