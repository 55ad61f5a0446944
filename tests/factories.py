"""Small real artefacts for tests: LoRA adapter directories published under a runs root."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save

from rlfleet.storage import AdapterManifest, RunsRoot, publish_adapter_dir


def adapter_files(seed: int = 0, rank: int = 4, hidden: int = 16) -> dict[str, bytes]:
    """A PEFT-shaped LoRA adapter (one q_proj pair) as the two files peft writes."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight":
            torch.randn(rank, hidden, generator=g),
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight":
            torch.randn(hidden, rank, generator=g),
    }
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": ["q_proj"], "base_model_name_or_path": "tiny"}
    return {"adapter_model.safetensors": save(tensors),
            "adapter_config.json": json.dumps(config).encode()}


def publish_version(root: RunsRoot, run: str, version: int, seed: int | None = None
                    ) -> AdapterManifest:
    return publish_adapter_dir(root, run, version, adapter_files(seed if seed is not None
                                                                 else version),
                               base_model="tiny", step=version)


def tiny_lora_files(model_dir: Path, seed: int, rank: int = 8) -> dict[str, bytes]:
    """A real LoRA adapter for the tiny policy with random (non-zero) B, so it changes
    the policy's outputs."""
    from rlfleet.policy import load_policy
    from rlfleet.policy.lora import adapter_files as lora_adapter_files
    from rlfleet.policy.lora import add_lora, lora_config

    torch.manual_seed(seed)
    model, _ = load_policy(model_dir)
    peft_model = add_lora(model, lora_config(rank, init_random=True))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return lora_adapter_files(peft_model, "tiny")


def publish_tiny_lora(root: RunsRoot, run: str, version: int, model_dir: Path,
                      seed: int | None = None) -> AdapterManifest:
    return publish_adapter_dir(root, run, version,
                               tiny_lora_files(model_dir, seed if seed is not None else version),
                               base_model="tiny", step=version)
