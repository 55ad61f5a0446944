"""SFT examples: maze states as the policy sees them, labelled with the BFS oracle's action.

One example is one turn of a per-turn context of the rollout service
(``rlfleet.policy.contexts``: ``last_frame`` or ``frame_only``): a single user message,
worded by the same ``turn_text`` the service uses, and, as the target, the oracle's
action text followed by ``<|im_end|>``.

Two sources, mixed per maze, so that the statuses look like real play:

- **played** states: episodes where the agent follows the oracle with probability ``p``
  (drawn per episode) and takes a random move otherwise. They carry the feedback and turn
  counts real play produces (moves, wall bumps, late turns) and naturally leave the
  shortest path, which is what path-only SFT lacks (greedy play then loops).
- **floor-cell** states: every floor cell of the maze once, with a status that could have
  led there (a turn count at least the cell's distance from the start, and the feedback of
  a move into the cell or of a wall bump), so off-path cells are always covered.

The label is always ``oracle_action(layout, cell)`` ("stop" on the target).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image

from rlfleet.maze import (
    Action,
    ActionFormat,
    Layout,
    MazeEpisode,
    format_action,
    generate_layout,
    oracle_action,
    render_png,
    shortest_path,
    train_seeds,
)
from rlfleet.maze.episode import START_FEEDBACK, WALL_FEEDBACK, default_max_turns
from rlfleet.maze.layout import DIRECTION_DELTAS, Position
from rlfleet.maze.prompt import instruction_text, status_text
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.contexts import observation_message, turn_text

DEFAULT_CELL_PX = 16  # one image token per maze cell on the tiny model
DIRECTION_NAMES = ("right", "up", "left", "down")


@dataclass(frozen=True)
class SFTExample:
    """One maze state and the oracle's answer to it."""

    seed: int
    agent: Position
    turn: int
    feedback: str
    action: Action
    on_path: bool  # the agent stands on the shortest path from the start to the target
    source: str  # "played" or "cell"
    png: bytes
    instruction: str  # the env's task instruction
    status: str  # the env's status line (feedback and turns left)
    blocked: tuple[int, ...] = ()  # move directions that would hit a wall from here
    width: int = 0  # the maze's width in cells (locates the agent's image token)

    @property
    def action_text(self) -> str:
        return format_action(self.action, ActionFormat.LITERAL)

    def prompt_text(self, context: str) -> str:
        """The words beside the frame, exactly as the rollout service puts them."""
        return turn_text(context, self.instruction, self.status, self.feedback)


def _start_distances(layout: Layout) -> dict[Position, int]:
    """Moves from the start to every reachable floor cell (BFS)."""
    dist = {layout.agent: 0}
    queue = deque([layout.agent])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DIRECTION_DELTAS:
            nxt = (r + dr, c + dc)
            if layout.is_floor(nxt) and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def blocked_moves(layout: Layout, cell: Position) -> tuple[int, ...]:
    """The move codes that bump into a wall from ``cell``."""
    return tuple(k for k, (dr, dc) in enumerate(DIRECTION_DELTAS)
                 if not layout.is_floor((cell[0] + dr, cell[1] + dc)))


def _make(
    layout: Layout, seed: int, agent: Position, turn: int, feedback: str, max_turns: int,
    cell_px: int, instruction: str, path: set[Position], source: str,
) -> SFTExample:
    return SFTExample(
        seed=seed,
        agent=agent,
        turn=turn,
        feedback=feedback,
        action=oracle_action(layout, agent),
        on_path=agent in path,
        source=source,
        png=render_png(layout, agent, cell_px),
        instruction=instruction,
        status=status_text(feedback, turn, max_turns),
        blocked=blocked_moves(layout, agent),
        width=layout.width,
    )


def floor_cell_examples(
    layout: Layout,
    seed: int,
    rng: np.random.Generator,
    *,
    max_turns: int | None = None,
    cell_px: int = DEFAULT_CELL_PX,
) -> list[SFTExample]:
    """Every reachable floor cell once, with a plausible status (see module doc)."""
    max_turns = max_turns or default_max_turns(layout.height, layout.width)
    instruction = instruction_text(layout.height, layout.width, ActionFormat.LITERAL)
    path = set(shortest_path(layout))
    out = []
    for cell, d in sorted(_start_distances(layout).items()):
        if d >= max_turns:
            continue  # cannot be reached before the turn limit
        if cell == layout.agent and rng.random() < 0.5:
            turn, feedback = 0, START_FEEDBACK
        else:
            turn = int(rng.integers(max(d, 1), max_turns))
            # the moves that could have entered this cell (its neighbour behind is floor)
            entries = [
                k for k, (dr, dc) in enumerate(DIRECTION_DELTAS)
                if layout.is_floor((cell[0] - dr, cell[1] - dc))
            ]
            if entries and rng.random() < 0.75:
                feedback = f"Moved {DIRECTION_NAMES[int(rng.choice(entries))]}."
            else:
                feedback = WALL_FEEDBACK
        out.append(_make(layout, seed, cell, turn, feedback, max_turns, cell_px, instruction,
                         path, "cell"))
    return out


