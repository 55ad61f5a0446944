"""The learning loop against its limits, on the local stack with the `make run` recipe.

For a short run of the recipe in `configs/local-tiny.yaml` (sync, and the same in async
mode), measured in the same run:

- signal: trajectories with a non-zero advantage trained per minute of steps (target:
  >= 3x the 133/min of the first version);
- update: tokens/s of the update as a ratio to a bare forward+backward of the same model
  on the same rows, on the same ranks (target >= 0.70x);
- rollout: tokens/s of a step's rollout phase as a ratio to a bare batched forward of
  every turn's prompt (target >= 0.70x);
- pool: groups the replicas refused (RESOURCE_EXHAUSTED) and groups the pool re-sent,
  through the training steps and a greedy eval of 128 held-out mazes (target 0);
- rows and distinct rows per step, mean turns per episode, and the per-step phases.

    python -m bench.bench_learner
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from bench.common import RESULTS, write_results
from rlfleet.learner_config import load_learner_config, updated
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import start_stack

REPO = Path(__file__).resolve().parents[1]
STEPS = 8
CALIBRATE_AT = 4
SIGNAL_TARGET = 3 * 133
RATIO_TARGET = 0.70


def replica_counter(urls: list[str], name: str) -> float:
    """A counter summed over the replicas' /metrics (all label sets)."""
    total = 0.0
    for url in urls:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        total += sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text,
                                                   re.M))
    return total


def run_mode(mode: str, work: Path, replicas: int = 2) -> dict:
    group = ProcessGroup(work / mode / "logs")
    model = REPO / "warm-starts" / "tiny-sft"
    stack = start_stack(work / mode, runs_root=work / mode / "runs", run=mode,
                        model_dir=model, replicas=replicas, group=group, log=lambda m: None)
    try:
        cfg = load_learner_config(REPO / "configs" / "local-tiny.yaml", env={})
        cfg = updated(cfg, {"run": mode, "steps": STEPS, "mode": mode,
                            "calibrate_step": CALIBRATE_AT, "model": {"path": model},
                            "fleet": {"redis_url": stack.redis_url,
                                      "sync_address": stack.sync_address,
                                      "runs_root": stack.runs_root, "min_replicas": replicas}},
                      replace={"minutes": None,  # STEPS steps, however fast
                               "eval": {"every": 0, "eval_seeds": 0, "heldout_seeds": 128,
                                        "at_start": True},
                               "checkpoint": {"every": 0}})
        path = work / mode / "learner.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
        urls = [p.extra["metrics_url"] for p in stack.replicas]
        out = subprocess.run([sys.executable, "-m", "rlfleet.cli", "learner", "run",
                              "--config", str(path)], capture_output=True, text=True,
                             timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(out.stdout[-3000:] + out.stderr[-3000:])
        refused = replica_counter(urls, "rlfleet_rollout_groups_refused_total")
        events = read_events(stack.runs_root / mode / "metrics.jsonl")
        retried = sum(next(e for e in events if e["event"] == "end")["pool_retries"].values())
        steps = [e for e in events if e["event"] == "step"]
        cal = next(e for e in events if e["event"] == "calibration")
        n = len(steps)

        def mean(key: str) -> float:
            return sum(s[key] for s in steps) / n

        return {
            "case": mode,
            "signal_per_min": steps[-1]["signal_per_min"],
            "signal_target": f">= {SIGNAL_TARGET}",
            "signal_met": steps[-1]["signal_per_min"] >= SIGNAL_TARGET,
            "update_vs_bare": cal["update_vs_bare"],
            "rollout_vs_bare": cal["rollout_vs_bare"],
            "ratio_target": f">= {RATIO_TARGET}",
            "ratios_met": min(cal["update_vs_bare"], cal["rollout_vs_bare"]) >= RATIO_TARGET,
            "update_tok_s": cal["update_tokens_per_s"],
            "bare_fwd_bwd_tok_s": cal["bare_forward_backward_tokens_per_s"],
            "rollout_tok_s": cal["rollout_tokens_per_s"],
            "bare_fwd_tok_s": cal["bare_forward_tokens_per_s"],
            "pool_refused": refused, "pool_retries": retried,
            "pool_met": refused == 0 and retried == 0,
            "rows_per_step": mean("rows"), "distinct_rows_per_step": mean("forward_rows"),
            "mean_turns": mean("mean_turns"),
            **{f"{phase}_s": mean(f"{phase}_s") for phase in ("rollout", "score", "update",
                                                              "publish", "step")},
        }
    finally:
        stack.close()


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = RESULTS / "learner-work"
    rows = [run_mode("sync", work), run_mode("async", work)]
    write_results("bench_learner", rows, value_key="signal_per_min",
                  unit="signal trajectories per minute of steps",
                  meta={"steps": STEPS, "calibrated_at_step": CALIBRATE_AT,
                        "recipe": "configs/local-tiny.yaml", "replicas": 2,
                        "targets": {"signal_per_min": SIGNAL_TARGET,
                                    "update_vs_bare": RATIO_TARGET,
                                    "rollout_vs_bare": RATIO_TARGET,
                                    "pool_refused_and_retried": 0}},
                  title="the learning loop against its limits (one run; compare ratios)")


if __name__ == "__main__":
    main()
