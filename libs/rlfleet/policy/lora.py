"""LoRA on the policy's language model: wrap, and turn into the two files a version is.

Only language-model projections get adapters (vLLM serves LoRA on a VLM's language model
only): the attention projections by default, optionally the MLP's too. The vision tower
stays frozen, which is what lets the engines and the learner compute its outputs once per
frame (rlfleet.policy.vision).
"""

from __future__ import annotations

import io
import json
import warnings

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def language_modules(names: tuple[str, ...] = ATTENTION) -> str:
    """A regex over module names: these projections of the language model only."""
    unknown = sorted(set(names) - set(ATTENTION) - set(MLP))
    if unknown or not names:
        raise ValueError(f"LoRA modules must be among {ATTENTION + MLP}, got {list(names)}")
    return r".*language_model.*\.(" + "|".join(names) + r")$"


LANGUAGE_ATTENTION = language_modules(ATTENTION)


def lora_config(rank: int = 8, alpha: int | None = None, dropout: float = 0.0,
                init_random: bool = False, modules: tuple[str, ...] = ATTENTION) -> LoraConfig:
    """`init_random=True` gives non-zero B (an adapter that changes outputs; for tests)."""
    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=language_modules(tuple(modules)),
        init_lora_weights=not init_random,
    )


def add_lora(model: torch.nn.Module, config: LoraConfig) -> PeftModel:
    with warnings.catch_warnings():
        # peft asks every model for transformers' deprecated `is_gradient_checkpointing`:
        # a warning between the two libraries, on every trainer's start, that no user
        # setting can answer
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return get_peft_model(model, config)


def adapter_files(model: PeftModel, base_model_name: str = "") -> dict[str, bytes]:
    """The adapter as {adapter_model.safetensors, adapter_config.json} bytes, deterministic
    (sorted keys, no timestamps) so equal weights give equal bytes."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sorted(state.items())}
    config = model.peft_config["default"].to_dict()
    config["base_model_name_or_path"] = base_model_name
    config["target_modules"] = (sorted(config["target_modules"])
                                if isinstance(config["target_modules"], (set, list))
                                else config["target_modules"])
    buf = io.BytesIO(json.dumps(config, sort_keys=True, indent=2, default=str).encode())
    return {"adapter_model.safetensors": save(tensors),
            "adapter_config.json": buf.getvalue()}
