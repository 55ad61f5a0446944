"""The maze task, compatible with VisGym's maze_2d: generation, rendering, actions,
episodes, a BFS oracle and the task/seed presets.

Modules, one job each: `layout` (validated maze instances), `generate` (seeded Wilson
mazes), `render` / `png` (pictures), `actions` (text ↔ action), `prompt` (instruction
text), `episode` (the state machine), `oracle` (shortest paths), `tasks` (presets, seeds).
"""

from rlfleet.maze.actions import (
    Action,
    ActionFormat,
    ParsedAction,
    format_action,
    parse_action,
)
from rlfleet.maze.episode import (
    EpisodeDone,
    EpisodeStats,
    MazeEpisode,
    Observation,
    StepOutcome,
    default_max_turns,
)
from rlfleet.maze.generate import corner_pairs, generate_layout
from rlfleet.maze.layout import MAX_SIZE, MIN_SIZE, Layout, LayoutError
from rlfleet.maze.oracle import (
    distance_to_target,
    oracle_action,
    oracle_actions,
    oracle_policy,
    oracle_texts,
    shortest_path,
)
from rlfleet.maze.render import render_image, render_png, render_rgb
from rlfleet.maze.tasks import (
    EVAL_SEEDS,
    HELDOUT_SEEDS,
    TASKS,
    TRAIN_SEED_BASE,
    SeedBatch,
    TaskSpec,
    get_task,
    new_episode,
    seed_split,
    train_seeds,
)

__all__ = [
    "Action",
    "ActionFormat",
    "ParsedAction",
    "format_action",
    "parse_action",
    "EpisodeDone",
    "EpisodeStats",
    "MazeEpisode",
    "Observation",
    "StepOutcome",
    "default_max_turns",
    "corner_pairs",
    "generate_layout",
    "MAX_SIZE",
    "MIN_SIZE",
    "Layout",
    "LayoutError",
    "distance_to_target",
    "oracle_action",
    "oracle_actions",
    "oracle_policy",
    "oracle_texts",
    "shortest_path",
    "render_image",
    "render_png",
    "render_rgb",
    "EVAL_SEEDS",
    "HELDOUT_SEEDS",
    "TASKS",
    "TRAIN_SEED_BASE",
    "SeedBatch",
    "TaskSpec",
    "get_task",
    "new_episode",
    "seed_split",
    "train_seeds",
]
