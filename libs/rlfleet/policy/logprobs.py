"""Model inputs for whole multi-turn sequences, and per-token logprobs in one pass.

Qwen3-VL uses M-RoPE: image tokens get 2-D (height, width) positions and text after an
image continues from ``start + max(h, w)``, so positions are not token indices once an
image has been seen. :func:`mrope_positions` computes them from the token ids and image
grids (the same rule as ``Qwen3VLModel.get_rope_index``) so that the learner's one-pass
scoring and the engine's incremental decoding give every token the same position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet.policy.loading import PolicyProcessor, vision_token_ids
from rlfleet.policy.vision import ImageLike, VisionEncoder, encoder_outputs


@dataclass
class ModelBatch:
    """Padded model inputs for a batch of sequences.

    ``position_ids`` is ``(4, B, L)``: row 0 the plain text position (used for the causal
    mask and the KV cache), rows 1-3 the M-RoPE (temporal, height, width) positions.
    ``next_position`` is ``(B,)``: the M-RoPE position the next appended token takes.
    Images arrive either as ``pixel_values`` for the model's vision tower, or, when a
    :class:`~rlfleet.policy.vision.VisionEncoder` collated the batch, as its cached
    outputs (``encoder_outputs``, Qwen3-VL's ``mm_encoder_outputs``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    next_position: torch.Tensor
    lengths: list[int]
    encoder_outputs: dict | None = None

    def to(self, device: torch.device | str) -> ModelBatch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return ModelBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            pixel_values=mv(self.pixel_values),
            image_grid_thw=mv(self.image_grid_thw),
            next_position=self.next_position.to(device),
            lengths=self.lengths,
            encoder_outputs=self.encoder_outputs,  # built on the model's device
        )


def mrope_positions(
    token_ids: Sequence[int],
    grids: Sequence[Sequence[int]],
    image_token_id: int,
    merge_size: int,
) -> tuple[torch.Tensor, int]:
    """``(3, L)`` M-RoPE positions of one unpadded sequence and the next free position.

    ``grids`` holds each image's ``(t, h, w)`` patch grid, in order of appearance.
    """
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    n = ids.numel()
    pos = torch.empty(3, n, dtype=torch.long)
    is_img = (ids == image_token_id).tolist()
    cur = 0
    i = 0
    g = 0
    while i < n:
        if not is_img[i]:
            pos[:, i] = cur
            cur += 1
            i += 1
            continue
        if g >= len(grids):
            raise ValueError("more image placeholder runs than images")
        t, h, w = (int(x) for x in grids[g])
        hh, ww = h // merge_size, w // merge_size
        count = t * hh * ww
        if i + count > n or not all(is_img[i : i + count]):
            raise ValueError(f"image {g}: expected {count} consecutive <|image_pad|> tokens")
        tt = torch.arange(t).view(t, 1, 1).expand(t, hh, ww).reshape(-1)
        yy = torch.arange(hh).view(1, hh, 1).expand(t, hh, ww).reshape(-1)
        xx = torch.arange(ww).view(1, 1, ww).expand(t, hh, ww).reshape(-1)
        pos[0, i : i + count] = tt + cur
        pos[1, i : i + count] = yy + cur
        pos[2, i : i + count] = xx + cur
        cur += max(hh, ww)
        i += count
        g += 1
    if g != len(grids):
        raise ValueError(f"{len(grids)} images but {g} placeholder runs")
    return pos, cur


