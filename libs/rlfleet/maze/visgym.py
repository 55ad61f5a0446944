"""The words VisGym's own maze_2d harness shows a model, reimplemented from its source.

VisGym's SFT checkpoints were trained on, and are evaluated with, its harness
(``gymnasium/vlm/interactor.py`` driving ``gymnasium/envs/maze_2d/maze_2d.py``, as
``inference/eval_trained_model.sh`` runs it: ``--elicit-verbalization
--include-env-feedback``). A checkpoint is only shown what it was trained on when every
byte matches, so the ``visgym`` profile builds its texts here, from the facts recorded
with their source in ``tests/data/visgym/maze_2d/`` (the golden-message tests hold this
module to them):

- no system message; the first user message is the instruction (``get_prompt`` plus the
  ``<think>/<answer>`` request), a newline, and the step line; later user messages are
  ``Environment feedback: <sentence>``, a blank line, and the step line;
- the step line counts the turns left *after* the one being asked for;
- the reply is cut to its first ``<answer>...</answer>`` before the action is read.

The frames (25 px cells, JPEG, the white disc left on the target) are
`rlfleet.maze.visgym_frame`'s.
"""

from __future__ import annotations

VISGYM_CELL_PX = 25  # `RandomMaze2DEnv._window_pixel_size`
FEEDBACK_PREFIX = "Environment feedback: "
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# `Interactor._xml_prompt`, appended to the instruction with --elicit-verbalization.
VERBALIZE_SUFFIX = (
    "\n\nVerbalize your reasoning in <think>\u2026</think> and give the final result in "
    "<answer>\u2026</answer>."
)

_BODY = (
    "The maze consists of walls (gray) and paths (white). You are represented by a blue "
    "circle, and your goal is to reach the red target square."
    "\n\nAvailable actions:\n"
    "1. 'move': Move in one of four directions. Format: `('move', direction)` where "
    "direction is an integer:\n   - 0=right, 1=up, 2=left, 3=down\n"
    "2. 'stop': End the navigation session. Format: `('stop', 'stop')`"
    "\n\nSuccess: You succeed if you reach the red target square."
    "\n\nPlease respond with exactly one action and its arguments in the specified format. "
    "For example:\n"
    "- To move right: `('move', 0)`\n- To move up: `('move', 1)`\n"
    "- To move left: `('move', 2)`\n- To move down: `('move', 3)`\n"
    "- To stop: `('stop', 'stop')`"
)


def instruction_text(height: int, width: int) -> str:
    """``get_prompt()`` of a ``height`` x ``width`` maze drawn as a picture, with the
    reasoning request VisGym's trained-model eval adds."""
    return f"You are navigating a {height}x{width} maze. " + _BODY + VERBALIZE_SUFFIX


def step_text(turns: int, max_turns: int) -> str:
    """The step line before turn ``turns + 1``: VisGym counts the steps left after it."""
    return (f"This is step {turns + 1}. You are allowed to take {max_turns - turns - 1} "
            "more steps.")


def first_text(instruction: str, max_turns: int) -> str:
    """The text of the first user message (the frame comes before it)."""
    return instruction + "\n" + step_text(0, max_turns)


def later_text(feedback: str, turns: int, max_turns: int) -> str:
    """The text of a user message after ``turns`` turns: the last step's feedback, then
    the step line."""
    return FEEDBACK_PREFIX + feedback + "\n\n" + step_text(turns, max_turns)


def answer_of(reply: str) -> str:
    """What the harness reads an action from: the text inside the reply's *first*
    ``<answer>`` (up to the next ``</answer>``, or the end), or the whole reply when it
    has none."""
    if ANSWER_OPEN not in reply:
        return reply
    return reply.split(ANSWER_OPEN, 1)[1].split(ANSWER_CLOSE, 1)[0]
