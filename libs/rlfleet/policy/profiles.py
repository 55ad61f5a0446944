"""Policy profiles: where a profile's model directory comes from (never a download)."""

from __future__ import annotations

from pathlib import Path

from rlfleet.policy.loading import PROFILES, check_checkpoint
from rlfleet.policy.tiny import ensure_tiny_model


def resolve_model_dir(
    profile: str,
    model_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    seed: int = 0,
) -> Path:
    """The local model directory of ``profile``.

    ``tiny``: ``model_path`` if given (an existing tiny directory), else the cached tiny
    build under ``cache_dir`` (built on first use). ``qwen3-vl-8b``: ``model_path`` is
    required and must be a local checkpoint directory.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown policy profile {profile!r}; expected one of {PROFILES}")
    if model_path is not None:
        # Every service resolves its model here before anything loads it (the hf engine,
        # vLLM, the learner), so an incomplete checkpoint fails at start with one error
        # naming each missing piece, not deep inside transformers or vLLM.
        return check_checkpoint(model_path)
    if profile == "tiny":
        if cache_dir is None:
            raise ValueError("tiny profile needs model_path or cache_dir")
        return ensure_tiny_model(Path(cache_dir), seed=seed)
    raise ValueError(f"profile {profile!r} needs a local model_path (e.g. /shared/models/...)")
