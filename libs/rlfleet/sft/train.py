"""Supervised warm start: full-weight SFT of the tiny policy on oracle maze states.

The analog of the VisGym SFT checkpoint the published GRPO run starts from. Every weight
of the base (vision tower, merger, language model) is trained with AdamW on
:mod:`rlfleet.sft.data` examples; the loss is the token-mean cross entropy on the target
tokens (the action token and ``<|im_end|>``), never on the prompt text, plus optionally
(``agent_aux``) a legal-move loss at the agent cell's image token, and optionally
(``qk_gain``) sharper initial attention. Without those two, SFT of the tiny base sits at
a wall-blind "head for the target" policy (~65% action accuracy, 0-15% solved) for at
least 1500 steps; with them it reaches 45-65% solved in 800-1500 steps (see
warm-starts/tiny-sft/README.md for the measurements).

Deterministic on the CPU: the data stream comes from a numpy generator seeded with
``seed``, the learning rate is a linear warm-up then constant (so a run stopped at step N
has the same weights as a longer run's step-N snapshot), and evaluation draws no random
numbers. The output is an ordinary HF directory (float32 safetensors + the base's
tokenizer/processor files) that ``load_policy`` and the rollout replica's ``--model``
load like the base.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rlfleet import defaults
from rlfleet.maze import EVAL_SEEDS, HELDOUT_SEEDS
from rlfleet.policy import ChatCodec, TinySpec, collate, ensure_tiny_model, load_policy
from rlfleet.policy.logprobs import ModelBatch, forward, unwrap
from rlfleet.sft.data import DataMix, EncodedExample, encode_example, example_stream
from rlfleet.sft.evaluate import evaluate_greedy

# Files of a model directory that training rewrites; everything else (tokenizer,
# processor, chat template) is copied from the base unchanged.
_MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors",
                "model.safetensors.index.json", "rlfleet_tiny.json", "sft_summary.json",
                "sft_curve.jsonl", "README.md"}


SCHEDULES = ("constant", "cosine", "linear")


@dataclass
class SFTConfig:
    out: Path
    size: int = 7
    steps: int | None = None
    minutes: float | None = None  # training time budget (evaluation not counted)
    lr: float = 5e-4
    batch: int = 64
    seed: int = 0
    base: Path | None = None  # default: the tiny base from ensure_tiny_model(cache)
    layers: int | None = None  # a fresh base's language-model depth (default: TinySpec's)
    warmup: int = 20
    schedule: str = "constant"  # after warm-up: "constant", "cosine" or "linear" decay
    decay_steps: int | None = None  # the decay ends here (default: steps)
    min_lr_ratio: float = 0.1  # lr at the end of the decay, as a share of lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    qk_gain: float = 1.0  # start the LM's q/k RMSNorm gains here (a fresh base has 1.0)
    agent_aux: float = 0.0  # weight of the legal-move loss at the agent's image token
    feedback_aux: float = 0.0  # weight of the last-move probe loss at the action position
    short_steps: int = 0  # curriculum: the first N steps use the frame_only wording
    # the prompt format trained and evaluated (rlfleet.policy.contexts): "last_frame"
    # (instruction + status + frame) or "frame_only" (feedback + frame); the rollout service
    # must be asked for the same context
    context: str = "last_frame"
    log_every: int = 10
    eval_every: int = 0  # steps between greedy evals on the 64 eval mazes (0: end only)
    snapshots: bool = False  # save the model at every in-training eval (out/snapshots/)
    final_eval: bool = True
    heldout: bool = True  # also evaluate the 256 held-out mazes at the end
    max_turns: int | None = None
    mix: DataMix = field(default_factory=DataMix)
    command: str = ""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.steps is None and self.minutes is None:
            raise ValueError("give --steps or --minutes (or both: whichever ends first)")
        if self.steps is not None and self.steps < 0:
            raise ValueError("steps must be >= 0")
        if self.batch < 1 or self.lr <= 0:
            raise ValueError("batch must be >= 1 and lr > 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule != "constant" and (self.decay_steps or self.steps) is None:
            raise ValueError("a decaying schedule needs --decay-steps or --steps")
        if self.layers is not None and (self.layers < 1 or self.base is not None):
            raise ValueError("--layers (>= 1) sizes a fresh tiny base; it cannot reshape --base")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based): linear warm-up, then the
        schedule. It depends on ``decay_steps`` but not on when the run stops, so a run
        stopped at step N equals the step-N snapshot of a longer run with the same decay."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.schedule == "constant":
            return self.lr
        total = self.decay_steps or self.steps
        frac = min(1.0, (step - self.warmup) / max(1, total - self.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * frac)) if self.schedule == "cosine" else 1 - frac
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * shape)


def save_policy(model: torch.nn.Module, base_dir: Path, out_dir: Path) -> Path:
    """Write ``model`` (float32 safetensors) with ``base_dir``'s tokenizer/processor files
    to ``out_dir``. Built in a temporary sibling first: a new directory is renamed into
    place whole; into an existing one each file is moved with an atomic rename, and other
    files there (README.md, the curve, snapshots/) are kept."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for f in Path(base_dir).iterdir():
            if f.is_file() and f.name not in _MODEL_FILES:
                shutil.copy2(f, tmp / f.name)
        model.save_pretrained(tmp, safe_serialization=True)
        # mkdtemp and the safetensors writer make owner-only modes; a model dir is shared
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if out_dir.exists() and any(out_dir.iterdir()):
            for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
                os.replace(f, out_dir / f.name)  # config.json last: it marks a model dir
        else:
            if out_dir.exists():
                out_dir.rmdir()
            os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def sharpen_attention(model: torch.nn.Module, gain: float) -> int:
    """Set the language model's q/k RMSNorm gains to ``gain`` where they are still at the
    fresh-base value 1.0; returns how many gain vectors were set.

    Why: Qwen3 normalises every query and key per head, so an attention logit is at most
    about ``gain**2 * sqrt(head_dim)`` (5.7 at gain 1 on the tiny model), and at lr 1e-3
    the gains move by ~lr per step. Following the maze needs the action token to attend
    sharply to one image token (the agent's). Measured on a probe (is there a wall right
    of the agent?): with the agent-token loss, gain 3 let the action token read the answer
    within 300 steps, gain 1 did not; on the full task the agent-token loss alone got
    there too (57.8% vs 45.3% at step 1000, within the noise), and gain 3 without it did
    not help (7.8% at step 1000). The shipped recipe uses both.
    """
    if gain == 1.0:
        return 0
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")) and bool((p == 1.0).all()):
                p.fill_(gain)
                n += 1
    return n


