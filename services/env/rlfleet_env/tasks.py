"""The env service's tasks: `rlfleet.tasks` (maze built-ins, ``rlfleet.tasks`` entry
points, SkyRL environments). `episode_from_spec` (a maze spec to a `MazeEpisode`) moved to
`rlfleet.tasks.maze` so that reward services outside this package replay the same way;
it is re-exported here."""

from rlfleet.tasks import TaskRegistry, default_tasks
from rlfleet.tasks.maze import episode_from_spec

__all__ = ["TaskRegistry", "default_tasks", "episode_from_spec"]
