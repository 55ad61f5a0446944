"""The GRPO recipe's levers, one at a time: each a short `make run` of the recipe in
configs/local-tiny.yaml with one change, from the same start, on the same mazes.

Every case trains STEPS steps (evals: the first 128 held-out mazes every 10 steps, all
256 at the start and the end) and reports the greedy true solve rate on the 256 held-out
mazes at the end, by shortest-path length too. The base recipe's curve peaks about step
20 and ends near the SFT recipe's own plateau (~50%); a lever is worth keeping when it
ends higher than the base by more than the standard error (about 3 points here).

    python -m bench.bench_grpo_levers [case ...]     # default: every case

Slow: a case is a whole local fleet and STEPS steps (4-8 minutes each on 2 quiet cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.common import write_results
from rlfleet.config import merged
from rlfleet.local.run import curve_rate
from rlfleet.maze.difficulty import BANDS

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "local-tiny.yaml"
STEPS = 40
# Each lever: the changes to the recipe (a learner config's sections), and the reward the
# fleet scores with when it is not the recipe's.
CASES: dict[str, dict] = {
    "base": {},
    "lora-mlp": {"model": {"lora_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                            "gate_proj", "up_proj", "down_proj"]}},
    "temperature-0.6": {"data": {"temperature": 0.6}},
    "dynamic-sampling": {"data": {"max_groups_per_step": 24}},
    "progress-reward": {"reward": "progress"},
    "per-turn-credit": {"reward": "progress", "grpo": {"credit": "turn"}},
    "per-state-credit": {"grpo": {"credit": "state"}},
    "no-turn-margin": {"data": {"turn_margin": 0}},
    "32-groups-per-step": {"data": {"groups_per_step": 32}, "steps": 20},
}
# the recipe's time budget off: every case trains its steps, whatever the machine
SHORT = {"steps": STEPS, "minutes": None, "calibrate_step": 0, "eval": {"eval_seeds": 0}}


def run_case(name: str, changes: dict, work: Path) -> dict:
    recipe = yaml.safe_load(RECIPE.read_text())
    config = merged(merged(recipe, SHORT), changes)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([sys.executable, "-m", "rlfleet.local.run", "--config", str(path),
                    "--run", f"lever-{name}", "--runs-root", str(work / "runs")],
                   cwd=REPO, check=True)
    summary = json.loads((work / "runs" / f"lever-{name}" / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    row = {"case": name, "steps": summary["steps"],
           "heldout_start": before["heldout"]["solve_rate"],
           "heldout_end": after["heldout"]["solve_rate"],
           "se": after["heldout"]["solve_rate_se"],
           "curve": " ".join(f"{p['step']}:{100 * curve_rate(p):.0f}" for p in summary["curve"]),
           "minutes": round(summary["wall_clock_s"] / 60, 1)}
    for key, *_ in BANDS:
        if f"heldout_{key}" in after:
            row[f"end_{key}"] = after[f"heldout_{key}"]["solve_rate"]
    return row


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases: {list(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for n, name in enumerate(names, 1):
            print(f"--- lever {n}/{len(names)}: {name} {CASES[name]}", flush=True)
            rows.append(run_case(name, CASES[name], Path(tmp)))
    write_results("bench_grpo_levers", rows, value_key="heldout_end", unit="solve rate",
                  title=f"held-out greedy solve after the levers' short runs ({STEPS} steps)",
                  meta={"recipe": str(RECIPE.relative_to(REPO)), "short": SHORT,
                        "cases": {n: CASES[n] for n in names}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
