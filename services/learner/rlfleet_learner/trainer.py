"""The policy being trained: the starting model with LoRA on its language model, an
optimizer and schedule, and one GRPO update over a step's rows.

Data parallelism: with a process group initialised, each worker computes the gradients of
its share of the micro-batches and the LoRA gradients are summed with all-reduce before
the optimizer step. Losses use whole-step denominators, so the sum over every worker's
micro-batches is exactly the one-worker gradient (the same update, up to float rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlfleet.grpo import GRPOConfig, MicroBatch, TrainSample, grpo_loss, make_micro_batches
from rlfleet.policy import load_policy, sequence_logprobs
from rlfleet.policy.lora import adapter_files, add_lora, lora_config
from rlfleet_learner.config import LearnerConfig


@dataclass
class StepResult:
    stats: dict[str, float]
    grad_norm: float


class PolicyTrainer:
    def __init__(self, cfg: LearnerConfig, model_dir: str) -> None:
        self.cfg = cfg
        self.grpo: GRPOConfig = cfg.grpo_config()
        if cfg.model.torch_threads:
            torch.set_num_threads(cfg.model.torch_threads)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(cfg.seed)
        model, self.processor = load_policy(model_dir, device=cfg.model.device,
                                            dtype=torch.float32)
        self.model = add_lora(model, lora_config(cfg.model.lora_rank, cfg.model.lora_alpha))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas,
                                           weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.pad_id = int(self.processor.tokenizer.pad_token_id or 0)

    def _lr_factor(self, step: int) -> float:
        o = self.cfg.optim
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine" and self.cfg.steps > o.warmup_steps:
            progress = (step - o.warmup_steps) / max(1, self.cfg.steps - o.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    # -- one update ------------------------------------------------------------------

    def micro_batches(self, rows: Sequence[TrainSample]) -> list[MicroBatch]:
        return make_micro_batches(rows, self.grpo.micro_batch_size, pad_token_id=self.pad_id)

    def accumulate(self, batches: Sequence[MicroBatch]) -> dict[str, float]:
        """Backward over `batches` (gradients accumulate); returns summed loss stats."""
        self.model.train()
        totals: dict[str, float] = {}
        for mb in batches:
            seqs = [list(map(int, row)) for row in _rows(mb)]
            images = [e["images"] for e in mb.extras]
            logp = sequence_logprobs(self.model, self.processor, seqs, images,
                                     temperature=self.grpo.temperature)
            logp_ref = None
            if self.grpo.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    logp_ref = sequence_logprobs(self.model, self.processor, seqs, images,
                                                 temperature=self.grpo.temperature)
            loss, stats = grpo_loss(logp, mb, self.grpo, logp_ref)
            loss.backward()
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value) * (
                    1.0 if key in _ADDITIVE else mb.size)
        return totals

    def apply(self) -> float:
        """All-reduces gradients across workers (if any), clips, steps; the grad norm."""
        if dist.is_available() and dist.is_initialized():
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def train_step(self, rows: Sequence[TrainSample]) -> StepResult:
        batches = self.micro_batches(rows)
        totals = self.accumulate(batches)
        n = max(1, sum(mb.size for mb in batches))
        stats = {k: (v if k in _ADDITIVE else v / n) for k, v in totals.items()}
        return StepResult(stats, self.apply())

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


def _rows(mb: MicroBatch) -> list[list[int]]:
    """Unpadded token rows of a micro-batch."""
    lengths = mb.attention_mask.sum(dim=1).tolist()
    return [mb.input_ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
