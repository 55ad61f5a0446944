"""One prepared benchmark for one GPU: Qwen3-VL-8B's architecture with random bf16 weights
(nothing is downloaded), on maze episodes of the production shape (9x9 at 25 px, full
history, up to 15 turns, LoRA r32). It measures

1. generation tokens/s of rlfleet's transformers engine (rlfleet.engines.hf) at batch
   8 / 32 / 64, each request an episode at a turn between 1 and 15;
2. the trainer's forward+backward (rlfleet_learner.update, the learner's own code: policy
   logprobs at the loss tokens, the reference's for the KL term, the GRPO loss) on one
   micro-batch of 4 full 15-turn episodes, with and without activation checkpointing:
   seconds and peak GPU memory;
3. save -> load of the r32 adapter (the learner's adapter files, written and fsynced;
   loaded by PEFT as the engine's hot swap loads a version).

Needs torch, transformers, peft and pydantic (the GPU machine has no vLLM, Ray or Redis,
and no pydantic: bench/gpu/device.sh installs the wheels bench/gpu/prepare.sh fetched).
Writes JSON (``--out``, default $OUT/bench_gpu.json or bench/results/bench_gpu.json)
and prints a table; stops starting new phases once ``--budget-s`` has passed, so it ends
well inside 8 minutes. ``--small``: a scaled-down architecture (bench/gpu/model.py) that
runs on the CPU in well under 2 minutes (what tests/unit/test_bench_gpu.py runs).

    bash bench/gpu/device.sh           # on the GPU machine (after bench/gpu/prepare.sh)
    python bench/gpu/run.py --small    # anywhere
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "libs", ROOT / "services" / "learner"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# The production shape (configs/qwen3-vl-8b-hyperpod.yaml).
SIZE, CELL_PX, TURNS, MICRO_BATCH, LORA_RANK, LORA_ALPHA = 9, 25, 15, 4, 32, 64
GRPO = {"advantage_estimator": "grpo", "policy_loss": "ppo_clip", "clip_low": 0.2,
        "clip_high": 0.2, "dual_clip": 3.0, "kl_coef": 0.001, "kl_estimator": "k3",
        "loss_reduction": "token_mean", "micro_batch_size": MICRO_BATCH, "temperature": 1.0}


def build_policy(small: bool, device: torch.device) -> tuple[torch.nn.Module, Any, dict]:
    """(model with random weights on ``device``: bf16 on a GPU, as the learner and vLLM run
    it; float32 on the CPU, whose bf16 kernels are slow; processor, facts about it)."""
    from transformers import Qwen3VLForConditionalGeneration

    from bench.gpu.model import QWEN3_VL_8B, SMALL, image_processor, qwen3_vl_config
    from rlfleet.policy.loading import PolicyProcessor
    from rlfleet.policy.tokenizer import SPECIAL_TOKENS, build_tokenizer

    arch = SMALL if small else QWEN3_VL_8B
    # rlfleet's locally trained BPE (about 3.7 characters a token on the maze prompts,
    # close to Qwen's); its ids are a subset of the model's 151936.
    tokenizer = build_tokenizer()
    ids = {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS}
    config = qwen3_vl_config(arch, ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    model.eval()
    processor = PolicyProcessor(image_processor=image_processor(arch), tokenizer=tokenizer,
                                chat_template=tokenizer.chat_template)
    params = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return model, processor, {"arch": arch.as_dict(), "params": params,
                              "vision_params": vision, "dtype": str(model.dtype)}


# -- maze episodes -----------------------------------------------------------------------


def episode_messages(seed: int, turns: int) -> list[dict]:
    """A full-history conversation of one 9x9 episode: the first observation (instruction,
    status, frame), then per turn a random move and the next observation (status, frame),
    as the rollout service builds it in context ``full``."""
    from rlfleet.maze.tasks import new_episode
    from rlfleet.policy.contexts import observation_message, turn_text

    ep = new_episode("maze_2d", 10_000_000 + seed, size=SIZE, cell_px=CELL_PX,
                     max_turns=turns)
    rng = random.Random(seed)
    obs = ep.observe()
    messages = [observation_message(obs.png, turn_text("full", obs.instruction, obs.status,
                                                       ""))]
    for _ in range(turns):
        action = f"('move', {rng.randrange(4)})"
        messages.append({"role": "assistant", "content": action})
        outcome = ep.step(action)
        if outcome.done:
            break
        obs = ep.observe()
        messages.append(observation_message(obs.png, turn_text("full", "", obs.status, "")))
    return messages


def prompt_at_turn(codec: Any, messages: list[dict], turn: int) -> Any:
    """The engine's request for ``turn`` (1-based): the history up to that observation."""
    from rlfleet.engines.base import GenerationRequest

    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last = users[min(turn, len(users)) - 1]
    enc = codec.encode_conversation(messages[:last + 1], add_generation_prompt=True)
    return GenerationRequest(prompt_ids=enc.token_ids, images=enc.images, seed=turn)


