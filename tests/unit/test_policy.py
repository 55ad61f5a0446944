"""The tiny policy: build, reload, tokenizer, processor, chat codec, sequence logprobs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlfleet.policy import (
    ChatCodec,
    ChatFormatError,
    PolicyProcessor,
    Transcript,
    build_tiny_model,
    collate,
    ensure_tiny_model,
    image_to_data_url,
    load_policy,
    resolve_model_dir,
    sequence_logprobs,
)
from rlfleet.policy.loading import vision_token_ids
from rlfleet.policy.tokenizer import ACTION_TOKENS, SPECIAL_TOKENS
from rlfleet.policy.vision import VisionEncoder, vision_is_frozen


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir)


@pytest.fixture(scope="module")
def codec(policy) -> ChatCodec:
    return ChatCodec(policy[1])


def noise_image(size: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def user(image: Image.Image, text: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": image_to_data_url(image)}},
            {"type": "text", "text": text},
        ],
    }


def file_digests(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


# -- build -------------------------------------------------------------------------------


def test_build_is_deterministic_and_seeded(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=0)
    b = build_tiny_model(tmp_path / "b", seed=0)
    c = build_tiny_model(tmp_path / "c", seed=1)
    da, db, dc = file_digests(a), file_digests(b), file_digests(c)
    assert da == db
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(da)
    assert da["model.safetensors"] != dc["model.safetensors"]
    assert da["tokenizer.json"] == dc["tokenizer.json"]


def test_build_refuses_non_empty_dir(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "junk").write_text("x")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path / "x")


def test_ensure_builds_once(tmp_path):
    first = ensure_tiny_model(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_model(tmp_path)
    assert again == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    # no temporary directories are left behind
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    assert resolve_model_dir("tiny", cache_dir=tmp_path) == first


def test_resolve_refuses_what_it_cannot_find(tmp_path):
    with pytest.raises(ValueError):
        resolve_model_dir("qwen3-vl-8b")
    with pytest.raises(FileNotFoundError):
        resolve_model_dir("qwen3-vl-8b", model_path=tmp_path)
    with pytest.raises(ValueError):
        resolve_model_dir("gpt-2", cache_dir=tmp_path)


def test_reload_gives_the_built_model(tiny_model_dir, policy):
    model, processor = policy
    assert isinstance(processor, PolicyProcessor)
    assert (
        model.config.vision_config.patch_size * model.config.vision_config.spatial_merge_size == 16
    )
    n = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < n < 1.5e6
    again, _ = load_policy(tiny_model_dir)
    for (k, v), (k2, v2) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert k == k2 and torch.equal(v, v2)


def test_load_policy_refuses_a_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "nope")


# -- tokenizer and processor ---------------------------------------------------------------


def test_tokenizer_special_and_action_tokens(policy):
    tok = policy[1].tokenizer
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) < len(tok)
        assert tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)]
    for a in ACTION_TOKENS:
        ids = tok.encode(a, add_special_tokens=False)
        assert len(ids) == 1, a
        assert tok.decode(ids) == a
    text = "Feedback: Cannot move into a wall. ünïcødé 12345 ('move', 2)"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert policy[0].config.text_config.vocab_size == len(tok)


@pytest.mark.parametrize("size", [112, 144, 176])
def test_one_image_token_per_16px_and_no_resize(policy, size):
    processor = policy[1]
    img = noise_image(size)
    cells = (size // 16) ** 2
    assert processor.image_token_count(img) == cells
    ip = processor.image_processor
    resized = ip(images=[img], return_tensors="pt")
    raw = ip(images=[img], do_resize=False, return_tensors="pt")
    assert resized["image_grid_thw"].tolist() == [[1, size // 8, size // 8]]
    assert torch.equal(resized["pixel_values"], raw["pixel_values"])


# -- chat codec -------------------------------------------------------------------------


def expand_template(processor, messages, images) -> list[int]:
    """Reference: the saved chat template, then <|image_pad|> expanded per image."""
    text = processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(images) + 1
    out = pieces[0]
    for img, piece in zip(images, pieces[1:], strict=True):
        out += "<|image_pad|>" * processor.image_token_count(img) + piece
    return processor.tokenizer(out, add_special_tokens=False)["input_ids"]


def test_prompt_matches_chat_template(policy, codec):
    processor = policy[1]
    img = noise_image(112)
    messages = [{"role": "system", "content": "You are a helpful assistant."}, user(img, "Go.")]
    enc = codec.encode_prompt(messages)
    assert enc.token_ids == expand_template(processor, messages, [img])
    assert len(enc.images) == 1 and enc.images[0].size == (112, 112)
    assert enc.token_ids.count(codec.image_pad_id) == 49
    assert np.array_equal(np.asarray(enc.images[0]), np.asarray(img))
    text = processor.tokenizer.decode(enc.token_ids)
    assert text.endswith("Go.<|im_end|>\n<|im_start|>assistant\n")


def test_delta_encoding_equals_full_reencoding(policy, codec):
    """Prompt + turns + deltas == the whole conversation encoded at once, when turns are
    canonical tokenisations ending in <|im_end|>."""
    tok = policy[1].tokenizer
    imgs = [noise_image(112, 1), noise_image(144, 2), noise_image(112, 3)]
    replies = ["('move', 0)", "I think <action>up</action> is right"]
    obs = [user(imgs[0], "Start."), user(imgs[1], "Feedback: Moved right."), user(imgs[2], "x")]

    tr = Transcript.start(codec, [{"role": "system", "content": "sys"}, obs[0]])
    conversation = [{"role": "system", "content": "sys"}, obs[0]]
    for reply, ob in zip(replies, obs[1:], strict=True):
        turn = tok.encode(reply, add_special_tokens=False) + [codec.im_end_id]
        tr.add_turn(turn, [-0.5] * len(turn))
        tr.add_observation(ob)
        conversation += [{"role": "assistant", "content": reply}, ob]

    full = codec.encode_conversation(conversation, add_generation_prompt=True)
    assert tr.token_ids == full.token_ids
    assert tr.token_ids == expand_template(policy[1], conversation, imgs)
    assert len(tr.images) == 3 and all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(tr.images, imgs, strict=True)
    )
    # the loss mask covers exactly the generated turns, <|im_end|> included
    masked = [t for t, m in zip(tr.token_ids, tr.loss_mask, strict=True) if m]
    expected = [t for s, e in tr.turns for t in tr.token_ids[s:e]]
    assert masked == expected
    assert [tr.token_ids[e - 1] for _, e in tr.turns] == [codec.im_end_id] * 2
    assert len(tr.logprobs) == len(tr.token_ids)
    assert sum(tr.loss_mask) == sum(e - s for s, e in tr.turns)


def test_truncated_turn_is_closed_by_the_delta(policy, codec):
    tok = policy[1].tokenizer
    turn = tok.encode("('move'", add_special_tokens=False)  # cut off: no <|im_end|>
    delta = codec.encode_observation({"role": "user", "content": "again"}, turn)
    assert delta.token_ids[0] == codec.im_end_id
    assert tok.decode(delta.token_ids) == (
        "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    closed = codec.encode_observation("again", turn + [codec.im_end_id])
    assert closed.token_ids == delta.token_ids[1:]


def test_transcript_order_is_enforced(codec):
    tr = Transcript.start(codec, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError):
        tr.add_observation({"role": "user", "content": "x"})
    tr.add_turn([codec.im_end_id], [0.0])
    with pytest.raises(ValueError):
        tr.add_turn([codec.im_end_id], [0.0])
    with pytest.raises(ValueError):
        tr.add_turn([1, 2], [0.0])


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,not-base64!"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
        {"type": "audio", "audio": "x"},
    ],
)
def test_bad_content_parts_are_refused(codec, part):
    with pytest.raises(ChatFormatError):
        codec.encode_prompt([{"role": "user", "content": [part]}])


def test_pil_image_parts_are_accepted(codec):
    img = noise_image(112)
    a = codec.encode_prompt([{"role": "user", "content": [{"type": "image", "image": img}]}])
    b = codec.encode_prompt([user(img, "")])
    assert a.token_ids == b.token_ids


# -- positions and logprobs -------------------------------------------------------------


def multi_turn(policy, codec) -> Transcript:
    tok = policy[1].tokenizer
    tr = Transcript.start(codec, [user(noise_image(112, 4), "Start.")])
    for i, reply in enumerate(["('move', 3)", "<action>left</action>"]):
        turn = tok.encode(reply, add_special_tokens=False) + [codec.im_end_id]
        tr.add_turn(turn, [0.0] * len(turn))
        tr.add_observation(user(noise_image(144 if i == 0 else 112, 5 + i), "Feedback."))
    turn = tok.encode("('stop', 'stop')", add_special_tokens=False) + [codec.im_end_id]
    tr.add_turn(turn, [0.0] * len(turn))
    return tr


def test_positions_match_the_model(policy, codec):
    model, processor = policy
    tr = multi_turn(policy, codec)
    batch = collate(processor, [tr.token_ids], [tr.images])
    mm = (batch.input_ids == codec.image_pad_id).int()
    ref, _ = model.model.get_rope_index(
        batch.input_ids,
        mm,
        image_grid_thw=batch.image_grid_thw,
        attention_mask=batch.attention_mask,
    )
    assert torch.equal(batch.position_ids[1:], ref)
    assert int(batch.next_position[0]) == int(ref.max()) + 1


def test_sequence_logprobs_match_the_models_own_forward(policy, codec):
    model, processor = policy
    tr = multi_turn(policy, codec)
    batch = collate(processor, [tr.token_ids], [tr.images])
    with torch.no_grad():
        ours = sequence_logprobs(model, processor, tr.token_ids, tr.images)
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            pixel_values=batch.pixel_values,
            image_grid_thw=batch.image_grid_thw,
            mm_token_type_ids=(batch.input_ids == codec.image_pad_id).int(),
        )
    logits = out.logits[0, :-1].float()
    targets = batch.input_ids[0, 1:]
    full = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    # the vision placeholders are outside the action space: other targets are scored
    # without them, the placeholders themselves (prompt tokens) over the full vocabulary
    banned = torch.tensor(vision_token_ids(processor))
    restricted = torch.log_softmax(logits.index_fill(-1, banned, float("-inf")), -1)
    restricted = restricted.gather(-1, targets[:, None]).squeeze(-1)
    ref = torch.where(torch.isin(targets, banned), full, restricted)
    assert ours.shape == (len(tr.token_ids),)
    assert ours[0] == 0
    torch.testing.assert_close(ours[1:], ref, atol=1e-5, rtol=1e-5)


def test_sequence_logprobs_batched_with_padding(policy, codec):
    model, processor = policy
    long = multi_turn(policy, codec)
    cut = long.turns[0][1]
    short_ids, short_imgs = long.token_ids[:cut], long.images[:1]
    with torch.no_grad():
        both = sequence_logprobs(
            model, processor, [long.token_ids, short_ids], [long.images, short_imgs]
        )
        a = sequence_logprobs(model, processor, long.token_ids, long.images)
        b = sequence_logprobs(model, processor, short_ids, short_imgs)
    assert both.shape == (2, len(long.token_ids))
    torch.testing.assert_close(both[0], a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1, :cut], b, atol=1e-5, rtol=1e-5)
    assert torch.all(both[1, cut:] == 0)


def test_sequence_logprobs_temperature_and_gradient(policy, codec):
    model, processor = policy
    tr = multi_turn(policy, codec)
    with torch.no_grad():
        t1 = sequence_logprobs(model, processor, tr.token_ids, tr.images, temperature=1.0)
        t0 = sequence_logprobs(model, processor, tr.token_ids, tr.images, temperature=0.0)
        t2 = sequence_logprobs(model, processor, tr.token_ids, tr.images, temperature=2.0)
    torch.testing.assert_close(t0, t1)
    assert not torch.allclose(t1, t2)
    mask = torch.tensor(tr.loss_mask, dtype=torch.float32)
    lp = sequence_logprobs(model, processor, tr.token_ids, tr.images)
    (lp * mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert any("visual" in n for n in grads) and any("language_model" in n for n in grads)
    model.zero_grad(set_to_none=True)


# -- the vision cache --------------------------------------------------------------------


def png_bytes(image: Image.Image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_cached_vision_and_loss_positions_give_the_same_logprobs_and_gradient(policy, codec):
    """The learner's fast path (tower outputs from the cache, PNG bytes in, vocabulary
    projection at the loss positions only) computes exactly the full path's values."""
    model, processor = policy
    tr = multi_turn(policy, codec)
    mask = torch.tensor([tr.loss_mask], dtype=torch.float32)
    vision = VisionEncoder(model, processor)
    pngs = [png_bytes(im) for im in tr.images]
    for p in model.model.visual.parameters():
        p.requires_grad_(False)  # the cache serves a frozen tower, as under LoRA
    try:
        full = sequence_logprobs(model, processor, [tr.token_ids], [tr.images])
        (full * mask).sum().backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        for _ in range(2):  # a miss, then a hit
            fast = sequence_logprobs(model, processor, [tr.token_ids], [pngs],
                                     score_mask=mask, vision=vision)
        torch.testing.assert_close(fast * mask, full * mask, atol=1e-6, rtol=1e-6)
        assert torch.all(fast[mask == 0] == 0)
        (fast * mask).sum().backward()
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert got.keys() == want.keys()
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=1e-6, rtol=1e-5)
    finally:
        model.zero_grad(set_to_none=True)
        for p in model.model.visual.parameters():
            p.requires_grad_(True)
    assert vision.misses == len(set(pngs)) and vision.hits >= len(pngs)


def test_vision_cache_is_bounded_in_bytes_and_evicts_the_oldest(policy):
    model, processor = policy
    one = VisionEncoder(model, processor).encode([noise_image(32, 0)])[0].nbytes
    vision = VisionEncoder(model, processor, max_bytes=3 * one)
    images = [noise_image(32, s) for s in range(5)]
    vision.encode(images)
    assert len(vision) == 3 and vision.cached_bytes <= 3 * one
    misses = vision.misses
    vision.encode(images[-3:])  # the newest three are still there
    assert vision.misses == misses
    vision.encode(images[:1])  # the oldest was evicted
    assert vision.misses == misses + 1


def test_vision_is_frozen_follows_requires_grad(tiny_model_dir, policy):
    from rlfleet.policy.lora import add_lora, lora_config

    assert not vision_is_frozen(policy[0])  # a bare model trains everything
    peft_model = add_lora(load_policy(tiny_model_dir)[0], lora_config(4))
    assert vision_is_frozen(peft_model)  # LoRA on the language model only
