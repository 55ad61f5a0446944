"""Micro-batching: padding, pass-through, and gradient accumulation == one big batch."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from rlfleet.grpo import (
    GRPOConfig,
    TrainSample,
    grpo_loss,
    make_micro_batches,
    prepare_batch,
)

VOCAB = 7


def bigram_logprobs(table: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0):
    """A model-free 'causal LM': logits of the next token are a row of ``table``; the
    logprobs aligned as rlfleet.grpo.step documents (position 0 is 0)."""
    logits = table[input_ids][:, :-1] / temperature
    picked = logits.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    picked = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def make_samples(seed: int = 0) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    behaviour = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)
    samples = []
    for i in range(7):
        n = 3 + (i * 5) % 8  # varied lengths so padding differs between micro-batches
        ids = torch.randint(0, VOCAB, (1, n), generator=g)
        mask = [0.0, 0.0] + [1.0] * (n - 2)
        if n > 5:
            mask[3] = 0.0  # an observation token inside a multi-turn episode
        logp = bigram_logprobs(behaviour, ids)[0]
        samples.append(
            TrainSample(
                input_ids=ids[0].numpy(),
                loss_mask=mask,
                logprobs=(logp * torch.tensor(mask, dtype=torch.float64)).numpy(),
                reward=float(i % 3 == 0) + 0.1 * (i % 2),
                group_id=i // 4,
                adapter_version=3,
                extras={"image": f"img{i}"},
            )
        )
    return samples


def test_padding_and_pass_through() -> None:
    kept, _ = prepare_batch(make_samples(), current_version=3, cfg=GRPOConfig())
    mbs = make_micro_batches(kept, 3, pad_token_id=99)
    assert [mb.size for mb in mbs] == [3, 3, 1]
    assert [i for mb in mbs for i in mb.indices] == list(range(7))
    assert [e["image"] for mb in mbs for e in mb.extras] == [s.extras["image"] for s in kept]
    for mb in mbs:
        assert mb.total_loss_tokens == sum(s.num_loss_tokens for s in kept)
        assert mb.total_sequences == 7
        for row, idx in enumerate(mb.indices):
            s, n = kept[idx], kept[idx].num_tokens
            assert mb.input_ids[row, :n].tolist() == s.input_ids.tolist()
            assert (mb.input_ids[row, n:] == 99).all()
            assert mb.attention_mask[row].tolist() == [1] * n + [0] * (mb.input_ids.shape[1] - n)
            assert (mb.loss_mask[row, n:] == 0).all()
            assert mb.advantages[row].item() == pytest.approx(s.advantage)
    assert make_micro_batches([], 4) == []


def test_unprepared_samples_and_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="no advantage"):
        make_micro_batches(make_samples(), 2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        make_micro_batches([], 0)


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_accumulated_gradient_equals_full_batch(reduction: str, micro: int) -> None:
    cfg = GRPOConfig(
        loss_reduction=reduction, kl_coef=0.05, clip_low=0.1, clip_high=0.15, temperature=0.8
    )
    kept, _ = prepare_batch(make_samples(), current_version=3, cfg=cfg)
    g = torch.Generator().manual_seed(1)
    ref_table = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)
    init = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)

    def grad_of(micro_batch_size: int) -> tuple[torch.Tensor, float, dict]:
        table = init.clone().requires_grad_()
        total, last = 0.0, {}
        for mb in make_micro_batches(kept, micro_batch_size):
            logp = bigram_logprobs(table, mb.input_ids, cfg.temperature)
            ref = bigram_logprobs(ref_table, mb.input_ids, cfg.temperature)
            loss, last = grpo_loss(logp, mb, cfg, logp_ref=ref)
            loss.backward()  # no extra scaling: the micro-batch carries the step's counts
            total += loss.item()
        return table.grad, total, last

    full_grad, full_loss, full_stats = grad_of(len(kept))
    acc_grad, acc_loss, _ = grad_of(micro)
    assert full_grad.abs().sum() > 0 and full_stats["clip_frac"] > 0  # a non-trivial case
    torch.testing.assert_close(acc_grad, full_grad, rtol=1e-10, atol=1e-12)
    assert acc_loss == pytest.approx(full_loss, rel=1e-10)

    # And the full-batch loss is the textbook formula for this reduction.
    table = init.clone()
    terms = []
    for s in kept:
        ids = torch.from_numpy(s.input_ids)[None]
        logp = bigram_logprobs(table, ids, cfg.temperature)[0]
        ref = bigram_logprobs(ref_table, ids, cfg.temperature)[0]
        per_tok = []
        for t in range(1, s.num_tokens):
            if s.loss_mask[t] == 0:
                continue
            r = math.exp(logp[t].item() - s.logprobs[t])
            a = s.advantage
            pg = max(-a * r, -a * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high))
            if a < 0:
                pg = min(pg, -a * cfg.dual_clip)
            lr = ref[t].item() - logp[t].item()
            per_tok.append(pg + cfg.kl_coef * (math.exp(lr) - lr - 1))
        terms.append(per_tok)
    if reduction == "token_mean":
        expected = sum(map(sum, terms)) / sum(map(len, terms))
    else:
        expected = sum(sum(x) / len(x) for x in terms) / len(terms)
    assert full_loss == pytest.approx(expected, rel=1e-5)  # samples hold float32 logprobs


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
def test_duplicate_rows_run_once_and_give_the_same_gradient(reduction: str) -> None:
    """Rows that are the same sequence share one forward row; each keeps its own
    advantage and recorded logprobs, so the loss and gradient equal running every row."""
    cfg = GRPOConfig(loss_reduction=reduction, clip_low=0.1, clip_high=0.15)
    base = make_samples()
    # rows 7..11 repeat rows 0, 0, 2, 5, 2 (other rewards and groups: other advantages)
    dups = [replace(base[i], reward=float(j % 2), group_id=10 + j // 3)
            for j, i in enumerate([0, 0, 2, 5, 2])]
    kept, _ = prepare_batch(base + dups, current_version=3, cfg=cfg)
    g = torch.Generator().manual_seed(2)
    init = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64)

    def key(s: TrainSample) -> bytes:
        return s.input_ids.tobytes() + s.loss_mask.tobytes()

    def grad_of(dedup: bool) -> tuple[torch.Tensor, float, int]:
        table = init.clone().requires_grad_()
        total, forwards = 0.0, 0
        for mb in make_micro_batches(kept, 3, dedup_key=key if dedup else None):
            rows = mb.input_ids[list(mb.forward_rows)]
            forwards += rows.shape[0]
            logp = bigram_logprobs(table, rows)[mb.inverse]
            loss, _ = grpo_loss(logp, mb, cfg)
            loss.backward()
            total += loss.item()
        return table.grad, total, forwards

    plain_grad, plain_loss, plain_forwards = grad_of(False)
    dedup_grad, dedup_loss, dedup_forwards = grad_of(True)
    assert plain_forwards == 12 and dedup_forwards == 7  # every row once vs distinct rows
    torch.testing.assert_close(dedup_grad, plain_grad, rtol=1e-10, atol=1e-12)
    assert dedup_loss == pytest.approx(plain_loss, rel=1e-10)
    mbs = make_micro_batches(kept, 3, dedup_key=key)
    assert sorted(i for mb in mbs for i in mb.indices) == list(range(12))  # each row once
    assert all(mb.num_forward <= 3 for mb in mbs)


def test_sequence_mean_averages_over_trajectories_not_rows() -> None:
    """A trajectory trained as several rows counts once: hand-computed, two trajectories,
    one of 3 rows (1 loss token each) and one of 1 row (2 loss tokens), ratio 1."""
    cfg = GRPOConfig(loss_reduction="sequence_mean")

    def row(key: str, n_loss: int, seq_tokens: int, adv: float) -> TrainSample:
        ids = np.arange(1 + n_loss)
        return TrainSample(input_ids=ids, loss_mask=[0] + [1] * n_loss,
                           logprobs=[0.0] + [-0.5] * n_loss, reward=0.0, group_id="g",
                           adapter_version=0, advantage=adv, sequence_key=key,
                           sequence_loss_tokens=seq_tokens)

    rows = [row("a", 1, 3, 1.0), row("a", 1, 3, 1.0), row("a", 1, 3, 1.0),
            row("b", 2, 2, -2.0)]
    (mb,) = make_micro_batches(rows, 8)
    assert mb.total_sequences == 2
    logp = mb.old_logprobs.clone()  # ratio exactly 1: per-token loss is -A
    loss, _ = grpo_loss(logp, mb, cfg)
    # trajectory a: mean over its 3 tokens of -1 = -1; b: mean of +2, +2 = 2; mean = 0.5
    assert loss.item() == pytest.approx(0.5)
    # counted per row it would be (-1 -1 -1 + 2) / 4 = -0.25: the old, wrong weighting
