"""What reaches Qwen3-VL-8B's vision tower for a VisGym frame, against VisGym's own
preprocessing: `qwen_vl_utils` (0.0.11, VisGym's pin) resizing the frame, then the
model's processor. Runs under the vLLM venv, which has the torchvision qwen_vl_utils
imports (the main venv's CPU torch has none).

The 8B path hands the frame to the processor as it is (the hf engine, and vLLM's own
processor). Measured (docs/your-model.md, "Processor parity"): the same grid of patches
and image tokens at both VisGym sizes, and pixel values that differ only by
qwen_vl_utils' extra resample (to a multiple of 28 px) before the processor's own (to a
multiple of 32 px, at least 256x256)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from qwen_vl_utils import fetch_image

from rlfleet.maze import generate_layout
from rlfleet.maze.visgym_frame import visgym_frame
from tests.scaled_8b import scaled_8b_processor

# The measured bounds of the difference, in the processor's normalized units (mean 0.5,
# std 0.5 of [0, 1] intensities: 2/255 a grey level): a few edge pixels differ by up to
# 39 grey levels, the frame on average by under one.
MAX_ABS = 0.35
MEAN_ABS = 0.01


@pytest.mark.parametrize(("size", "tokens"), [(9, 64), (11, 81)])
def test_the_8b_path_feeds_qwen_vl_utils_grid_and_tokens(size: int, tokens: int) -> None:
    processor = scaled_8b_processor()
    layout = generate_layout(3, size)
    jpeg = visgym_frame(layout, layout.agent, False).png
    frame = Image.open(io.BytesIO(jpeg)).convert("RGB")
    ours = processor.image_processor(images=[frame], return_tensors="pt")
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    resized = fetch_image({"image": url})
    assert resized.size != frame.size  # qwen_vl_utils resamples to a multiple of 28
    theirs = processor.image_processor(images=[resized], return_tensors="pt")
    assert ours["image_grid_thw"].tolist() == theirs["image_grid_thw"].tolist()
    assert processor.image_token_count(frame) == processor.image_token_count(resized) == tokens
    diff = (ours["pixel_values"] - theirs["pixel_values"]).abs()
    assert 0 < diff.max().item() <= MAX_ABS
    assert diff.mean().item() <= MEAN_ABS
