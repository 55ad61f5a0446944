"""What a checkpoint and a profile decide: the model class (from config.json), vLLM's
arguments and whether the profile's episode fits its context."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from transformers import Qwen3VLForConditionalGeneration

from rlfleet.policy import load_processor
from rlfleet.policy.loading import UnsupportedModelError, model_class
from rlfleet.policy.profiles import SERVING_PROFILES, ServingProfile, serving_profile


def test_model_class_comes_from_the_checkpoints_architectures(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    assert model_class(tiny_model_dir) is Qwen3VLForConditionalGeneration
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(
        {**config, "architectures": ["LlavaForConditionalGeneration"]}))
    with pytest.raises(UnsupportedModelError, match="LlavaForConditionalGeneration.*supports"):
        model_class(other)
    (other / "config.json").write_text(json.dumps({**config, "architectures": []}))
    with pytest.raises(UnsupportedModelError, match="none"):
        model_class(other)


def test_vllm_arguments_come_from_the_profile() -> None:
    p = serving_profile("qwen3-vl-8b")
    kwargs = p.vllm_kwargs(max_staleness=1)
    assert kwargs == {"dtype": "bfloat16", "max_model_len": 16384, "max_lora_rank": 32,
                      "max_loras": 2, "max_images_per_prompt": 20,  # VisGym's 20 turns
                      "gpu_memory_utilization": 0.85}
    assert serving_profile("tiny").vllm_kwargs(max_staleness=3)["max_loras"] == 4
    assert "gpu_memory_utilization" not in serving_profile("tiny").vllm_kwargs(1)
    with pytest.raises(ValueError, match="unknown policy profile 'nope'"):
        serving_profile("nope")


def test_every_profile_holds_its_episode(tiny_model_dir: Path) -> None:
    processor = load_processor(tiny_model_dir)
    for name, p in SERVING_PROFILES.load_all().items():
        frame = processor.image_token_count(Image.new("RGB", (p.frame_px, p.frame_px)))
        p.check_fits(frame)  # raises if not
        assert p.episode_tokens(frame) <= p.max_model_len, name


def test_a_context_too_short_for_15_turns_names_the_numbers() -> None:
    p = ServingProfile(max_model_len=4096, max_lora_rank=32, max_turns=15, frame_px=225,
                       max_new_tokens=64)
    with pytest.raises(ValueError) as err:
        p.check_fits(image_tokens_per_frame=256)
    need = 400 + 15 * (256 + 2 + 64 + 64)
    assert str(err.value).startswith("max_model_len 4096 cannot hold 15 turns")
    assert f"= {need} tokens" in str(err.value) and "256 image" in str(err.value)