def training_row(codec: Any, messages: list[dict], index: int) -> Any:
    """The learner's row for a whole episode: one sequence, the moves as loss tokens,
    frames as PNG bytes (as rlfleet_learner.samples builds them)."""
    import base64

    from rlfleet.grpo import TrainSample
    from rlfleet.policy.chat import Transcript

    tok = codec.tokenizer
    t = Transcript.start(codec, messages[:1])
    for m in messages[1:]:
        if m["role"] == "assistant":
            ids = tok(m["content"], add_special_tokens=False)["input_ids"] + [codec.im_end_id]
            t.add_turn(ids, [-1.5] * len(ids))
        else:
            t.add_observation(m)
    pngs = [base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
            for m in messages if m["role"] == "user" for p in m["content"]
            if p.get("type") == "image_url"]
    return TrainSample(
        input_ids=np.asarray(t.token_ids), loss_mask=np.asarray(t.loss_mask, dtype=np.float32),
        logprobs=np.asarray(t.logprobs, dtype=np.float32), reward=float(index % 2),
        group_id="bench", adapter_version=1, advantage=1.0 if index % 2 else -1.0,
        extras={"images": pngs, "image_keys": [hashlib.sha256(p).hexdigest() for p in pngs]})


# -- measurements ------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def bench_generation(peft: Any, processor: Any, conversations: list[list[dict]],
                     batches: list[int], new_tokens: int, device: torch.device) -> list[dict]:
    """Tokens/s of the hf engine at each batch size (the trained adapter active)."""
    from rlfleet.engines.base import SamplingConfig
    from rlfleet.engines.hf import HFEngine

    engine = HFEngine(model=peft.get_base_model(), processor=processor,
                      max_batch_size=max(batches))
    params = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens)
    warm = [prompt_at_turn(engine.codec, conversations[0], 2)]
    engine.generate(warm, SamplingConfig(temperature=1.0, max_new_tokens=2))  # kernels
    out = []
    for batch in batches:
        requests = [prompt_at_turn(engine.codec, conversations[i % len(conversations)],
                                   1 + i % TURNS) for i in range(batch)]
        engine.vision.clear()  # each frame's tower pass counts, as in a fresh turn
        reset_peak(device)
        sync(device)
        start = time.perf_counter()
        result = engine.generate(requests, params)
        sync(device)
        seconds = time.perf_counter() - start
        generated = sum(len(g.token_ids) for g in result)
        prompt = sum(len(r.prompt_ids) for r in requests)
        out.append({"batch": batch, "seconds": round(seconds, 3), "generated": generated,
                    "tokens_per_s": round(generated / seconds, 1),
                    "prompt_tokens": prompt, "max_prompt": max(len(r.prompt_ids)
                                                               for r in requests),
                    "prefill_tokens_per_s": round(prompt / seconds, 1),
                    "peak_gib": peak_gib(device)})
    return out


def bench_train(peft: Any, processor: Any, rows: list, device: torch.device, repeats: int
                ) -> list[dict]:
    """Seconds and peak memory of the trainer's forward+backward on one micro-batch,
    without and then with activation checkpointing."""
    from rlfleet.grpo import GRPOConfig, make_micro_batches
    from rlfleet.policy.vision import VisionEncoder
    from rlfleet_learner.checkpointing import enable_activation_checkpointing
    from rlfleet_learner.update import backward_micro_batch

    grpo = GRPOConfig.model_validate(GRPO)
    pad = int(processor.tokenizer.pad_token_id or 0)
    (mb,) = make_micro_batches(rows, MICRO_BATCH, pad_token_id=pad)
    mb = mb.to(device)
    vision = VisionEncoder(peft, processor)
    params = [p for p in peft.parameters() if p.requires_grad]
    out = []
    peft.train()
    for checkpointing in (False, True):
        if checkpointing:
            enable_activation_checkpointing(peft)
        reset_peak(device)
        times = []
        try:
            for i in range(repeats + 1):  # the first fills the vision cache and warms up
                sync(device)
                start = time.perf_counter()
                backward_micro_batch(peft, processor, mb, grpo, vision)
                sync(device)
                if i:
                    times.append(time.perf_counter() - start)
                for p in params:
                    p.grad = None
            out.append({"checkpointing": checkpointing, "rows": mb.size,
                        "tokens": int(mb.attention_mask.sum()),
                        "loss_tokens": int(mb.loss_mask.sum()),
                        "seconds": round(min(times), 3), "peak_gib": peak_gib(device)})
        except torch.OutOfMemoryError as exc:
            out.append({"checkpointing": checkpointing, "error": f"out of memory: {exc}"[:300]})
            for p in params:
                p.grad = None
    peft.eval()
    return out


