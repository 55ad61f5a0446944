"""What a maze policy has learned, one state at a time: where its greedy moves follow the
BFS oracle, and whether the last feedback sentence changes them.

A solve rate says how often a policy gets through; these probes say why it does not. Two
are measured on the same mazes, with every state shown as a ``frame_only`` prompt:

- **agreement with the oracle**, split by whether the oracle's move heads *away* from the
  target (Manhattan distance grows). A policy that has learned "go towards the target,
  not into walls" agrees nearly everywhere else and almost never there; the mazes whose
  path must head away (12 moves and more on 7x7) are exactly the ones it cannot solve.
- **feedback sensitivity**: each floor cell with two or more ways in, shown once per way
  in ("Moved right.", "Moved down.", ...): in how many of them does the greedy move
  change with the sentence, and how often is it the move that undoes the last one. The
  sentence is the only memory the context gives; a policy that ignores it falls into
  two-cell loops (``rlfleet.maze.heuristics``: greedy 49% vs no_reverse 88% on 7x7).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from rlfleet.maze import ActionFormat, generate_layout
from rlfleet.maze.actions import Action, format_action
from rlfleet.maze.layout import DIRECTION_DELTAS, Layout, Position
from rlfleet.maze.oracle import oracle_action
from rlfleet.maze.render import render_png
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.contexts import observation_message
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.sft.data import DEFAULT_CELL_PX, DIRECTION_NAMES
from rlfleet.sft.evaluate import greedy_actions

PROBE_CONTEXT = "frame_only"  # the probes' prompts: the frame and the feedback sentence


def _floor_cells(layout: Layout) -> list[Position]:
    return [(r, c) for r in range(layout.height) for c in range(layout.width)
            if layout.is_floor((r, c)) and (r, c) != layout.target]


def _ways_in(layout: Layout, cell: Position) -> list[int]:
    """The moves that could have entered `cell` (the neighbour behind it is floor)."""
    return [k for k, (dr, dc) in enumerate(DIRECTION_DELTAS)
            if layout.is_floor((cell[0] - dr, cell[1] - dc))]


def _heads_away(layout: Layout, cell: Position, action: Action) -> bool:
    dr, dc = DIRECTION_DELTAS[action.direction]
    tr, tc = layout.target
    return abs(cell[0] + dr - tr) + abs(cell[1] + dc - tc) > abs(cell[0] - tr) + abs(
        cell[1] - tc)


def _prompt(layout: Layout, cell: Position, feedback: str, cell_px: int) -> dict:
    # frame_only shows the feedback sentence alone (rlfleet.policy.contexts.turn_text)
    return observation_message(render_png(layout, cell, cell_px), feedback)


def _move_of(text: str) -> int | None:
    """The direction of a greedy reply in the literal format, None for anything else."""
    for k in range(4):
        if text == format_action(Action.move(k), ActionFormat.LITERAL):
            return k
    return None


@torch.inference_mode()
def probe_policy(model: torch.nn.Module, processor: PolicyProcessor, seeds: Iterable[int],
                 size: int = 7, *, cell_px: int = DEFAULT_CELL_PX,
                 seed: int = 0) -> dict:
    """Both probes over the mazes of `seeds`. Each state of the agreement probe is shown
    after a move that could have entered it, drawn with `seed`. Returns counts and rates:
    ``{"states", "agree", "toward_states", "toward_agree", "away_states", "away_agree",
    "feedback_cells", "feedback_changes", "feedback_moves", "reversals", ...rates}``."""
    seeds = list(seeds)
    rng = np.random.default_rng(seed)
    codec = ChatCodec(processor)
    agree_msgs, agree_meta, fb_msgs, fb_meta = [], [], [], []
    for s in seeds:
        layout = generate_layout(s, size)
        for cell in _floor_cells(layout):
            ways = _ways_in(layout, cell)
            oracle = oracle_action(layout, cell)
            if ways:
                last = int(rng.choice(ways))
                agree_msgs.append(_prompt(layout, cell, f"Moved {DIRECTION_NAMES[last]}.",
                                          cell_px))
                agree_meta.append((format_action(oracle, ActionFormat.LITERAL),
                                   _heads_away(layout, cell, oracle)))
            if len(ways) >= 2:
                for k in ways:
                    fb_msgs.append(_prompt(layout, cell, f"Moved {DIRECTION_NAMES[k]}.",
                                           cell_px))
                    fb_meta.append(((s, cell), k))
    model_was_training = model.training
    model.eval()
    try:
        agree_texts = greedy_actions(model, processor, codec, agree_msgs)
        fb_texts = greedy_actions(model, processor, codec, fb_msgs)
    finally:
        model.train(model_was_training)
    out: dict = {"mazes": len(seeds), "size": size}
    for name, keep in (("", lambda away: True), ("toward_", lambda away: not away),
                       ("away_", lambda away: away)):
        hits = [t == want for t, (want, away) in zip(agree_texts, agree_meta, strict=True)
                if keep(away)]
        out[f"{name}states"] = len(hits)
        out[f"{name}agree"] = sum(hits)
        out[f"{name}agree_rate"] = sum(hits) / len(hits) if hits else 0.0
    replies: dict[tuple, set[str]] = {}
    moves = reversals = 0
    for text, (key, last) in zip(fb_texts, fb_meta, strict=True):
        replies.setdefault(key, set()).add(text)
        move = _move_of(text)
        if move is not None:
            moves += 1
            reversals += move == (last + 2) % 4
    changes = sum(len(r) > 1 for r in replies.values())
    out.update(feedback_cells=len(replies), feedback_changes=changes,
               feedback_change_rate=changes / len(replies) if replies else 0.0,
               feedback_moves=moves, reversals=reversals,
               reversal_rate=reversals / moves if moves else 0.0)
    return out
