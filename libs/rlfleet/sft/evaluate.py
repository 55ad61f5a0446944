"""Greedy play on fixed mazes, in process: the true solve rate of a policy.

Each turn the policy sees what the rollout service's ``last_frame`` context shows it (one
user message: the current frame and ``instruction + "\\n\\n" + status``) and answers with
its most likely next token. On the tiny tokenizer every action is one token, so a turn is a
single-token decision: one forward pass per turn over all live mazes (left-padded, only
the last position's logits). The argmax is unrestricted: a non-action token becomes an
unreadable reply, which the episode answers with "Invalid action" and a used turn, as it
would in the service. (A turn that would continue past a first non-action token in the
service is judged on that first token only; a trained policy never gets there.)

True solve = the episode stopped on the target. The maze reward is 1.0 exactly then, so
pass@1 (reward > 0) equals it here; both are reported because a format reward would
separate them elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch

from rlfleet.maze import ActionFormat, MazeEpisode, generate_layout
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.contexts import observation_message, turn_text
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.logprobs import collate, forward, unwrap
from rlfleet.sft.data import DEFAULT_CELL_PX


def solve_rate_stderr(solved: int, n: int) -> float:
    """Binomial standard error of a rate measured on ``n`` mazes."""
    if n == 0:
        return 0.0
    p = solved / n
    return math.sqrt(p * (1 - p) / n)


@torch.inference_mode()
def greedy_actions(
    model: torch.nn.Module,
    processor: PolicyProcessor,
    codec: ChatCodec,
    messages: list[dict],
    batch_size: int = 64,
) -> list[str]:
    """The greedy first token of the reply to each single-message prompt, as text."""
    inner = unwrap(model)
    device = next(inner.parameters()).device
    pad = int(processor.tokenizer.pad_token_id or 0)
    texts: list[str] = []
    for start in range(0, len(messages), batch_size):
        encs = [codec.encode_prompt([m]) for m in messages[start : start + batch_size]]
        batch = collate(processor, [e.token_ids for e in encs], [e.images for e in encs],
                        padding_side="left", pad_token_id=pad).to(device)
        out = forward(inner, batch, logits_to_keep=1)
        ids = out.logits[:, -1].argmax(-1).tolist()
        texts.extend(codec.tokenizer.decode([i], skip_special_tokens=True) for i in ids)
    return texts


def evaluate_greedy(
    model: torch.nn.Module,
    processor: PolicyProcessor,
    seeds: Iterable[int],
    size: int = 7,
    max_turns: int | None = None,
    *,
    cell_px: int = DEFAULT_CELL_PX,
    batch_size: int = 64,
    context: str = "last_frame",
) -> dict:
    """Play every maze in ``seeds`` greedily to the end; the solve rate and friends.

    Returns ``{"n", "solved", "solve_rate", "solve_rate_stderr", "pass_at_1",
    "mean_turns", "stopped", "wrong_stops", "truncated", "wall_bumps", "invalid_turns",
    "solved_seeds", "seconds"}``. The model's train/eval mode is restored afterwards.
    """
    t0 = time.perf_counter()
    seeds = list(seeds)
    codec = ChatCodec(processor)
    episodes = [
        MazeEpisode(generate_layout(s, size), max_turns=max_turns,
                    action_format=ActionFormat.LITERAL, cell_px=cell_px)
        for s in seeds
    ]
    was_training = model.training
    model.eval()
    try:
        live = list(range(len(episodes)))
        while live:
            msgs = []
            for i in live:
                obs = episodes[i].observe()
                text = turn_text(context, obs.instruction, obs.status, episodes[i].feedback)
                msgs.append(observation_message(obs.png, text))
            texts = greedy_actions(model, processor, codec, msgs, batch_size)
            for i, text in zip(live, texts, strict=True):
                episodes[i].step(text)
            live = [i for i in live if not episodes[i].done]
    finally:
        model.train(was_training)
    n = len(episodes)
    solved = sum(e.stats.solved for e in episodes)
    stopped = sum(e.stats.stopped for e in episodes)
    return {
        "n": n,
        "size": size,
        "solved": solved,
        "solve_rate": solved / n if n else 0.0,
        "solve_rate_stderr": solve_rate_stderr(solved, n),
        "pass_at_1": sum(e.reward > 0 for e in episodes) / n if n else 0.0,
        "mean_turns": sum(e.stats.turns for e in episodes) / n if n else 0.0,
        "stopped": stopped,
        "wrong_stops": stopped - solved,
        "truncated": sum(e.stats.truncated for e in episodes),
        "wall_bumps": sum(e.stats.wall_bumps for e in episodes),
        "invalid_turns": sum(e.stats.invalid_turns for e in episodes),
        "solved_seeds": [s for s, e in zip(seeds, episodes, strict=True) if e.stats.solved],
        "seconds": round(time.perf_counter() - t0, 2),
    }