def played_examples(
    layout: Layout,
    seed: int,
    rng: np.random.Generator,
    p_oracle: float,
    *,
    max_turns: int | None = None,
    cell_px: int = DEFAULT_CELL_PX,
) -> list[SFTExample]:
    """The states of one episode that follows the oracle with probability ``p_oracle`` and
    moves at random otherwise (never a random stop), each labelled with the oracle."""
    episode = MazeEpisode(layout, max_turns=max_turns, action_format=ActionFormat.LITERAL,
                          cell_px=cell_px)
    path = set(shortest_path(layout))
    out = []
    while not episode.done:
        obs = episode.observe()
        best = oracle_action(layout, obs.agent)
        out.append(SFTExample(
            seed=seed, agent=obs.agent, turn=obs.turn, feedback=episode.feedback,
            action=best, on_path=obs.agent in path, source="played", png=obs.png,
            instruction=obs.instruction, status=obs.status,
            blocked=blocked_moves(layout, obs.agent), width=layout.width,
        ))
        if rng.random() < p_oracle:
            act = best
        else:
            act = Action.move(int(rng.integers(0, 4)))
        episode.step(format_action(act, ActionFormat.LITERAL))
    return out


@dataclass(frozen=True)
class DataMix:
    """How examples are drawn from each training maze."""

    floor_cells: bool = True  # every floor cell once per maze
    episodes_per_maze: int = 2  # played episodes per maze
    p_oracle_min: float = 0.5  # per-episode probability of following the oracle ...
    p_oracle_max: float = 0.9  # ... drawn uniformly from [min, max]

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_oracle_min <= self.p_oracle_max <= 1.0:
            raise ValueError("need 0 <= p_oracle_min <= p_oracle_max <= 1")
        if self.episodes_per_maze < 0:
            raise ValueError("episodes_per_maze must be >= 0")
        if not self.floor_cells and self.episodes_per_maze == 0:
            raise ValueError("the mix yields no examples (no floor cells, no episodes)")


def maze_examples(
    seed: int,
    size: int,
    rng: np.random.Generator,
    mix: DataMix = DataMix(),
    *,
    max_turns: int | None = None,
    cell_px: int = DEFAULT_CELL_PX,
) -> list[SFTExample]:
    """All examples one training maze contributes under ``mix``."""
    layout = generate_layout(seed, size)
    out: list[SFTExample] = []
    if mix.floor_cells:
        out += floor_cell_examples(layout, seed, rng, max_turns=max_turns, cell_px=cell_px)
    for _ in range(mix.episodes_per_maze):
        p = float(rng.uniform(mix.p_oracle_min, mix.p_oracle_max))
        out += played_examples(layout, seed, rng, p, max_turns=max_turns, cell_px=cell_px)
    return out


def example_stream(
    size: int,
    rng: np.random.Generator,
    mix: DataMix = DataMix(),
    *,
    cursor: int = 0,
    shuffle_buffer: int = 4096,
    max_turns: int | None = None,
    cell_px: int = DEFAULT_CELL_PX,
) -> Iterator[SFTExample]:
    """An endless, shuffled stream of examples from training mazes (never an eval or
    held-out maze: seeds come from ``train_seeds(cursor, ..., size)``)."""
    buffer: list[SFTExample] = []
    while True:
        batch = train_seeds(cursor, 16, size)
        cursor = batch.next_cursor
        for seed in batch.seeds:
            buffer += maze_examples(seed, size, rng, mix, max_turns=max_turns, cell_px=cell_px)
        # emit once the buffer is full, from a random position (swap-remove: O(1))
        while len(buffer) >= shuffle_buffer:
            i = int(rng.integers(0, len(buffer)))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            yield buffer.pop()


@dataclass
class EncodedExample:
    """An example as model input: prompt ids (placeholders expanded), its image, target."""

    prompt_ids: list[int]
    image: Image.Image
    target_ids: list[int]  # the action's token(s) + <|im_end|>
    agent_token: int  # index in prompt_ids of the agent cell's image token (-1: unknown)
    open_ids: list[int]  # first tokens of the moves that do not hit a wall
    last_move: int = -1  # the move the feedback sentence reports (0-3; -1: none)


def _first_token(codec: ChatCodec, text: str) -> int:
    return int(codec.tokenizer(text, add_special_tokens=False).input_ids[0])


def encode_example(codec: ChatCodec, example: SFTExample, context: str) -> EncodedExample:
    """The example as model input, prompted as the rollout service's ``context`` words it."""
    enc = codec.encode_prompt([observation_message(example.png, example.prompt_text(context))])
    target = list(codec.tokenizer(example.action_text, add_special_tokens=False).input_ids)
    opened = [_first_token(codec, format_action(Action.move(k), ActionFormat.LITERAL))
              for k in range(4) if k not in example.blocked]
    # One image token per cell when a cell is as wide as a token's pixels (the tiny model
    # at cell_px 16): the agent's token is then row * width + col into the image's run.
    ip = codec.processor.image_processor
    px_per_token = int(ip.patch_size) * int(ip.merge_size)
    agent_token = -1
    image = enc.images[0]
    if example.width and image.width == example.width * px_per_token:
        agent_token = (enc.token_ids.index(codec.image_pad_id)
                       + example.agent[0] * example.width + example.agent[1])
    moved = [k for k, name in enumerate(DIRECTION_NAMES) if example.feedback == f"Moved {name}."]
    last_move = moved[0] if moved else -1
    return EncodedExample(enc.token_ids, image, target + [codec.im_end_id], agent_token,
                          opened, last_move)
