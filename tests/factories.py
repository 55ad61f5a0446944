"""Small real artefacts for tests (and benches): LoRA adapters of the tiny policy, adapter
versions published under a runs root, engine requests with seeded pictures, and learner
config files for a local fleet."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save

from rlfleet.local.forkserver import ForkedProcess, popen
from rlfleet.storage import AdapterManifest, RunsRoot, publish_adapter_dir

if TYPE_CHECKING:  # (imported where used: transformers is slow to import)
    from peft import PeftModel

    from rlfleet.engines import GenerationRequest
    from rlfleet.local.stack import LocalStack
    from rlfleet.policy import ChatCodec

REPO = Path(__file__).resolve().parents[1]
SFT = REPO / "warm-starts" / "tiny-sft"
# q/k/v/o of the language model only (never the vision tower), as the learner trains
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"


def adapter_files(seed: int = 0, rank: int = 4, hidden: int = 16) -> dict[str, bytes]:
    """A PEFT-shaped LoRA adapter (one q_proj pair) as the two files peft writes."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight":
            torch.randn(rank, hidden, generator=g),
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight":
            torch.randn(hidden, rank, generator=g),
    }
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": ["q_proj"], "base_model_name_or_path": "tiny"}
    return {"adapter_model.safetensors": save(tensors),
            "adapter_config.json": json.dumps(config).encode()}


def publish_version(root: RunsRoot, run: str, version: int, seed: int | None = None
                    ) -> AdapterManifest:
    return publish_adapter_dir(root, run, version, adapter_files(seed if seed is not None
                                                                 else version),
                               base_model="tiny", step=version)


def tiny_lora_files(model_dir: Path, seed: int, rank: int = 8) -> dict[str, bytes]:
    """A real LoRA adapter for the tiny policy with random (non-zero) B, so it changes
    the policy's outputs."""
    from rlfleet.policy import load_policy
    from rlfleet.policy.lora import adapter_files as lora_adapter_files
    from rlfleet.policy.lora import add_lora, lora_config

    torch.manual_seed(seed)
    model, _ = load_policy(model_dir)
    peft_model = add_lora(model, lora_config(rank, init_random=True))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return lora_adapter_files(peft_model, "tiny")


def publish_tiny_lora(root: RunsRoot, run: str, version: int, model_dir: Path,
                      seed: int | None = None) -> AdapterManifest:
    return publish_adapter_dir(root, run, version,
                               tiny_lora_files(model_dir, seed if seed is not None else version),
                               base_model="tiny", step=version)


def save_peft_lora(model_dir: Path, out: Path, seed: int) -> PeftModel:
    """A PEFT LoRA (r=8, alpha 16, `LORA_TARGETS`) on the float32 policy of `model_dir`,
    its B drawn from N(0, 0.5^2) with a generator seeded by `seed` (non-zero, so it changes
    the outputs), saved under `out` as peft writes it; the model returned, in eval mode."""
    from peft import LoraConfig, get_peft_model

    from rlfleet.policy import load_policy

    model, _ = load_policy(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    peft_model.save_pretrained(out)
    return peft_model.eval()


def noise_image(width: int, height: int, seed: int) -> Image.Image:
    """An RGB picture of seeded uniform noise (no two seeds alike)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def user_message(*parts: object) -> dict:
    """A user turn of pictures and texts, in the given order."""
    from rlfleet.policy import image_to_data_url

    content = []
    for p in parts:
        if isinstance(p, Image.Image):
            content.append({"type": "image_url", "image_url": {"url": image_to_data_url(p)}})
        else:
            content.append({"type": "text", "text": str(p)})
    return {"role": "user", "content": content}


def image_request(codec: ChatCodec, size: int, text: str, seed: int = 0
                  ) -> GenerationRequest:
    """An engine request of one user turn: a size x size noise picture, then `text`."""
    from rlfleet.engines import GenerationRequest

    enc = codec.encode_prompt([user_message(noise_image(size, size, seed), text)])
    return GenerationRequest(enc.token_ids, enc.images)


# the recipe learner tests build on: the tests' own, not the demo's configs/local-tiny.yaml
TEST_RECIPE = "tests/data/recipes/tiny.yaml"

# what an e2e learner run evaluates: nothing (the runs are about the fleet, not the score)
NO_EVAL = {"every": 0, "eval_seeds": 0, "heldout_seeds": 0, "at_start": False}


def learner_config(stack: LocalStack, tmp_path: Path, run: str, model_dir: Path = SFT, *,
                   base: str = TEST_RECIPE, model: Mapping[str, Any] | None = None,
                   data: Mapping[str, Any] | None = None, grpo: Mapping[str, Any] | None = None,
                   fleet: Mapping[str, Any] | None = None, **sections: Any) -> Path:
    """A learner config file for `run` on `stack`'s fleet: `base` (a recipe relative to
    the repository: the tests' own by default) with the stack's
    Redis, ckpt-sync and runs root, one replica enough to start, the policy of
    `model_dir`, no calibration step and no time budget (a test's steps are its config's,
    however loaded the machine). `model`, `data`, `grpo` and `fleet` update those
    sections; every other keyword replaces a top-level key or a whole section
    (``steps=3``, ``eval=NO_EVAL``, ``minutes=1``)."""
    import yaml

    from rlfleet.learner_config import load_learner_config, updated

    cfg = load_learner_config(REPO / base, env={})
    cfg = updated(cfg, {"run": run, "calibrate_step": 0,
                        "model": {"path": model_dir, **(model or {})}, "data": data or {},
                        "grpo": grpo or {},
                        "fleet": {"redis_url": stack.redis_url,
                                  "sync_address": stack.sync_address,
                                  "runs_root": stack.runs_root, "min_replicas": 1,
                                  # the local stack's replicas run the hf engine, which
                                  # samples as hot as HOT_SHORT_EPISODES asks
                                  "engines": ["hf"], **(fleet or {})}},
                  replace={"minutes": None, **sections})
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
    return path


# The shipped SFT policy sampled hot (T = 3) in short episodes: 2 groups of 4 four-turn
# episodes a step, so the format+task reward varies within every group and every step trains.
HOT_SHORT_EPISODES = {"groups_per_step": 2, "group_size": 4, "max_turns": 4,
                      "temperature": 3.0}


# every learner_process started, for tests/conftest.py's `no_learner_outlives_its_test`
STARTED_LEARNERS: list[subprocess.Popen | ForkedProcess] = []


def learner_process(config: Path, resume: str = "auto", steps: int | None = None
                    ) -> subprocess.Popen | ForkedProcess:
    """`rlfleet learner run --config CONFIG --resume RESUME [--steps STEPS]` at WARNING, as
    the chart runs it on every retry, in a process group of its own (a test may SIGKILL it
    whole, Ray included); output captured as text."""
    argv = [sys.executable, "-m", "rlfleet.cli", "learner", "run",
            "--config", str(config), "--resume", resume, "--log-level", "WARNING"]
    if steps is not None:
        argv += ["--steps", str(steps)]
    proc = popen(argv)
    STARTED_LEARNERS.append(proc)
    return proc


def kill_started_learners() -> None:
    """SIGKILL to the process group (Ray's too) of every learner_process still running:
    a test that failed half-way leaves none for the next test or the leak check."""
    while STARTED_LEARNERS:
        proc = STARTED_LEARNERS.pop()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=60)
