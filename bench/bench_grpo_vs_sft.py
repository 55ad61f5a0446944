"""GRPO against SFT for the same compute, from the same start, on the same mazes.

`make run` trains GRPO from an SFT checkpoint (the run's model.path: the shipped
warm-starts/tiny-sft by default). Would more SFT, for the same CPU time, have done as well?
This bench continues that checkpoint's own SFT recipe (its sft_summary.json: context,
agent aux, feedback aux, lr, batch) from that checkpoint for the CPU-seconds the GRPO
run's steps took (their wall clock, evals not counted, times this machine's cores:
generous to SFT, which runs on one thread here while GRPO's processes never keep every
core busy), then plays the same 256 held-out
mazes greedily. Rows: the start, SFT continued, GRPO; by shortest-path length too.

    python -m bench.bench_grpo_vs_sft [--run-dir runs/<id>]

Without --run-dir it reads the newest `make run` under runs/ (one with a summary.json),
or runs `make run`'s recipe first when there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import write_results
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.maze.difficulty import BANDS, by_band
from rlfleet.maze.tasks import HELDOUT_SEEDS
from rlfleet.sft.train import SFTConfig, train_sft

REPO = Path(__file__).resolve().parents[1]
# The recipe of a checkpoint without an sft_summary.json: the shipped one's.
DEFAULT_RECIPE = {"context": "frame_only", "agent_aux": 1.0, "feedback_aux": 0.0,
                  "lr": 1e-3, "batch": 32}


def newest_run(runs_root: Path) -> Path | None:
    done = sorted(runs_root.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return done[-1].parent if done else None


def grpo_run(run_dir: Path | None) -> Path:
    run_dir = run_dir or newest_run(REPO / "runs")
    if run_dir is None:
        print("no `make run` under runs/: running its recipe first", flush=True)
        subprocess.run([sys.executable, "-m", "rlfleet.local.run"], cwd=REPO, check=True)
        run_dir = newest_run(REPO / "runs")
        assert run_dir is not None
    return run_dir


def start_and_recipe(summary: dict) -> tuple[Path, dict]:
    """The GRPO run's start (its model.path, relative to the repository when not absolute)
    and the SFT recipe that made it, so that SFT continues the way the start was made."""
    start = Path(summary["config"]["model"]["path"])
    start = start if start.is_absolute() else REPO / start
    made = start / "sft_summary.json"
    config = json.loads(made.read_text()).get("config", {}) if made.is_file() else {}
    return start, {key: config.get(key, value) for key, value in DEFAULT_RECIPE.items()}


def sft_band_rates(result: dict, size: int) -> dict[str, float]:
    solved = set(result["solved_seeds"])
    return {key: sum(s in solved for s in seeds) / len(seeds)
            for key, seeds in by_band(HELDOUT_SEEDS, size).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--minutes", type=float, default=None,
                        help="SFT's budget instead of the equal-compute one (a quick try)")
    args = parser.parse_args(argv)
    run_dir = grpo_run(args.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [e for e in read_events(run_dir / "metrics.jsonl") if e["event"] == "step"]
    step_wall_s = sum(s["step_s"] for s in steps)
    cores = os.cpu_count() or 1
    budget_min = step_wall_s * cores / 60 if args.minutes is None else args.minutes
    size = summary["config"]["data"]["size"]
    print(f"GRPO run {run_dir.name}: {len(steps)} steps in {step_wall_s / 60:.1f} wall min "
          f"on {cores} cores; SFT continues for {budget_min:.1f} min on one thread",
          flush=True)
    start, recipe = start_and_recipe(summary)
    print(f"SFT continues from {start} with {recipe}", flush=True)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sft = train_sft(SFTConfig(
            out=Path(tmp) / "sft", base=start, size=size, minutes=budget_min, seed=1,
            log_every=50, heldout=True, **recipe), log=lambda line: print(line, flush=True))
    before, after = summary["before"], summary["after"]
    rows = [
        {"case": f"start ({start.name})", "heldout_solve": before["heldout"]["solve_rate"],
         **{key: before.get(f"heldout_{key}", {}).get("solve_rate") for key, *_ in BANDS}},
        {"case": f"SFT +{budget_min:.1f} CPU-min", "heldout_solve":
            sft["heldout256"]["solve_rate"], **sft_band_rates(sft["heldout256"], size)},
        {"case": f"GRPO {len(steps)} steps", "heldout_solve": after["heldout"]["solve_rate"],
         **{key: after.get(f"heldout_{key}", {}).get("solve_rate") for key, *_ in BANDS}},
    ]
    for row in rows:  # bands with no maze of this size are left out
        for key, *_ in BANDS:
            if row.get(key) is None:
                row.pop(key, None)
    lead = 100 * (rows[2]["heldout_solve"] - rows[1]["heldout_solve"])
    print(f"GRPO leads equal-compute SFT by {lead:+.1f} points on the 256 held-out mazes")
    write_results("bench_grpo_vs_sft", rows, value_key="heldout_solve", unit="solve rate",
                  title="held-out greedy solve: GRPO vs SFT for the same CPU time",
                  meta={"grpo_run": str(run_dir), "start": str(start), "sft_recipe": recipe,
                        "step_wall_s": round(step_wall_s, 1),
                        "cores": cores, "sft_minutes": round(budget_min, 2),
                        "sft_steps": sft["steps"], "grpo_lead_points": round(lead, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
