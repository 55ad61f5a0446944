"""What the policy sees each turn: the context modes shared by the rollout service (which
builds the prompts) and SFT (which must train on exactly the same prompts).

- ``full``: the whole conversation: the first observation (instruction + status + frame),
  then each model turn and each later observation (status + frame) as deltas. One token
  sequence per episode; VisGym/SkyRL's setting and the 8B default.
- ``last_frame``: every turn is a fresh prompt with the instruction, the current status
  and the current frame only; one sequence per turn.
- ``frame_only``: the current frame and the last step's feedback sentence only (e.g.
  "Moved right." or "Cannot move into a wall."). For a small policy trained on one task
  the constant instruction is pure cost (about 190 of the ~290 tokens of a 7x7
  ``last_frame`` prompt), and so is the turn counter: a policy that sees only the frame
  and the last move plays a Markov policy, which needs neither. Without the counter a
  prompt is a pure function of (maze state, last feedback), so the many turns of a group
  that reach the same state with the same feedback are the same sequence: the engines and
  the learner compute such duplicates once.

- ``visgym``: VisGym's own harness, the observation profile of VisGym's SFT checkpoints:
  the whole conversation as ``full``, but every word and frame is VisGym's (the env plays
  the task in the ``visgym`` action format: its instruction and step line, "Environment
  feedback: ...", JPEG frames with the disc it leaves on the target; see
  `rlfleet.maze.visgym`). No system message; each user message is the frame, then the
  text; nothing follows the last reply.

A checkpoint is trained on one of these: the shipped tiny SFT on ``frame_only``, VisGym's
SFT checkpoints on ``visgym`` (`rlfleet.policy.observation` reads what a checkpoint
declares and refuses the others).

The names are the proto enum ``rlfleet.v1.Context`` (``CONTEXT_LAST_FRAME`` is
``last_frame``), derived in `rlfleet.names`.
"""

from __future__ import annotations

import base64

from rlfleet.names import CONTEXTS  # the names are defined once, as the proto enum Context

# the contexts that keep the whole conversation: one token sequence per episode
FULL_HISTORY_CONTEXTS = ("full", "visgym")
# the contexts whose every turn is a fresh prompt (what SFT trains on: one turn an example)
PER_TURN_CONTEXTS = tuple(c for c in CONTEXTS if c not in FULL_HISTORY_CONTEXTS)
# the action format a context's task must be played in (the env writes its observations)
CONTEXT_ACTION_FORMATS = {"visgym": "visgym"}
# ... and the cell size its frames are drawn at (VisGym's harness draws 25 px cells,
# rlfleet.maze.visgym.VISGYM_CELL_PX, which a test holds equal: importing the maze package
# here would make every CLI start load numpy and Pillow), which wins over a replica's
# default for its model (the tiny policy's 16 px)
CONTEXT_CELL_PX = {"visgym": 25}


def is_full_history(context: str) -> bool:
    """Whether ``context`` keeps the whole conversation (one sequence per episode)."""
    return context in FULL_HISTORY_CONTEXTS


def turn_text(context: str, instruction: str, status: str, feedback: str) -> str:
    """The text that goes with the frame in a fresh per-turn prompt (or the first one).

    ``status`` is the env's status line (feedback and turns left), ``feedback`` the last
    step's feedback alone (the first observation's is the env's start message)."""
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    if context == "frame_only":
        return feedback
    if not instruction:
        return status
    return f"{instruction}\n\n{status}"


def observation_message(png: bytes, text: str, media_type: str = "") -> dict:
    """An OpenAI-style user message: the frame as a data URL (``media_type``, "" for PNG;
    the visgym profile's frames are "image/jpeg", as VisGym sends them), then the text;
    the text alone when the observation has no frame (a text task, e.g. a skyrl-gym text
    env)."""
    if not png:
        return {"role": "user", "content": [{"type": "text", "text": text}]}
    url = f"data:{media_type or 'image/png'};base64," + base64.b64encode(png).decode("ascii")
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}
