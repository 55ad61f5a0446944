"""GRPO step throughput on the local stack, sync (on-policy) vs async (rollouts overlap
the update), and the share of a step's wall time spent outside model compute (rpc,
serialisation, env, sync, waiting).

Model compute = the learner's update time + the replicas' engine time (from their
`rlfleet_rollout_generate_seconds` histograms) divided by the number of replicas, since
replicas generate in parallel.

    python -m bench.bench_learner
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from bench.common import RESULTS, write_results
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import start_stack
from rlfleet.policy import ensure_tiny_model

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("RLFLEET_CACHE", Path.home() / ".cache" / "rlfleet"))
STEPS = 6


def engine_seconds(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        m = re.search(r"^rlfleet_rollout_generate_seconds_sum (\S+)$", text, re.M)
        total += float(m.group(1)) if m else 0.0
    return total


def model_dir() -> Path:
    sft = REPO / "checkpoints" / "tiny-sft"
    return sft if (sft / "config.json").is_file() else ensure_tiny_model(CACHE)


def run_mode(mode: str, work: Path, model: Path, replicas: int = 2) -> dict:
    group = ProcessGroup(work / mode / "logs")
    stack = start_stack(work / mode, runs_root=work / mode / "runs", run=mode,
                        model_dir=model, replicas=replicas, group=group, log=lambda m: None,
                        reward="format+task")
    try:
        cfg = yaml.safe_load((REPO / "configs" / "local-tiny.yaml").read_text())
        cfg.update(run=mode, steps=STEPS, mode=mode)
        cfg["model"]["path"] = str(model)
        cfg["data"].update(groups_per_step=4, group_size=8)
        cfg["eval"] = {"every": 0, "eval_seeds": 0, "heldout_seeds": 0, "at_start": False}
        cfg["checkpoint"] = {"every": 0}
        cfg["fleet"].update(redis_url=stack.redis_url, sync_address=stack.sync_address,
                            runs_root=str(stack.runs_root), min_replicas=replicas,
                            max_groups_in_flight=4)
        path = work / mode / "learner.yaml"
        path.write_text(yaml.safe_dump(cfg))
        urls = [p.extra["metrics_url"] for p in stack.replicas]
        engine0 = engine_seconds(urls)
        out = subprocess.run([sys.executable, "-m", "rlfleet.cli", "learner", "run",
                              "--config", str(path)], capture_output=True, text=True,
                             timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(out.stdout[-3000:] + out.stderr[-3000:])
        engine = engine_seconds(urls) - engine0
        events = [json.loads(line) for line in
                  (stack.runs_root / mode / "metrics.jsonl").read_text().splitlines()]
        steps = [e for e in events if e["event"] == "step"]
        start = next(e for e in events if e["event"] == "start")["time"]
        wall = steps[-1]["time"] - start
        train = sum(s["train_s"] for s in steps)
        trajectories = STEPS * 4 * 8
        model_s = train + engine / replicas
        return {"case": f"{mode}", "steps_per_min": 60 * STEPS / wall,
                "trajectories_per_s": trajectories / wall, "wall_s": wall,
                "train_s": train, "engine_s_per_replica": engine / replicas,
                "outside_model_share": max(0.0, 1 - model_s / wall),
                "max_staleness_seen": max(s["batch_max_staleness_seen"] for s in steps)}
    finally:
        stack.close()


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = model_dir()
    work = RESULTS / "learner-work"
    rows = [run_mode("sync", work, model), run_mode("async", work, model)]
    for r in rows:
        r["vs_sync"] = r["steps_per_min"] / rows[0]["steps_per_min"]
    write_results("learner", rows, value_key="steps_per_min", unit="GRPO steps per minute",
                  meta={"steps": STEPS, "groups_per_step": 4, "group_size": 8,
                        "replicas": 2, "model": str(model)},
                  title="GRPO step throughput, local stack (one run; compare ratios)")


if __name__ == "__main__":
    main()
