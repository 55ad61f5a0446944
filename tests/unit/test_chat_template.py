"""The chat is the checkpoint's own template: rlfleet's prompt + per-turn deltas give
exactly the tokens of transformers' template and processor on multi-turn image chats,
with the loss mask on the generated turns only, for the tiny checkpoint, a checkpoint in
Qwen3-VL-8B's layout (scaled down) and a template that differs from both."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlfleet.policy import ChatCodec, Transcript, image_to_data_url
from rlfleet.policy.chat import ChatFormatError
from rlfleet.policy.loading import load_processor, model_class
from tests.scaled_8b import build_scaled_8b

# A different layout: a default system prompt when none is given, a "Frame:" label
# before each image and a blank line after every turn.
OTHER_TEMPLATE = """\
{%- if messages[0]['role'] != 'system' -%}
{{- '<|im_start|>system\\nYou play mazes.<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' -%}{{- 'Frame: <|vision_start|><|image_pad|><|vision_end|>' -}}
{%- else -%}{{- part['text'] -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{{- '<|im_end|>\\n\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def frame(size: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def user(image: Image.Image, text: str) -> dict:
    return {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_to_data_url(image)}},
        {"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    tiny = tiny_model_dir
    scaled = build_scaled_8b(root / "scaled-8b")
    other = root / "other"
    shutil.copytree(tiny, other)
    (other / "chat_template.jinja").write_text(OTHER_TEMPLATE)
    return {"tiny": tiny, "scaled-8b": scaled, "other": other}


@pytest.mark.parametrize("name", ["tiny", "scaled-8b", "other"])
def test_encoding_is_the_templates_tokens_on_multi_turn_image_chats(checkpoints, name):
    processor = load_processor(checkpoints[name])
    tok = processor.tokenizer
    codec = ChatCodec(processor)
    size = 225 if name == "scaled-8b" else 112  # the 8B sees VisGym's 25 px cells
    frames = [frame(size, i) for i in range(4)]
    replies = ["('move', 0)", "<action>up</action>", "('stop', 'stop')"]
    observations = [user(frames[0], "Navigate the maze."), user(frames[1], "Moved right."),
                    user(frames[2], "Cannot move into a wall."), user(frames[3], "x")]
    tr = Transcript.start(codec, observations[:1])
    conversation = observations[:1]
    for reply, obs in zip(replies, observations[1:], strict=True):
        turn = tok.encode(reply, add_special_tokens=False) + [codec.im_end_id]
        tr.add_turn(turn, [-0.25] * len(turn))
        tr.add_observation(obs)
        conversation = [*conversation, {"role": "assistant", "content": reply}, obs]

    # transformers' own: the template's text, then the processor expands each image
    template_msgs = [
        {"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
         [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
        for m in conversation]
    text = tok.apply_chat_template(template_msgs, tokenize=False, add_generation_prompt=True)
    if name == "other":
        assert text.startswith("<|im_start|>system\nYou play mazes.") and "Frame: " in text
    reference = processor(text=[text], images=frames, return_tensors="np")
    assert tr.token_ids == reference["input_ids"][0].tolist()
    assert len(tr.images) == 4
    # exact accounting: the loss mask and logprobs sit on the generated turns only
    masked = [t for t, m in zip(tr.token_ids, tr.loss_mask, strict=True) if m]
    assert masked == [t for s, e in tr.turns for t in tr.token_ids[s:e]]
    assert [tr.token_ids[e - 1] for _, e in tr.turns] == [codec.im_end_id] * 3
    assert [lp for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if m] == \
        [-0.25] * sum(tr.loss_mask)
    assert all(lp == 0.0 for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if not m)


def test_the_scaled_8b_is_the_8b_layout(checkpoints):
    import json

    from transformers import Qwen3VLForConditionalGeneration

    path = checkpoints["scaled-8b"]
    config = json.loads((path / "config.json").read_text())
    assert model_class(path) is Qwen3VLForConditionalGeneration
    assert config["text_config"]["vocab_size"] == 151936 > len(load_processor(path).tokenizer)
    assert config["vision_config"]["patch_size"] == 16
    assert config["vision_config"]["spatial_merge_size"] == 2
    processor = load_processor(path)
    # a 225 px frame (9x9 maze at 25 px) is scaled to the 256x256 minimum: 8x8 tokens
    assert processor.image_token_count(Image.new("RGB", (225, 225))) == 64
    assert (path / "chat_template.jinja").is_file()


def test_a_template_that_does_not_end_turns_with_im_end_is_refused(checkpoints, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoints["tiny"], bad)
    (bad / "chat_template.jinja").write_text(
        "{%- for m in messages -%}{{- m['role'] + ': ' + m['content'] + '\\n' -}}{%- endfor -%}")
    with pytest.raises(ChatFormatError, match="ends an assistant turn"):
        ChatCodec(load_processor(bad))
