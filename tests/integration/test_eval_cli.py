"""`rlfleet eval` on the shipped tiny warm start (CPU): its own fleet plays the 64 fixed
mazes with the learner's evaluation, the base model's numbers equal the in-process
greedy evaluation the warm start recorded when it was trained, and an adapter is played
beside it; and bad input (not a model, an adapter of another model, an unknown set or
size) is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlfleet.local.procs import rlfleet_argv
from tests.factories import REPO, save_peft_lora
from tests.waits import scaled

WARM_START = REPO / "warm-starts" / "tiny-sft-feedback"
Q_PROJ = "model.language_model.layers.0.self_attn.q_proj"


def rlfleet_eval(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlfleet_argv("eval", *args), capture_output=True, text=True,
                          timeout=scaled(timeout), env={**os.environ, "RLFLEET_AUTH": "none"})


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    return lines[0]


def test_eval_plays_the_warm_start_and_an_adapter_on_the_fixed_mazes(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    save_peft_lora(WARM_START, adapter, seed=3)
    out = tmp_path / "eval.json"
    proc = rlfleet_eval("--model", str(WARM_START), "--adapter", str(adapter),
                        "--context", "frame_only", "--size", "7", "--sets", "eval",
                        "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert (summary["size"], summary["max_turns"], summary["context"]) == (7, 20, "frame_only")
    base, tuned = summary["columns"]
    assert (base["version"], tuned["version"]) == (0, 1)
    # the warm start's own greedy evaluation (rlfleet.sft.evaluate, in process) recorded
    # these on the same 64 mazes: the fleet's episode player agrees with it
    recorded = json.loads((WARM_START / "sft_summary.json").read_text())["eval64"]
    played = base["result"]["eval"]
    assert played["episodes"] == 64
    assert played["solved"] == recorded["solved"]
    assert played["mean_turns"] == pytest.approx(recorded["mean_turns"])
    assert played["solve_rate_se"] == pytest.approx(recorded["solve_rate_stderr"])
    # the bands of shortest-path length cover the set
    bands = [v for k, v in base["result"].items() if k.startswith("eval_moves_")]
    assert sum(b["episodes"] for b in bands) == 64
    assert sum(b["solved"] for b in bands) == played["solved"]
    # the adapter (random B: another policy) was played, on its own version
    assert tuned["result"]["eval"]["episodes"] == 64
    assert tuned["result"] != base["result"]
    table = proc.stdout
    assert "64 eval mazes: true solve" in table and "± standard error" in table
    assert "pass@1 (reward > 0, the seed's metric)" in table
    assert ">= 12 moves" in table and "change" in table
    assert f"{100 * recorded['solve_rate']:.1f}%" in table


def test_a_directory_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    out = tmp_path / "eval.json"
    line = one_error_line(rlfleet_eval("--model", str(tmp_path), "--out", str(out)))
    assert f"--model {tmp_path} is not a model directory" in line and "config.json" in line
    assert not out.exists()


def write_adapter(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16,
                                                          "peft_type": "LORA"}))
    return path


def test_an_adapter_of_another_model_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    wide = write_adapter(tmp_path / "wide", {
        f"base_model.model.{Q_PROJ}.lora_A.weight": torch.zeros(8, 4096),
        f"base_model.model.{Q_PROJ}.lora_B.weight": torch.zeros(4096, 8)})
    line = one_error_line(rlfleet_eval("--model", str(WARM_START), "--adapter", str(wide),
                                       "--out", str(out)))
    assert "does not match --model" in line and Q_PROJ in line
    elsewhere = write_adapter(tmp_path / "elsewhere", {
        "base_model.model.model.layers.0.attn.c_attn.lora_A.weight": torch.zeros(8, 64),
        "base_model.model.model.layers.0.attn.c_attn.lora_B.weight": torch.zeros(64, 8)})
    line = one_error_line(rlfleet_eval("--model", str(WARM_START), "--adapter",
                                       str(elsewhere), "--out", str(out)))
    assert "model.layers.0.attn.c_attn, which the model does not have" in line
    line = one_error_line(rlfleet_eval("--model", str(WARM_START), "--adapter",
                                       str(tmp_path), "--out", str(out)))
    assert "is not a LoRA adapter directory" in line
    assert not out.exists()


@pytest.mark.parametrize(("flags", "named"), [
    (("--sets", "train"), "argument --sets: invalid choice: 'train'"),
    (("--size", "13"), "argument --size: invalid choice: 13"),
    (("--heldout-mazes", "300"), "--heldout-mazes 300"),
])
def test_an_unknown_set_or_size_is_refused(tmp_path: Path, flags: tuple[str, ...],
                                           named: str) -> None:
    out = tmp_path / "eval.json"
    line = one_error_line(rlfleet_eval("--model", str(WARM_START), *flags, "--out", str(out)))
    assert named in line
    assert not out.exists()