def bench_adapter(peft: Any, workdir: Path) -> dict:
    """Save (the learner's adapter files, written and fsynced) and load (PEFT, as the
    engine loads a new version next to the live one) of the r32 adapter."""
    from rlfleet.policy.lora import adapter_files

    sync_dev = next(peft.parameters()).device
    start = time.perf_counter()
    files = adapter_files(peft, "bench")
    target = workdir / "adapter"
    target.mkdir()
    for name, data in files.items():
        with open(target / name, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    saved = time.perf_counter() - start
    sync(sync_dev)
    start = time.perf_counter()
    peft.load_adapter(str(target), adapter_name="loaded", is_trainable=False)
    peft.set_adapter("loaded")
    sync(sync_dev)
    loaded = time.perf_counter() - start
    peft.set_adapter("default")
    peft.delete_adapter("loaded")
    n = sum(p.numel() for n_, p in peft.named_parameters() if "lora_" in n_)
    return {"params": n, "mb": round(len(files["adapter_model.safetensors"]) / 2**20, 1),
            "save_s": round(saved, 3), "load_s": round(loaded, 3)}


def run(small: bool, budget_s: float, out: Path) -> dict[str, Any]:
    import transformers

    from rlfleet.policy.chat import ChatCodec
    from rlfleet.policy.lora import add_lora, lora_config

    began = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() and not small else "cpu")
    doc: dict[str, Any] = {
        "bench": "bench_gpu", "small": small, "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "budget_s": budget_s, "phases": {}}

    def save() -> None:
        doc["elapsed_s"] = round(time.monotonic() - began, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")

    def phase(name: str, fn: Callable[[], Any]) -> None:
        if time.monotonic() - began > budget_s:
            doc["phases"][name] = {"skipped": f"past the {budget_s:g} s budget"}
        else:
            start = time.monotonic()
            doc["phases"][name] = fn()
            doc.setdefault("phase_seconds", {})[name] = round(time.monotonic() - start, 1)
        save()

    start = time.monotonic()
    model, processor, facts = build_policy(small, device)
    peft = add_lora(model, lora_config(LORA_RANK, LORA_ALPHA))
    doc["model"] = {**facts, "build_s": round(time.monotonic() - start, 1)}
    codec = ChatCodec(processor)
    conversations = [episode_messages(seed, TURNS) for seed in range(16)]
    rows = [training_row(codec, conversations[i], i) for i in range(MICRO_BATCH)]
    save()
    batches = [2, 4, 8] if small else [8, 32, 64]
    phase("generation", lambda: bench_generation(peft, processor, conversations, batches,
                                                 4 if small else 32, device))
    phase("train_micro_batch", lambda: bench_train(peft, processor, rows, device,
                                                   repeats=1 if small else 3))
    with tempfile.TemporaryDirectory() as tmp:
        phase("adapter", lambda: bench_adapter(peft, Path(tmp)))
    return doc


def print_table(doc: dict[str, Any]) -> None:
    print(f"\nbench_gpu on {doc['gpu'] or doc['device']} ({'small' if doc['small'] else '8B'}"
          f", {doc['model']['params'] / 1e9:.3f} B params), {doc['elapsed_s']} s")
    gen = doc["phases"].get("generation")
    if isinstance(gen, list):
        print(f"{'batch':>6} {'prompt tok':>11} {'gen tok':>8} {'s':>7} {'tok/s':>8} "
              f"{'peak GiB':>9}")
        for r in gen:
            print(f"{r['batch']:>6} {r['prompt_tokens']:>11} {r['generated']:>8} "
                  f"{r['seconds']:>7} {r['tokens_per_s']:>8} {r['peak_gib']!s:>9}")
    train = doc["phases"].get("train_micro_batch")
    if isinstance(train, list):
        for r in train:
            label = "fwd+bwd " + ("with" if r["checkpointing"] else "without") + " ckpt"
            print(f"{label:>26}: " + (r.get("error") or
                  f"{r['seconds']} s, {r['tokens']} tokens, peak {r['peak_gib']} GiB"))
    ad = doc["phases"].get("adapter")
    if isinstance(ad, dict) and "save_s" in ad:
        print(f"{'adapter r32':>26}: {ad['mb']} MB, save {ad['save_s']} s, "
              f"load {ad['load_s']} s")
    for name, value in doc["phases"].items():
        if isinstance(value, dict) and "skipped" in value:
            print(f"{name}: skipped ({value['skipped']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true",
                    help="a scaled-down architecture on the CPU (a test of the script)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no phase after this many seconds")
    default = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results"
    ap.add_argument("--out", type=Path, default=default / "bench_gpu.json")
    args = ap.parse_args(argv)
    if not args.small and not torch.cuda.is_available():
        ap.error("no CUDA device: the full-size run needs a GPU (use --small on a CPU)")
    doc = run(args.small, args.budget_s, args.out)
    print_table(doc)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