def collate(
    processor: PolicyProcessor,
    sequences: Sequence[Sequence[int]],
    images: Sequence[Sequence[ImageLike]],
    *,
    padding_side: str = "right",
    pad_token_id: int | None = None,
    vision: VisionEncoder | None = None,
    image_keys: Sequence[bytes] | None = None,
) -> ModelBatch:
    """Pad a batch of token sequences (placeholders expanded) and process their images:
    into pixel values, or with ``vision`` into its (cached) tower outputs. Images may be
    PNG bytes where ``vision`` is given; ``image_keys`` are their cache keys, flattened
    in order, where the caller has computed them already."""
    if len(sequences) != len(images):
        raise ValueError("one image list per sequence")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("empty batch or empty sequence")
    tok = processor.tokenizer
    image_token_id = int(tok.convert_tokens_to_ids("<|image_pad|>"))
    pad = pad_token_id if pad_token_id is not None else int(tok.pad_token_id or 0)
    flat_images = [im for imgs in images for im in imgs]
    pixel_values = grid = encoded = None
    grids_per_row: list[list[list[int]]] = [[] for _ in sequences]
    if flat_images:
        if vision is not None:
            features = vision.encode(flat_images, image_keys)
            grid = torch.tensor([f.grid for f in features], dtype=torch.long)
            encoded = encoder_outputs(features)
        else:
            out = processor.image_processor(images=flat_images, return_tensors="pt")
            pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
        k = 0
        for r, imgs in enumerate(images):
            grids_per_row[r] = grid[k : k + len(imgs)].tolist()
            k += len(imgs)

    lengths = [len(s) for s in sequences]
    B, L = len(sequences), max(lengths)
    input_ids = torch.full((B, L), pad, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    position_ids = torch.zeros((4, B, L), dtype=torch.long)
    next_position = torch.zeros(B, dtype=torch.long)
    for r, seq in enumerate(sequences):
        n = len(seq)
        sl = slice(0, n) if padding_side == "right" else slice(L - n, L)
        input_ids[r, sl] = torch.as_tensor(list(seq), dtype=torch.long)
        attention_mask[r, sl] = 1
        pos, nxt = mrope_positions(seq, grids_per_row[r], image_token_id, processor.merge_size)
        position_ids[0, r, sl] = torch.arange(n)
        position_ids[1:, r, sl] = pos
        next_position[r] = nxt
    return ModelBatch(
        input_ids, attention_mask, position_ids, pixel_values, grid, next_position, lengths,
        encoded,
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The ``Qwen3VLForConditionalGeneration`` inside a PEFT wrapper (LoRA layers are
    injected in place, so calling the inner model still applies the active adapters)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def model_inputs(batch: ModelBatch) -> dict:
    """The keyword arguments that put a collated batch into Qwen3-VL (or its inner
    ``.model``); the one place that maps a ModelBatch onto the model's inputs."""
    inputs = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
    }
    if batch.encoder_outputs is not None:
        inputs["mm_encoder_outputs"] = batch.encoder_outputs
    elif batch.pixel_values is not None:
        inputs["pixel_values"] = batch.pixel_values
        inputs["image_grid_thw"] = batch.image_grid_thw
    return inputs


def forward(model: torch.nn.Module, batch: ModelBatch, **kwargs):  # noqa: ANN201
    """The model's output for a collated batch (kwargs: ``use_cache``, ``logits_to_keep``,
    ...); given the inner decoder (``unwrap(model).model``), its hidden states. The one
    way a batch goes into the model."""
    return unwrap(model)(**model_inputs(batch), **{"use_cache": False, **kwargs})


def forward_logits(model: torch.nn.Module, batch: ModelBatch, **kwargs) -> torch.Tensor:
    """Logits ``(B, L, V)`` of a collated batch (no cache)."""
    return forward(model, batch, **kwargs).logits


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log_softmax(logits / T)[target]`` in float32; T == 0 scores at T = 1 (greedy).

    ``banned`` token ids are outside the action space: the softmax runs over the other
    tokens. A target that is itself banned (a vision placeholder in the prompt, never a
    sampled token) is scored over the full vocabulary, so every value stays finite."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if banned is None or not banned.numel():
        return picked - torch.logsumexp(logits, dim=-1)
    banned = banned.to(logits.device)
    allowed = logits.index_fill(-1, banned, float("-inf"))
    restricted = picked - torch.logsumexp(allowed, dim=-1)
    full = picked - torch.logsumexp(logits, dim=-1)
    return torch.where(torch.isin(targets, banned), full, restricted)


def sequence_logprobs(
    model: torch.nn.Module,
    processor: PolicyProcessor,
    token_ids: Sequence[int] | Sequence[Sequence[int]],
    images: Sequence[ImageLike] | Sequence[Sequence[ImageLike]],
    temperature: float = 1.0,
    *,
    score_mask: torch.Tensor | None = None,
    vision: VisionEncoder | None = None,
) -> torch.Tensor:
    """Per-token logprobs of whole sequences (all turns, all images) in one forward pass.

    ``out[..., t] = log p(token_t | tokens_<t)`` under ``log_softmax(logits / T)``
    (T == 0 -> T = 1) over the action space (vision placeholders excluded, as the engines
    sample), aligned with ``token_ids``; position 0 and padding are 0. A single
    sequence (list of ints + list of images) gives shape ``(L,)``; a batch (list of lists)
    gives ``(B, L_max)``, right-padded. Differentiable: the learner multiplies by its loss
    mask and back-propagates. Runs in the model's current mode (call ``model.eval()`` to
    disable dropout; Qwen3-VL has none by default).

    ``score_mask`` (``(B, L_max)``, aligned like the output) limits the work to the
    positions the caller reads, e.g. the learner's loss tokens: the vocabulary projection
    and softmax run there only (a frame_only row scores 2 of ~65 positions) and every
    other position is 0. ``vision``: take image features from that (cached, frozen)
    encoder instead of running the tower; images may then be PNG bytes.
    """
    single = len(token_ids) > 0 and isinstance(token_ids[0], int)
    seqs = [list(token_ids)] if single else [list(s) for s in token_ids]
    imgs = [list(images)] if single else [list(i) for i in images]
    device = next(model.parameters()).device
    batch = collate(processor, seqs, imgs, padding_side="right", vision=vision).to(device)
    banned = torch.tensor(vision_token_ids(processor), dtype=torch.long)
    targets = batch.input_ids[:, 1:]
    if score_mask is None:
        logits = forward_logits(model, batch)
        lp = token_logprobs(logits[:, :-1], targets, temperature, banned)
        lp = lp * batch.attention_mask[:, 1:]
    else:
        inner = unwrap(model)
        hidden = inner.model(**model_inputs(batch), use_cache=False).last_hidden_state
        wanted = (score_mask.to(device)[:, 1:] > 0) & (batch.attention_mask[:, 1:] > 0)
        logits = inner.lm_head(hidden[:, :-1][wanted])
        picked = token_logprobs(logits, targets[wanted], temperature, banned)
        lp = hidden.new_zeros(targets.shape, dtype=picked.dtype)
        lp = lp.masked_scatter(wanted, picked)
    out = torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1)
    return out[0] if single else out
