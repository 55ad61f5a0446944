"""Qwen3-VL-8B's architecture from its published configuration (nothing downloaded), and a
scaled-down copy for the CPU; the image processor the checkpoint ships with.

Published numbers (Qwen/Qwen3-VL-8B-Instruct config.json, REFERENCE.md): text hidden 4096,
36 layers, 32 heads, 8 KV heads (head_dim 128), intermediate 12288, vocabulary 151936,
untied embeddings, M-RoPE sections [24, 20, 20] (interleaved), rope_theta 5e6; vision
depth 27, width 1152, intermediate 4304, 16 heads, patch 16, spatial merge 2, temporal
patch 2, 2304 learned positions, DeepStack taps at blocks 8/16/24; image processor
min_pixels 65536 (256x256), mean/std 0.5.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import Qwen3VLConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


@dataclass(frozen=True)
class Arch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mrope_section: tuple[int, int, int]
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    patch_size: int
    merge_size: int
    deepstack: tuple[int, ...]
    min_pixels: int

    def as_dict(self) -> dict:
        return asdict(self)


QWEN3_VL_8B = Arch(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
    num_heads=32, num_kv_heads=8, head_dim=128, mrope_section=(24, 20, 20),
    vision_depth=27, vision_hidden=1152, vision_intermediate=4304, vision_heads=16,
    patch_size=16, merge_size=2, deepstack=(8, 16, 24), min_pixels=256 * 256)

# The same layout at a CPU size: width and depth cut, vision settings (patch 16, merge 2,
# the processor's 256x256 minimum) and the head layout ratios kept.
SMALL = Arch(
    vocab_size=151936, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4,
    num_kv_heads=1, head_dim=16, mrope_section=(2, 3, 3), vision_depth=2,
    vision_hidden=32, vision_intermediate=64, vision_heads=2, patch_size=16, merge_size=2,
    deepstack=(0,), min_pixels=256 * 256)


def qwen3_vl_config(arch: Arch, token_ids: dict[str, int]) -> Qwen3VLConfig:
    """The model configuration; ``token_ids`` maps the vision/pad tokens of the tokenizer
    the bench encodes with (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``,
    ``<|vision_end|>``, ``<|endoftext|>``) onto the model's special ids."""
    text = dict(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads, num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim, hidden_act="silu", max_position_embeddings=262144,
        rms_norm_eps=1e-6, attention_bias=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                         "mrope_section": list(arch.mrope_section),
                         "mrope_interleaved": True},
        pad_token_id=token_ids["<|endoftext|>"])
    vision = dict(
        depth=arch.vision_depth, hidden_size=arch.vision_hidden,
        intermediate_size=arch.vision_intermediate, num_heads=arch.vision_heads,
        patch_size=arch.patch_size, spatial_merge_size=arch.merge_size,
        temporal_patch_size=2, out_hidden_size=arch.hidden_size,
        num_position_embeddings=2304, deepstack_visual_indexes=list(arch.deepstack),
        hidden_act="gelu_pytorch_tanh")
    return Qwen3VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=token_ids["<|image_pad|>"], video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"])


def image_processor(arch: Arch) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=arch.patch_size, merge_size=arch.merge_size, temporal_patch_size=2,
        min_pixels=arch.min_pixels, max_pixels=16384 * 32 * 32,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def weight_params(arch: Arch) -> dict[str, int]:
    """Parameter counts by part, from the architecture alone (the bench counts the built
    model; docs/scale.md's plan uses these)."""
    h, kv = arch.hidden_size, arch.num_kv_heads * arch.head_dim
    q = arch.num_heads * arch.head_dim
    layer = (h * q + 2 * h * kv + q * h + 3 * h * arch.intermediate_size
             + 2 * h + 2 * arch.head_dim)
    vh, vi = arch.vision_hidden, arch.vision_intermediate
    block = (vh * 3 * vh + 3 * vh) + (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh) + 4 * vh
    merged = vh * arch.merge_size ** 2
    mlp = (merged * merged + merged) + (merged * h + h)
    # the final merger norms each patch before the 2x2 shuffle, DeepStack's after it
    mergers = 2 * vh + mlp + len(arch.deepstack) * (2 * merged + mlp)
    patch = 3 * 2 * arch.patch_size ** 2 * vh + vh
    vision = arch.vision_depth * block + patch + 2304 * vh + mergers
    text = arch.num_layers * layer + h + 2 * arch.vocab_size * h
    return {"text": text, "vision": vision, "total": text + vision}


def lora_params(arch: Arch, rank: int) -> int:
    """Trainable parameters of LoRA rank ``rank`` on q/k/v/o of every decoder layer."""
    h, q = arch.hidden_size, arch.num_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    return arch.num_layers * rank * ((h + q) + 2 * (h + kv) + (q + h))
