"""The policy being trained: the starting model with LoRA on its language model, an
optimizer and schedule, and one GRPO update over a step's rows.

Data parallelism: with a process group initialised, each worker computes the gradients of
its share of the micro-batches and the LoRA gradients are summed with all-reduce (in flat
buckets) before the optimizer step. Losses use whole-step denominators, so the sum over
every worker's micro-batches is exactly the one-worker gradient (the same update, up to
float rounding).

The weights load in the config's dtype (bfloat16 on GPUs); PEFT keeps the LoRA weights,
their gradients and the optimizer state in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet.grpo import GRPOConfig, MicroBatch, TrainSample, make_micro_batches
from rlfleet.learner_config import LearnerConfig
from rlfleet.policy import load_policy
from rlfleet.policy.lora import adapter_files, add_lora, lora_config
from rlfleet.policy.vision import VisionEncoder, vision_is_frozen
from rlfleet_learner import distributed
from rlfleet_learner.checkpointing import enable_activation_checkpointing
from rlfleet_learner.samples import row_key
from rlfleet_learner.update import backward_micro_batch, unpadded_rows

# The frames of one step (a few hundred distinct ones on the tiny profile); older steps'
# mazes never come back, so the cache only needs to hold a step.
VISION_CACHE_BYTES = 64 << 20


@dataclass
class LRFactor:
    """The learning rate's multiplier after `step` steps: a linear warm-up over `warmup`
    steps, then 1 or (`cosine`) a cosine decay that reaches 0 at `horizon` steps. The
    horizon is the run's steps, or the steps its time budget planned (`set_horizon`)."""

    warmup: int
    horizon: int
    cosine: bool

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.cosine and self.horizon > self.warmup:
            progress = (step - self.warmup) / max(1, self.horizon - self.warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0


@dataclass
class StepResult:
    stats: dict[str, float]
    grad_norm: float
    rows: int = 0  # training rows of the step
    forward_rows: int = 0  # distinct sequences the model ran on


class PolicyTrainer:
    def __init__(self, cfg: LearnerConfig, model_dir: str,
                 device: torch.device | str | None = None) -> None:
        self.cfg = cfg
        self.grpo: GRPOConfig = cfg.grpo
        if cfg.model.torch_threads:
            torch.set_num_threads(cfg.model.torch_threads)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(cfg.seed)
        model, self.processor = load_policy(
            model_dir, device=device if device is not None else cfg.model.device,
            dtype=getattr(torch, cfg.model.torch_dtype()))
        self.model = add_lora(model, lora_config(cfg.model.lora_rank, cfg.model.lora_alpha,
                                                 modules=cfg.model.lora_modules))
        if cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        self.bucket_bytes = int(cfg.ray.bucket_mb * (1 << 20))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # LoRA leaves the vision tower frozen: its outputs are computed once per frame.
        self.vision = (VisionEncoder(self.model, self.processor, max_bytes=VISION_CACHE_BYTES)
                       if vision_is_frozen(self.model) else None)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas,
                                           weight_decay=o.weight_decay)
        self.lr_factor = LRFactor(o.warmup_steps, cfg.steps, o.schedule == "cosine")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        self.pad_id = int(self.processor.tokenizer.pad_token_id or 0)

    def set_horizon(self, steps: int) -> None:
        """The schedule decays to 0 at `steps` from now on (the next step's rate is the
        first to follow it: the current one was set by the last step)."""
        self.lr_factor.horizon = steps

    # -- one update ------------------------------------------------------------------

    def micro_batches(self, rows: Sequence[TrainSample]) -> list[MicroBatch]:
        return micro_batches(rows, self.grpo.micro_batch_size, self.pad_id)

    def accumulate(self, batches: Sequence[MicroBatch]) -> dict[str, float]:
        """Backward over `batches` (gradients accumulate); returns summed loss stats."""
        self.model.train()
        totals: dict[str, float] = {}
        for mb in batches:
            stats = backward_micro_batch(self.model, self.processor, mb, self.grpo,
                                         self.vision)
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value) * (
                    1.0 if key in _ADDITIVE else mb.size)
        return totals

    def bare_seconds(self, batches: Sequence[MicroBatch], forward_batch: int
                     ) -> tuple[float, float]:
        """The limits the update and the rollout are measured against, on these rows:
        seconds of a bare forward+backward (every row, the vision tower run, logits at
        every position) and of a bare batched forward (what a generation prefill does,
        ``forward_batch`` rows at a time). Inputs are prepared outside the timing;
        gradients are thrown away."""
        import time

        from rlfleet.policy.logprobs import collate, forward
        from rlfleet.policy.vision import as_image

        self.model.train()
        rows = [(seq, [as_image(i) for i in mb.extras[r]["images"]])
                for mb in batches
                for r, seq in zip(range(mb.size), unpadded_rows(mb, range(mb.size)),
                                  strict=True)]
        device = next(self.model.parameters()).device

        def batched(size: int) -> list:
            return [collate(self.processor, [s for s, _ in rows[i:i + size]],
                            [im for _, im in rows[i:i + size]]).to(device)
                    for i in range(0, len(rows), size)]

        train = batched(self.grpo.micro_batch_size)
        start = time.perf_counter()
        for batch in train:
            forward(self.model, batch).logits.float().sum().backward()
        fwd_bwd = time.perf_counter() - start
        self.optimizer.zero_grad(set_to_none=True)
        infer = batched(forward_batch)
        start = time.perf_counter()
        with torch.inference_mode():
            for batch in infer:
                forward(self.model, batch, logits_to_keep=1)
        return fwd_bwd, time.perf_counter() - start

    def apply(self, advance_schedule: bool = True) -> float:
        """All-reduces gradients across workers (if any), clips, steps; the grad norm.
        The lr schedule moves once per GRPO step (``advance_schedule`` on its last
        update), however many updates the step makes."""
        if distributed.in_group():
            distributed.sum_gradients(self.params, self.bucket_bytes)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        self.optimizer.step()
        if advance_schedule:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # -- state -----------------------------------------------------------------------

    def adapter_files(self) -> dict[str, bytes]:
        return adapter_files(self.model, self.cfg.model.name)

    def lora_state(self) -> dict[str, torch.Tensor]:
        from peft.utils import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_lora_state(self, state: dict[str, torch.Tensor]) -> None:
        from peft.utils import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"checkpoint adapter has unexpected keys: {unexpected[:3]}")


# Stats that are contributions to step totals (summed), the rest are per-row means.
_ADDITIVE = {"loss", "policy_loss", "kl_loss", "num_loss_tokens", "num_sequences"}


def micro_batches(rows: Sequence[TrainSample], size: int, pad_id: int, *,
                  dedup: bool = True) -> list[MicroBatch]:
    """A step's rows in micro-batches of at most ``size`` distinct sequences."""
    return make_micro_batches(rows, size, pad_token_id=pad_id,
                              dedup_key=row_key if dedup else None)
