"""The ``tiny`` profile: a ~1 M-parameter Qwen3-VL built locally with random weights.

``build_tiny_model`` writes an ordinary HF directory (config, safetensors weights,
tokenizer, image-processor config, chat template, generation config) that
:func:`rlfleet.policy.load_policy` (and vLLM) load like any Qwen3-VL checkpoint.
Weights are a pure function of the seed and the sizes, so two builds are byte-identical.

Vision: ``patch_size`` 8 with ``spatial_merge_size`` 2, so one image token covers 16x16
px; a maze drawn at 16 px per cell gives one image token per cell (7x7 maze = 112x112 px
= 49 tokens). The image processor never resizes images whose sides are multiples of 16
between 32 and 256 px (``min_pixels``/``max_pixels`` below).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tokenizer,
)

# Bump when the build changes in a way that changes the output directory's contents.
BUILD_VERSION = 1
PIXELS_PER_TOKEN = 16  # patch_size * spatial_merge_size


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny policy (defaults: ~1.0 M parameters)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_heads: int = 2
    patch_size: int = 8
    merge_size: int = 2
    bpe_vocab: int = 768
    min_pixels: int = 32 * 32
    max_pixels: int = 256 * 256

    def key(self, seed: int) -> str:
        blob = json.dumps({"v": BUILD_VERSION, "seed": seed, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_config(spec: TinySpec, vocab_size: int, token_ids: dict[str, int]) -> Qwen3VLConfig:
    half = spec.head_dim // 2
    # M-RoPE sections (temporal, height, width) must sum to head_dim / 2; Qwen3-VL-8B
    # uses [24, 20, 20] of 64, we keep the same proportions.
    t_sec = half - 2 * (half * 5 // 16)
    mrope = [t_sec, half * 5 // 16, half * 5 // 16]
    text = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=8192,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": mrope,
            "mrope_interleaved": True,
        },
        pad_token_id=token_ids[ENDOFTEXT],
        tie_word_embeddings=False,
    )
    vision = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_heads=spec.vision_heads,
        patch_size=spec.patch_size,
        spatial_merge_size=spec.merge_size,
        temporal_patch_size=2,
        out_hidden_size=spec.hidden_size,
        # a 16x16 grid of learned positions, interpolated to the image's patch grid
        num_position_embeddings=256,
        deepstack_visual_indexes=[spec.vision_depth - 1],
    )
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=token_ids[IMAGE_PAD],
        video_token_id=token_ids[VIDEO_PAD],
        vision_start_token_id=token_ids[VISION_START],
        vision_end_token_id=token_ids[VISION_END],
        tie_word_embeddings=False,
    )


def build_tiny_model(out_dir: Path, seed: int = 0, spec: TinySpec | None = None) -> Path:
    """Build the tiny policy into ``out_dir`` (created; must not exist or be empty)."""
    spec = spec or TinySpec()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")

    tokenizer = build_tokenizer(spec.bpe_vocab)
    token_ids = {
        t: tokenizer.convert_tokens_to_ids(t)
        for t in (ENDOFTEXT, IM_END, IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)
    }
    # Exactly the tokenizer: padded rows would be sampleable ids with no text.
    vocab_size = len(tokenizer)
    config = tiny_config(spec, vocab_size, token_ids)

    # Initialise under a private RNG state so the weights depend on the seed only.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[token_ids[IM_END], token_ids[ENDOFTEXT]],
        pad_token_id=token_ids[ENDOFTEXT],
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    model.save_pretrained(out_dir, safe_serialization=True)

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        temporal_patch_size=2,
        min_pixels=spec.min_pixels,
        max_pixels=spec.max_pixels,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = PolicyProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )
    processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    image_processor.save_pretrained(out_dir)  # preprocessor_config.json, as Qwen ships it
    # Name the stock class, so AutoProcessor in other stacks (vLLM) knows the directory;
    # our loader builds PolicyProcessor by hand anyway.
    proc_cfg = out_dir / "processor_config.json"
    cfg = json.loads(proc_cfg.read_text())
    cfg["processor_class"] = "Qwen3VLProcessor"
    proc_cfg.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    (out_dir / "rlfleet_tiny.json").write_text(
        json.dumps(
            {"build_version": BUILD_VERSION, "seed": seed, "params": n_params, **asdict(spec)},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return out_dir


def ensure_tiny_model(cache_dir: Path, seed: int = 0, spec: TinySpec | None = None) -> Path:
    """Path of the tiny policy in ``cache_dir``, building it once.

    The directory name carries a hash of the build inputs (see install_tiny_model for how
    concurrent builders are kept apart).
    """
    spec = spec or TinySpec()
    return install_tiny_model(Path(cache_dir) / f"tiny-s{seed}-{spec.key(seed)}", seed, spec)


def install_tiny_model(final: Path, seed: int = 0, spec: TinySpec | None = None) -> Path:
    """Build the tiny policy at ``final`` unless a complete one is there already.

    Building goes to a temporary sibling that is renamed into place, so concurrent callers
    (several pods starting on one shared volume) never see a half-written model; the loser
    of a race discards its copy.
    """
    final = Path(final)
    if (final / "rlfleet_tiny.json").is_file():
        return final
    if final.exists() and any(final.iterdir()):
        raise FileExistsError(f"{final} holds something that is not a complete tiny model")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build_tiny_model(tmp, seed=seed, spec=spec)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            final.rmdir()  # empty (checked above): a mount point's stand-in, or a leftover
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "rlfleet_tiny.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
