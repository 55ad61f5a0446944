"""One maze episode as a state machine: observe, step with model text, until done.

Semantics follow VisGym's maze_2d (`rlfleet.maze.actions` reads the text as VisGym does):
- A move into a wall does nothing ("Cannot move into a wall."); an invalid action does
  nothing (VisGym's own sentence for why, e.g. "The action 7 is not in the valid action
  space of move so nothing is executed."). Both still use up a turn.
- `stop` always ends the episode. Reward is 1.0 only when the agent stops on the target;
  stopping anywhere else ends the episode with reward 0 (VisGym terminates on any stop).
  Reaching the target without stopping earns nothing yet. There is no step penalty.
- Running out of turns ends the episode as truncated, with reward 0.
- Each action format reads its own syntax only: a tag in a literal episode, or a tuple
  in a tag episode, is an invalid action. Format credit, if any, is the reward service's
  business.
Stepping a finished episode raises `EpisodeDone` (the env service answers
FAILED_PRECONDITION), so a lost or replayed request cannot move a finished episode.

Feedback sentences. The default ("literal", "tags") keeps rlfleet's sentences for moves,
bumps, stops and the start ("Moved right.", "Cannot move into a wall.", "The episode has
started. Make your first move."): the tiny policy reads them (context ``frame_only``) and
the shipped checkpoint was trained on them. Invalid actions get VisGym's sentences in
both literal formats.

The "visgym" format is VisGym's own harness (`rlfleet.maze.visgym`), what its SFT
checkpoints saw: its instruction and step line, "Environment feedback: " with its sentence
for every event ("Action executed successfully." after a move or a stop, no turn-limit
suffix: its harness stops silently), the reply cut to its ``<answer>`` before it is read,
and its frames (`rlfleet.maze.visgym_frame`: JPEG at 25 px per cell, the white disc left
on the target). VisGym says nothing at reset; `feedback` holds rlfleet's start sentence
there, which no visgym text shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlfleet.maze import visgym
from rlfleet.maze.actions import (
    Action,
    ActionFormat,
    Feedback,
    ParsedAction,
    parse_action,
    resolve_format,
)
from rlfleet.maze.layout import Layout, Position
from rlfleet.maze.prompt import instruction_text, status_text
from rlfleet.maze.render import DEFAULT_CELL_PX, Frame, check_cell_px, render_frame
from rlfleet.maze.visgym_frame import visgym_frame

WALL_FEEDBACK = "Cannot move into a wall."
START_FEEDBACK = "The episode has started. Make your first move."
SOLVED_FEEDBACK = "You stopped on the target. Solved!"
STOPPED_FEEDBACK = "You stopped before reaching the target. The episode is over."
TURN_LIMIT_SUFFIX = " Turn limit reached; the episode is over."
# VisGym's `env_feedback` after an action it carried out (a move or a stop).
VISGYM_OK_FEEDBACK = "Action executed successfully."


class EpisodeDone(RuntimeError):
    """`step` was called on an episode that has already ended."""


def default_max_turns(height: int, width: int | None = None) -> int:
    """VisGym's evaluation limits: 20 turns up to 9×9 (easy), 30 from 11×11 (hard) on."""
    return 20 if max(height, width if width is not None else height) <= 9 else 30


@dataclass
class EpisodeStats:
    """Counters for metrics and the reward service."""

    turns: int = 0
    format_ok_turns: int = 0
    invalid_turns: int = 0
    wall_bumps: int = 0
    moves: int = 0
    stopped: bool = False
    solved: bool = False
    truncated: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)


@dataclass(frozen=True)
class StepOutcome:
    """What one `step` did. `parsed` says whether the text held a readable action."""

    reward: float
    done: bool
    truncated: bool
    feedback: str
    parsed: bool
    action: Action | None
    format_ok: bool
    matched_format: str
    moved: bool
    wall_bump: bool
    solved: bool
    agent: Position


@dataclass(frozen=True)
class Observation:
    """What the model sees before a turn: a picture and the text that goes with it."""

    png: bytes
    instruction: str
    status: str
    agent: Position
    turn: int
    done: bool

    @property
    def text(self) -> str:
        return f"{self.instruction}\n\n{self.status}"