@dataclass
class Batch:
    """A collated training batch."""

    inputs: ModelBatch
    labels: torch.Tensor  # (B, K): targets of the last K positions, -100 = none
    agent_pos: torch.Tensor  # (B,): the agent's image token in the padded row (-1: none)
    legal: torch.Tensor  # (B, V) float: uniform over the first tokens of the legal moves
    last_move: torch.Tensor  # (B,): the move the feedback reports, 0-3 (-100: none)


def make_batch(processor, examples: list[EncodedExample]) -> Batch:
    """Left-padded inputs (prompt + all target tokens but the last), so every target sits
    at the end of its row."""
    k = max(len(e.target_ids) for e in examples)
    seqs = [e.prompt_ids + e.target_ids[:-1] for e in examples]
    inputs = collate(processor, seqs, [[e.image] for e in examples], padding_side="left")
    width = inputs.input_ids.shape[1]
    labels = torch.full((len(examples), k), -100, dtype=torch.long)
    agent_pos = torch.full((len(examples),), -1, dtype=torch.long)
    legal = torch.zeros((len(examples), len(processor.tokenizer)))
    last_move = torch.tensor([e.last_move if e.last_move >= 0 else -100 for e in examples],
                             dtype=torch.long)
    for r, (e, seq) in enumerate(zip(examples, seqs, strict=True)):
        labels[r, k - len(e.target_ids):] = torch.as_tensor(e.target_ids)
        if e.agent_token >= 0 and e.open_ids:
            agent_pos[r] = width - len(seq) + e.agent_token
            legal[r, e.open_ids] = 1.0 / len(e.open_ids)
    return Batch(inputs, labels, agent_pos, legal, last_move)


