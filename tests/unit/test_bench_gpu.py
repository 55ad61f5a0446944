"""bench/gpu/run.py, the one script for the GPU machine, run at its small size on the CPU
with the imports the GPU machine lacks (Ray, Redis, pydantic, vLLM, gRPC) made to fail:
it measures every phase and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench.gpu.model import QWEN3_VL_8B, SMALL, lora_params, qwen3_vl_config, weight_params
from transformers import Qwen3VLForConditionalGeneration

ROOT = Path(__file__).resolve().parents[2]
# pydantic is not there either, but travels with the script (bench/gpu/prepare.sh's wheels,
# installed by bench/gpu/device.sh)
ABSENT_ON_THE_GPU_MACHINE = ("ray", "redis", "vllm", "grpc")


@pytest.mark.slow  # generates and trains a small model: too long for the quick tier
def test_small_run_measures_every_phase_without_the_fleet_packages(tmp_path: Path) -> None:
    out = tmp_path / "bench_gpu.json"
    block = "".join(f"sys.modules[{name!r}] = None; " for name in ABSENT_ON_THE_GPU_MACHINE)
    code = (f"import runpy, sys; {block}sys.argv = ['run.py', '--small', '--out', {str(out)!r}]; "
            f"runpy.run_path({str(ROOT / 'bench' / 'gpu' / 'run.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["small"] and doc["device"] == "cpu"
    assert doc["model"]["params"] == weight_params(SMALL)["total"]
    gen = doc["phases"]["generation"]
    assert [r["batch"] for r in gen] == [2, 4, 8]
    assert all(r["generated"] > 0 and r["tokens_per_s"] > 0 for r in gen)
    # requests are episodes at turns 1..15 of full history: later turns, longer prompts
    assert gen[-1]["max_prompt"] > gen[0]["max_prompt"]
    without, with_ckpt = doc["phases"]["train_micro_batch"]
    assert not without["checkpointing"] and with_ckpt["checkpointing"]
    assert without["rows"] == 4 and without["tokens"] == with_ckpt["tokens"] > 4 * 1000
    assert without["seconds"] > 0 and with_ckpt["seconds"] > 0
    adapter = doc["phases"]["adapter"]
    assert adapter["params"] == lora_params(SMALL, 32)
    assert adapter["save_s"] > 0 and adapter["load_s"] > 0
    assert "tok/s" in proc.stdout and "fwd+bwd with ckpt" in proc.stdout


def test_the_architecture_is_qwen3_vl_8b() -> None:
    ids = {t: i for i, t in enumerate(["<|endoftext|>", "<|image_pad|>", "<|video_pad|>",
                                       "<|vision_start|>", "<|vision_end|>"])}
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(qwen3_vl_config(QWEN3_VL_8B, ids))
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    assert total == weight_params(QWEN3_VL_8B)["total"] == 8_767_123_696
    assert vision == weight_params(QWEN3_VL_8B)["vision"]
    text = model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads,
            text.num_key_value_heads, text.intermediate_size) == (4096, 36, 32, 8, 12288)
    v = model.config.vision_config
    assert (v.depth, v.hidden_size, v.intermediate_size, v.patch_size,
            v.spatial_merge_size) == (27, 1152, 4304, 16, 2)
