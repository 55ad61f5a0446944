"""A run whose episodes cannot fit its serving profile's context fails at start, naming
the numbers, instead of vLLM cutting the episodes off mid-run."""

from __future__ import annotations

from dataclasses import replace

from PIL import Image

from rlfleet.learner_config import LearnerConfig
from rlfleet.maze.episode import default_max_turns
from rlfleet.policy.contexts import is_full_history
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.profiles import serving_profile


def episode_turns(cfg: LearnerConfig) -> int:
    """Turns one engine request holds: the whole episode in context ``full``, one turn in
    the per-turn contexts."""
    if not is_full_history(cfg.data.context):
        return 1
    return cfg.data.max_turns or default_max_turns(cfg.data.size)


def check_episodes_fit(cfg: LearnerConfig, processor: PolicyProcessor) -> None:
    """ValueError when the profile's ``max_model_len`` cannot hold this config's
    episodes (its turns, frames and ``max_new_tokens``)."""
    d = cfg.data
    frame_px = d.size * d.cell_px
    try:
        image_tokens = (processor.image_token_count(Image.new("RGB", (frame_px, frame_px)))
                        if frame_px else 0)
    except ValueError as exc:  # e.g. smaller than a patch, or an aspect ratio it refuses
        raise ValueError(
            f"model.profile {cfg.model.profile}: its image processor cannot take a "
            f"{frame_px}x{frame_px} px frame (data.size={d.size} x data.cell_px="
            f"{d.cell_px}): {exc}") from None
    turns = episode_turns(cfg)
    profile = replace(serving_profile(cfg.model.profile), max_turns=turns,
                      max_new_tokens=d.max_new_tokens, frame_px=frame_px)
    try:
        profile.check_fits(image_tokens)
    except ValueError as exc:
        raise ValueError(
            f"model.profile {cfg.model.profile}: {exc} (data.max_turns={d.max_turns}, "
            f"data.context={d.context}, data.max_new_tokens={d.max_new_tokens}, frames of "
            f"{frame_px} px)") from None
