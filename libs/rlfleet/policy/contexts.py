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

The names are the proto enum ``rlfleet.v1.Context`` (``CONTEXT_LAST_FRAME`` is
``last_frame``), derived in `rlfleet.names`.
"""

from __future__ import annotations

import base64

from rlfleet.names import CONTEXTS  # the names are defined once, as the proto enum Context

# the contexts whose every turn is a fresh prompt (what SFT trains on: one turn an example)
PER_TURN_CONTEXTS = tuple(c for c in CONTEXTS if c != "full")


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


def observation_message(png: bytes, text: str) -> dict:
    """An OpenAI-style user message: the frame as a PNG data URL, then the text; the text
    alone when the observation has no frame (a text task, e.g. a skyrl-gym text env)."""
    if not png:
        return {"role": "user", "content": [{"type": "text", "text": text}]}
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}
