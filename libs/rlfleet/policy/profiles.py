"""Policy profiles: where a profile's model directory comes from (never a download)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet.registries import SERVING_PROFILES_GROUP, Registry

# The policy profiles are the entries of SERVING_PROFILES (below): rlfleet's own and a
# package's (the `rlfleet.serving_profiles` entry-point group). This module imports no
# torch at import time, so the `rlfleet` command can read it.
TINY = "tiny"  # the one profile that builds its own model (rlfleet.policy.tiny)


def resolve_model_dir(
    profile: str,
    model_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    seed: int = 0,
) -> Path:
    """The local model directory of ``profile``.

    ``tiny``: ``model_path`` if given (an existing tiny directory), else the cached tiny
    build under ``cache_dir`` (built on first use). Every other profile (``qwen3-vl-8b``,
    a plugin's): ``model_path`` is required and must be a local checkpoint directory.
    """
    SERVING_PROFILES.check(profile)  # RegistryError (a ValueError) naming the known ones
    from rlfleet.policy.loading import check_checkpoint
    from rlfleet.policy.tiny import ensure_tiny_model

    if model_path is not None:
        # Every service resolves its model here before anything loads it (the hf engine,
        # vLLM, the learner), so an incomplete checkpoint fails at start with one error
        # naming each missing piece, not deep inside transformers or vLLM.
        return check_checkpoint(model_path)
    if profile == TINY:
        if cache_dir is None:
            raise ValueError("tiny profile needs model_path or cache_dir")
        return ensure_tiny_model(Path(cache_dir), seed=seed)
    raise ValueError(f"profile {profile!r} needs a local model_path (e.g. /shared/models/...)")


# -- what each profile asks of the inference engine ----------------------------------


@dataclass(frozen=True)
class ServingProfile:
    """How a profile's policy is served by the vLLM engine, and the episode it must hold.

    ``max_turns`` full-history turns, each one frame of ``frame_px`` square (the env's
    render) plus at most ``turn_text_tokens`` of observation text and ``max_new_tokens``
    generated, after a first prompt of ``prompt_text_tokens``, must fit ``max_model_len``;
    every frame is one image of the prompt, so ``max_images_per_prompt`` is
    ``max_turns``.
    """

    max_model_len: int
    max_lora_rank: int
    max_turns: int
    frame_px: int
    max_new_tokens: int
    prompt_text_tokens: int = 400
    turn_text_tokens: int = 64
    dtype: str = "auto"
    gpu_memory_utilization: float | None = None  # None: vLLM's CPU KV-cache default

    @property
    def max_images_per_prompt(self) -> int:
        return self.max_turns

    def episode_tokens(self, image_tokens_per_frame: int) -> int:
        """The most tokens a full-history episode of this profile takes."""
        per_turn = image_tokens_per_frame + 2 + self.turn_text_tokens + self.max_new_tokens
        return self.prompt_text_tokens + self.max_turns * per_turn

    def check_fits(self, image_tokens_per_frame: int) -> None:
        """ValueError naming the numbers when ``max_model_len`` cannot hold an episode."""
        need = self.episode_tokens(image_tokens_per_frame)
        if need > self.max_model_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} cannot hold {self.max_turns} turns: "
                f"{self.prompt_text_tokens} prompt tokens + {self.max_turns} x "
                f"({image_tokens_per_frame} image + 2 vision + {self.turn_text_tokens} text + "
                f"{self.max_new_tokens} generated) = {need} tokens")

    def vllm_kwargs(self, max_staleness: int) -> dict[str, Any]:
        """The keyword arguments of rlfleet.engines.vllm.VLLMEngine for this profile; vLLM
        holds the live version and those inside the staleness bound at once."""
        kwargs: dict[str, Any] = dict(
            dtype=self.dtype, max_model_len=self.max_model_len,
            max_lora_rank=self.max_lora_rank, max_loras=max_staleness + 1,
            max_images_per_prompt=self.max_images_per_prompt)
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        return kwargs


def _is_serving_profile(obj: object) -> bool:
    return isinstance(obj, ServingProfile)


# The policy profiles by name; a package adds one for its model without editing rlfleet
# (an entry point of the `rlfleet.serving_profiles` group naming a ServingProfile).
SERVING_PROFILES: Registry[ServingProfile] = Registry(
    "policy profile", SERVING_PROFILES_GROUP, is_kind=_is_serving_profile, autodiscover=True)
# the tiny policy on the CPU: 7x7 mazes at 16 px per cell, LoRA up to r32
SERVING_PROFILES.add(TINY, ServingProfile(max_model_len=4096, max_lora_rank=32, max_turns=15,
                                          frame_px=112, max_new_tokens=16))
# Qwen3-VL-8B on one GPU of an ml.g7e.12xlarge (configs/qwen3-vl-8b-hyperpod.yaml):
# 9x9 mazes at VisGym's 25 px (225 px frames), VisGym's 20 turns of full history, LoRA
# r32, VisGym's 512 new tokens a turn (verbalized replies); bf16 weights, 85 % of the GPU
# for vLLM.
SERVING_PROFILES.add("qwen3-vl-8b", ServingProfile(
    max_model_len=16384, max_lora_rank=32, max_turns=20, frame_px=225, max_new_tokens=512,
    dtype="bfloat16", gpu_memory_utilization=0.85))
# The same on VisGym's hard 11x11 mazes (configs/qwen3-vl-8b-11x11.yaml): 275 px frames,
# its 30 turns of 512-token replies, past 16384 tokens.
SERVING_PROFILES.add("qwen3-vl-8b-hard", ServingProfile(
    max_model_len=32768, max_lora_rank=32, max_turns=30, frame_px=275, max_new_tokens=512,
    dtype="bfloat16", gpu_memory_utilization=0.85))


def serving_profile(profile: str) -> ServingProfile:
    """The serving profile called `profile`; RegistryError (a ValueError) naming the known
    ones for another name."""
    return SERVING_PROFILES.get(profile)


def profile_names() -> list[str]:
    """Every policy profile's name (rlfleet's and the installed packages')."""
    return SERVING_PROFILES.names()


def known_profile(profile: str) -> str:
    """`profile` when it is a policy profile: the check of a settings field."""
    SERVING_PROFILES.check(profile)
    return profile
