"""A task and a reward function that plug into rlfleet through entry points.

``countdown``: the episode shows a number N (3..9, from the seed); each reply should be
the next number down. The right number counts down (reward 0), anything else is an
invalid turn; reaching 0 ends the episode, solved, with reward 1.
"""

from __future__ import annotations

import re

from rlfleet.reward import Score, reward_function
from rlfleet.tasks import SimpleEpisode, StepResult, Task, TaskInfo

_NUMBER = re.compile(r"-?\d+")


class CountdownEpisode(SimpleEpisode):
    def __init__(self, start: int, max_turns: int) -> None:
        super().__init__(
            instruction=f"Count down from {start} to 0: reply with the next number each turn.",
            max_turns=max_turns, start_feedback=f"The number is {start}.")
        self.current = start

    def act(self, text: str) -> StepResult:
        numbers = _NUMBER.findall(text)
        if not numbers or int(numbers[-1]) != self.current - 1:
            return StepResult(parsed=False, feedback=f"Not {self.current - 1}; the number is "
                                                     f"still {self.current}.")
        self.current -= 1
        if self.current == 0:
            return StepResult(reward=1.0, action="0", done=True, solved=True,
                              feedback="Reached 0.")
        return StepResult(action=str(self.current), feedback=f"The number is {self.current}.")

    def status(self) -> str:
        return self.feedback


class CountdownTask(Task):
    info = TaskInfo("countdown", "count down to zero (a test plugin)", default_max_turns=12)

    def open(self, spec) -> CountdownEpisode:  # noqa: ANN001
        if spec.HasField("layout") or spec.size or spec.format:
            raise ValueError("countdown takes a seed and max_turns only")
        return CountdownEpisode(3 + spec.seed % 7, spec.max_turns or 12)


@reward_function("turn-count", "0.1.0", components=("task", "turns"),
                 reward_range=(-10.0, 1.0))  # 0.01 per turn, up to 1000 turns
def turn_count(episode) -> Score:  # noqa: ANN001
    """The env's return, less 0.01 per turn (any task)."""
    task = episode.env_return
    return Score(task - 0.01 * episode.turns, {"task": task, "turns": float(episode.turns)},
                 episode.solved)
