"""What the last `make bench` measured beside the limits the loop is held to, read back
from the JSON results and printed at the end of `make bench`, for whichever benches have
results (a subset, or results from another run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS


def _load(name: str, results: Path) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def limit_rows(results: Path = RESULTS) -> list[tuple[str, str, str, str]]:
    """(what, measured, limit, met) for every limit whose benchmark has results."""
    rows: list[tuple[str, str, str, str]] = []

    def add(what: str, value: float, fmt: str, limit: str, met: bool) -> None:
        rows.append((what, format(value, fmt), limit, "yes" if met else "NO"))

    learner = _load("bench_learner", results)
    if learner:
        target = learner["meta"]["targets"]
        for r in learner["rows"]:
            mode = r["case"]
            add(f"signal trajectories/min ({mode})", r["signal_per_min"], ".0f",
                f">= {target['signal_per_min']}", r["signal_per_min"] >= target["signal_per_min"])
            add(f"update vs bare fwd+bwd ({mode})", r["update_vs_bare"], ".2f",
                f">= {target['update_vs_bare']}x", r["update_vs_bare"] >= target["update_vs_bare"])
            add(f"rollout vs bare fwd ({mode})", r["rollout_vs_bare"], ".2f",
                f">= {target['rollout_vs_bare']}x",
                r["rollout_vs_bare"] >= target["rollout_vs_bare"])
            add(f"pool refused + retried ({mode})", r["pool_refused"] + r["pool_retries"], ".0f",
                "0", r["pool_met"])
    env = _load("bench_env", results)
    if env:
        case = env["meta"]["target_case"]
        row = next(r for r in env["rows"] if r["case"] == case)
        add(f"env steps/s ({case})", row["steps_per_s"], ".0f",
            f">= {env['meta']['target_steps_per_s']:.0f}",
            row["steps_per_s"] >= env["meta"]["target_steps_per_s"])
    sync = _load("bench_sync", results)
    if sync:
        limit = sync["meta"]["target_x_floor"]
        for r in sync["rows"]:
            if r["case"].startswith("8B-sized") and r["case"].endswith("4 replica(s)"):
                add(f"adapter sync x floor ({r['case']})", r["x_floor"], ".2f",
                    f"<= {limit:g}x", r["x_floor"] <= limit)
    return rows


def print_summary(results: Path = RESULTS) -> None:
    rows = limit_rows(results)
    if not rows:
        return
    width = max(len(r[0]) for r in rows)
    print("\nthe loop's limits (this machine, one run each; ratios are within one run)")
    print(f"{'':<{width}}  {'measured':>10}  {'limit':>10}  met")
    for what, value, target, met in rows:
        print(f"{what:<{width}}  {value:>10}  {target:>10}  {met}")
