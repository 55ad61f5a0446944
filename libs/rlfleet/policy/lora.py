"""LoRA on the policy's language model: wrap, and turn into the two files a version is.

Only the language model's attention projections get adapters (what vLLM can serve for a
VLM); the vision tower stays frozen.
"""

from __future__ import annotations

import io
import json

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save

# Regex over module names: q/k/v/o projections of the language model only.
LANGUAGE_ATTENTION = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)$"


def lora_config(rank: int = 8, alpha: int | None = None, dropout: float = 0.0,
                init_random: bool = False) -> LoraConfig:
    """`init_random=True` gives non-zero B (an adapter that changes outputs; for tests)."""
    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=LANGUAGE_ATTENTION,
        init_lora_weights=not init_random,
    )


def add_lora(model: torch.nn.Module, config: LoraConfig) -> PeftModel:
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