def sft_loss(model: torch.nn.Module, batch: Batch, agent_aux: float = 0.0,
             feedback_aux: float = 0.0, feedback_probe: torch.nn.Module | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss and batch metrics.

    Main term: token-mean cross entropy on the target tokens (the action and
    ``<|im_end|>``); the prompt carries no loss. With ``agent_aux > 0``, plus that weight
    times the cross entropy, at the agent cell's IMAGE token, against a uniform
    distribution over the legal moves (those not into a wall). That position's output is
    never sampled (it sits inside the prompt), so the served behaviour is still only the
    action token's; the extra term gives the vision tower a direct reason to encode the
    walls around the agent in the agent's own token, which the action token then learns
    to read (without it, SFT sits for thousands of steps at a wall-blind policy).

    With ``feedback_aux > 0``, plus that weight times the cross entropy of
    ``feedback_probe`` (a linear map of the final hidden state to the 4 moves, used in
    training only and never saved) at the position that predicts the action, against the
    move the feedback sentence reports ("Moved right." -> right). The oracle's answer never
    depends on that sentence, so plain SFT learns to ignore it, and with the sharp
    attention of ``qk_gain`` the action position's attention to it dies: RL can then no
    longer discover a policy that uses it (not undoing the last move breaks the two-cell
    loops of a frame-only policy). The probe keeps the last move readable where the action
    is chosen, without saying what to do with it; the served head never sees the term.
    """
    inner = unwrap(model)
    # The decoder's hidden states, not the logits: the LM head runs only where the loss
    # looks (the label positions and the agent's token), never over the whole prompt.
    hidden = forward(inner.model, batch.inputs).last_hidden_state
    labels = batch.labels
    logits = inner.lm_head(hidden[:, -labels.shape[1]:]).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100)
    rows = torch.arange(labels.shape[0])
    first = (labels != -100).int().argmax(1)  # the first labelled position: the action
    action_logits = logits[rows, first]
    metrics = {
        "ce": loss.item(),
        "acc": (action_logits.argmax(-1) == labels[rows, first]).float().mean().item(),
    }
    has = batch.agent_pos >= 0
    if agent_aux > 0 and bool(has.any()):
        at = inner.lm_head(hidden[rows[has], batch.agent_pos[has]]).float()
        aux = -(batch.legal[has] * torch.log_softmax(at, -1)).sum(-1).mean()
        loss = loss + agent_aux * aux
        metrics["aux"] = aux.item()
    told = batch.last_move != -100
    if feedback_aux > 0 and feedback_probe is not None and bool(told.any()):
        at_action = hidden[:, -labels.shape[1]:][rows, first]
        fb = F.cross_entropy(feedback_probe(at_action[told]).float(), batch.last_move[told])
        loss = loss + feedback_aux * fb
        metrics["fb_aux"] = fb.item()
    return loss, metrics


def _eval_line(tag: str, r: dict) -> str:
    return (f"{tag}: solved {r['solved']}/{r['n']} = {100 * r['solve_rate']:.1f}% "
            f"± {100 * r['solve_rate_stderr']:.1f}  mean turns {r['mean_turns']:.1f}  "
            f"wrong stops {r['wrong_stops']}  timeouts {r['truncated']}  ({r['seconds']:.0f}s)")


def _brief(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "solved_seeds"}


def train_sft(cfg: SFTConfig, log: Callable[[str], None] = print) -> dict:
    """Run SFT as configured; writes the model and ``sft_summary.json`` to ``cfg.out``."""
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    spec = TinySpec(num_layers=cfg.layers) if cfg.layers else None
    base = Path(cfg.base) if cfg.base else ensure_tiny_model(defaults.cache_dir(), spec=spec)
    model, processor = load_policy(base, dtype=torch.float32)
    codec = ChatCodec(processor)
    sharpened = sharpen_attention(model, cfg.qk_gain)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    # the last-move probe (feedback_aux): trained beside the model, never saved
    probe = (torch.nn.Linear(model.config.text_config.hidden_size, 4)
             if cfg.feedback_aux > 0 else None)
    params = [*model.parameters(), *(probe.parameters() if probe is not None else ())]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    stream = example_stream(cfg.size, rng, cfg.mix, max_turns=cfg.max_turns)
    cfg.out.mkdir(parents=True, exist_ok=True)
    curve_path = cfg.out / "sft_curve.jsonl"
    curve_path.write_text("")
    log(f"sft: base {base} ({n_params / 1e6:.2f} M params), {cfg.size}x{cfg.size} mazes, "
        f"lr {cfg.lr}, batch {cfg.batch}, seed {cfg.seed}, steps {cfg.steps}, "
        f"minutes {cfg.minutes}, mix {asdict(cfg.mix)}, agent aux {cfg.agent_aux}, "
        f"feedback aux {cfg.feedback_aux}, "
        f"q/k gain {cfg.qk_gain} ({sharpened} gain vectors set)")

    curve: list[dict] = []
    train_s = 0.0
    step = 0
    examples_seen = 0
    window: dict[str, float] = {}
    win_n = 0
    win_t = 0.0

    def in_training_eval() -> None:
        r = evaluate_greedy(model, processor, EVAL_SEEDS, cfg.size, cfg.max_turns,
                            context=cfg.context)
        point = {"step": step, "train_minutes": round(train_s / 60, 3),
                 "examples": examples_seen, **_brief(r)}
        curve.append(point)
        with curve_path.open("a") as fh:
            fh.write(json.dumps(point) + "\n")
        log(f"  step {step} ({train_s / 60:.2f} train min) " + _eval_line("eval64", r))
        if cfg.snapshots:
            save_policy(model, base, cfg.out / "snapshots" / f"step-{step:06d}")

    while True:
        if cfg.steps is not None and step >= cfg.steps:
            break
        if cfg.minutes is not None and train_s >= cfg.minutes * 60:
            break
        t0 = time.perf_counter()
        # curriculum: the first short_steps steps prompt with the frame_only wording
        context = "frame_only" if step < cfg.short_steps else cfg.context
        examples = [encode_example(codec, next(stream), context) for _ in range(cfg.batch)]
        batch = make_batch(processor, examples)
        lr = cfg.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, metrics = sft_loss(model, batch, cfg.agent_aux, cfg.feedback_aux, probe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(
            params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        opt.step()
        dt = time.perf_counter() - t0
        train_s += dt
        step += 1
        examples_seen += cfg.batch
        for key, value in {"loss": loss.item(), **metrics, "gnorm": float(gnorm)}.items():
            window[key] = window.get(key, 0.0) + value
        win_n += 1
        win_t += dt
        if step % cfg.log_every == 0:
            m = {key: value / win_n for key, value in window.items()}
            aux = f"  agent aux {m['aux']:.3f}" if "aux" in m else ""
            aux += f"  feedback aux {m['fb_aux']:.3f}" if "fb_aux" in m else ""
            log(f"step {step:5d}  loss {m['loss']:.4f}  target ce {m['ce']:.4f}"
                f"  action acc {m['acc']:.3f}{aux}  grad norm {m['gnorm']:.2f}  lr {lr:.2e}"
                f"  {cfg.batch * win_n / win_t:.1f} ex/s"
                f"  train {train_s / 60:.2f} min")
            window, win_n, win_t = {}, 0, 0.0
        if cfg.eval_every and step % cfg.eval_every == 0:
            in_training_eval()

    model.eval()
    save_policy(model, base, cfg.out)
    summary: dict = {
        "command": cfg.command,
        "seed": cfg.seed,
        "context": cfg.context,  # serve the checkpoint with this rollout context
        "size": cfg.size,
        "steps": step,
        "examples": examples_seen,
        "train_seconds": round(train_s, 1),
        "config": {k: (str(v) if isinstance(v, Path) else v)
                   for k, v in asdict(cfg).items() if k != "command"},
        "base": str(base),
        "params": n_params,
        "torch_threads": torch.get_num_threads(),
        "curve": curve,
    }
    tiny_meta = base / "rlfleet_tiny.json"
    if tiny_meta.is_file():
        summary["base_build"] = json.loads(tiny_meta.read_text())
    if cfg.final_eval:
        r64 = evaluate_greedy(model, processor, EVAL_SEEDS, cfg.size, cfg.max_turns,
                            context=cfg.context)
        log(_eval_line("final eval (64 eval mazes, seeds 0..63)", r64))
        summary["eval64"] = r64
        if cfg.heldout:
            r256 = evaluate_greedy(model, processor, HELDOUT_SEEDS, cfg.size, cfg.max_turns,
                                   context=cfg.context)
            log(_eval_line("final eval (256 held-out mazes, seeds 64..319)", r256))
            summary["heldout256"] = r256
    summary["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    (cfg.out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"sft: saved {cfg.out} after {step} steps, {train_s / 60:.2f} train min, "
        f"{summary['wall_seconds'] / 60:.2f} wall min")
    return summary
