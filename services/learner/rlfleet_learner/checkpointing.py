"""Activation checkpointing of the policy's decoder layers (no pydantic, no Ray: the GPU
bench uses it as the trainer does)."""

from __future__ import annotations

import torch


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them.
    Non-reentrant, so it works when no input needs a gradient (the embeddings and the
    vision tower are frozen under LoRA) and with keyword arguments. transformers >= 5.2x
    names it ``activation_checkpointing_enable``; older releases
    ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if callable(enable):
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
