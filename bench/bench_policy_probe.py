"""Why a frame-only policy stops near 50% or gets past it: its moves state by state,
beside two hand-written policies that see what it sees (rlfleet.maze.heuristics,
rlfleet.sft.probe).

Rows: greedy (the frame only) and no_reverse (the frame and the last move), played on the
256 held-out mazes; then the shipped SFT checkpoint (with --run-dir: the run's start) and,
with --run-dir, the GRPO run's last adapter, probed on the same mazes: their held-out
solve rate (from the run's summary), agreement with the oracle where its move heads
towards the target and where it heads away, how often the "Moved ..." sentence changes
the greedy move, and how often a move undoes the last one.

    python -m bench bench_policy_probe            # the shipped checkpoint
    python -m bench.bench_policy_probe --run-dir runs/<id>

About 1.5 minutes per policy probed on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.common import write_results
from rlfleet.maze import generate_layout
from rlfleet.maze.difficulty import shortest_moves
from rlfleet.maze.episode import default_max_turns
from rlfleet.maze.heuristics import POLICIES, solves
from rlfleet.maze.tasks import HELDOUT_SEEDS
from rlfleet.policy.loading import load_policy
from rlfleet.sft.probe import probe_policy

REPO = Path(__file__).resolve().parents[1]
START = REPO / "warm-starts" / "tiny-sft"


def heuristic_rows(size: int) -> list[dict]:
    layouts = {s: generate_layout(s, size) for s in HELDOUT_SEEDS}
    long = {s for s in layouts if shortest_moves(s, size) >= 12}
    rows = []
    for policy in POLICIES:
        solved = {s for s, lay in layouts.items()
                  if solves(lay, policy, default_max_turns(size))}
        rows.append({"case": f"heuristic: {policy}", "heldout_solve": len(solved) / len(layouts),
                     "moves_ge12": len(solved & long) / len(long) if long else None})
    return rows


def probe_row(case: str, model: torch.nn.Module, processor, size: int,  # noqa: ANN001
              heldout: dict | None) -> dict:
    print(f"probing {case} ...", flush=True)
    p = probe_policy(model, processor, HELDOUT_SEEDS, size)
    return {"case": case,
            "heldout_solve": heldout["solve_rate"] if heldout else None,
            "moves_ge12": heldout.get("moves_ge12") if heldout else None,
            "agree_toward": round(p["toward_agree_rate"], 4),
            "agree_away": round(p["away_agree_rate"], 4),
            "feedback_changes": round(p["feedback_change_rate"], 4),
            "reversals": round(p["reversal_rate"], 4)}


def _summary_rates(summary: dict, when: str) -> dict:
    held = summary[when]["heldout"]
    return {"solve_rate": held["solve_rate"],
            "moves_ge12": summary[when].get("heldout_moves_ge12", {}).get("solve_rate")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="a `make run` directory: probe its newest adapter too")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    summary = (json.loads((args.run_dir / "summary.json").read_text())
               if args.run_dir else None)
    size = summary["config"]["data"]["size"] if summary else 7
    rows = heuristic_rows(size)
    start = Path(summary["config"]["model"]["path"]) if summary else START
    model, processor = load_policy(start)
    rows.append(probe_row(f"start ({start.name})", model, processor, size,
                          _summary_rates(summary, "before") if summary else None))
    if args.run_dir:
        from peft import PeftModel

        adapter = sorted((args.run_dir / "adapters").glob("v*"))[-1]
        tuned = PeftModel.from_pretrained(model, str(adapter))
        rows.append(probe_row(f"GRPO ({args.run_dir.name}, {adapter.name})", tuned,
                              processor, size, _summary_rates(summary, "after")))
    write_results("bench_policy_probe", rows, value_key="heldout_solve", unit="solve rate",
                  title=f"{size}x{size} held-out: heuristics and the tiny policy, probed",
                  meta={"size": size, "run_dir": str(args.run_dir or "")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