class MazeEpisode:
    """A single play-through of `layout`; not thread-safe (one owner steps it)."""

    def __init__(
        self,
        layout: Layout,
        max_turns: int | None = None,
        action_format: ActionFormat | str = ActionFormat.LITERAL,
        cell_px: int = DEFAULT_CELL_PX,
    ) -> None:
        if max_turns is None:
            max_turns = default_max_turns(layout.height, layout.width)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
        # "literal" / "tags", or "visgym": the literal syntax in VisGym's own harness.
        self.action_format, self.feedback_style = resolve_format(action_format)
        self.format_name = str(action_format)
        self.visgym = self.feedback_style is Feedback.VISGYM
        self.layout = layout
        self.max_turns = max_turns
        self.cell_px = check_cell_px(cell_px)
        if self.visgym and self.cell_px != visgym.VISGYM_CELL_PX:
            # the checkpoint was trained on VisGym's pictures; another size is another input
            raise ValueError(f"the visgym format draws VisGym's {visgym.VISGYM_CELL_PX} px "
                             f"cells, got cell_px={self.cell_px}")
        self.agent: Position = layout.agent
        # VisGym leaves a white disc on the target once the agent has stepped off it
        self.left_target = False
        self.stats = EpisodeStats()
        self.done = False
        self.reward = 0.0
        self.feedback = START_FEEDBACK
        self.instruction = (visgym.instruction_text(layout.height, layout.width)
                            if self.visgym else
                            instruction_text(layout.height, layout.width, self.action_format))

    @property
    def solved(self) -> bool:
        return self.stats.solved

    def observe(self, cell_px: int | None = None) -> Observation:
        """The current picture and text; `cell_px` overrides the episode's picture size."""
        return Observation(
            png=self.frame(cell_px).png,
            instruction=self.instruction,
            status=self.status(),
            agent=self.agent,
            turn=self.stats.turns,
            done=self.done,
        )

    def frame(self, cell_px: int | None = None) -> Frame:
        """The current picture as PNG bytes with their sha256, encoded once per state
        (see `rlfleet.maze.render.FRAME_CACHE`); the bytes `observe` returns. The visgym
        format's are VisGym's JPEG (`rlfleet.maze.visgym_frame`), at its cell size."""
        if self.visgym:
            return visgym_frame(self.layout, self.agent, self.left_target, self.cell_px)
        return render_frame(self.layout, self.agent, self.cell_px if cell_px is None else cell_px)

    def status(self) -> str:
        """The status line of `observe` (last feedback and turns left), without a picture;
        the visgym format's is VisGym's feedback line and step line."""
        if self.visgym:
            return visgym.later_text(self.feedback, self.stats.turns, self.max_turns)
        return status_text(self.feedback, self.stats.turns, self.max_turns)

    def observation_text(self, first: bool) -> str:
        """The text of an observation message: the first carries the instruction (rlfleet:
        a blank line, then the status; VisGym: a newline, then the step line), later ones
        the status alone."""
        if not first:
            return self.status()
        if self.visgym:
            return visgym.first_text(self.instruction, self.max_turns)
        return f"{self.instruction}\n\n{self.status()}"

    def step(self, text: str) -> StepOutcome:
        """Apply one model reply; raises EpisodeDone once the episode has ended."""
        if self.done:
            raise EpisodeDone("the episode is over; start a new one")
        stats = self.stats
        stats.turns += 1
        # VisGym's harness reads the action inside the reply's <answer> tag
        read = visgym.answer_of(text) if self.visgym and isinstance(text, str) else text
        parsed: ParsedAction = parse_action(read, self.action_format)
        format_ok = parsed.format == self.action_format
        if format_ok:
            stats.format_ok_turns += 1
        reward, moved, bump = 0.0, False, False
        action = parsed.action
        if action is None:
            stats.invalid_turns += 1
            feedback = parsed.error
        elif action.is_stop:
            stats.stopped = True
            self.done = True
            if self.agent == self.layout.target:
                stats.solved = True
                reward = 1.0
                feedback = VISGYM_OK_FEEDBACK if self.visgym else SOLVED_FEEDBACK
            else:
                feedback = VISGYM_OK_FEEDBACK if self.visgym else STOPPED_FEEDBACK
        else:
            dr, dc = action.delta
            nxt = (self.agent[0] + dr, self.agent[1] + dc)
            if self.layout.is_floor(nxt):
                if self.agent == self.layout.target:
                    self.left_target = True
                self.agent = nxt
                moved = True
                stats.moves += 1
                feedback = VISGYM_OK_FEEDBACK if self.visgym else f"Moved {action.name}."
            else:
                bump = True
                stats.wall_bumps += 1
                feedback = WALL_FEEDBACK
        if not self.done and stats.turns >= self.max_turns:
            self.done = True
            stats.truncated = True
            if not self.visgym:
                feedback += TURN_LIMIT_SUFFIX
        self.feedback = feedback
        self.reward = reward
        return StepOutcome(
            reward=reward,
            done=self.done,
            truncated=stats.truncated,
            feedback=feedback,
            parsed=parsed.ok,
            action=action,
            format_ok=format_ok,
            matched_format=parsed.matched,
            moved=moved,
            wall_bump=bump,
            solved=stats.solved,
            agent=self.agent,
        )
