"""`make run`: the whole fleet on this machine, end to end.

Starts a real Redis, the env/reward service, ckpt-sync and N rollout replicas (hf engine,
CPU), then the learner as a local Ray job starting from the shipped SFT checkpoint; runs
GRPO for the configured steps with a line per step; evaluates before and after; writes
runs/<id>/metrics.jsonl, learning_curve.png and summary.json; prints a before/after
table; and stops everything it started, also on Ctrl-C.

On a terminal the learner prints a short line per step and a table per eval, and its
JSON log goes to runs/<id>/logs/learner.log (beside the services' logs); off one (a
pipe, CI) the console gets the JSON lines. The learner is told which through
RLFLEET_CONSOLE (human|json), decided from this command's own stdout: set it to choose.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import yaml

from rlfleet import defaults
from rlfleet.cliargs import DocHelpFormatter, Parser
from rlfleet.config import TOKEN_NAME, fleet_token
from rlfleet.evaluation.play import eval_sets
from rlfleet.evaluation.solvable import turn_caps
from rlfleet.evaluation.table import comparison_table
from rlfleet.learner_config import LearnerConfig, load_learner_config, updated
from rlfleet.local import records
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.plots import learning_curve
from rlfleet.local.stack import start_stack
from rlfleet.logs import CONSOLE_ENV, human_console
from rlfleet.maze.difficulty import BANDS
from rlfleet.policy.profiles import resolve_model_dir
from rlfleet.storage.paths import RunsRoot

# Relative to the current directory: `make run` runs from the repository root, and an
# installed rlfleet knows no checkout (elsewhere give --config and --runs-root).
DEFAULT_CONFIG = Path("configs", "local-tiny.yaml")
DEFAULT_RUNS_ROOT = Path("runs")


def learner_config(path: Path, *, run: str, steps: int | None) -> LearnerConfig:
    """The learner config of a local run: the file at `path` (with the environment, as the
    learner reads it) with the run's id (and steps, if given); a relative model path in it
    is resolved against the current directory, the directory the config's paths are
    written for (the repository root)."""
    if not path.is_file():
        where = "" if path.is_absolute() else f" (under {Path.cwd()})"
        raise FileNotFoundError(f"no config file {path}{where}: run from the repository root "
                                "or give --config FILE")
    cfg = load_learner_config(path, run=run, steps=steps)
    if cfg.model.path is not None and not cfg.model.path.is_absolute():
        cfg = updated(cfg, {"model": {"path": cfg.model.path.resolve()}})
    return cfg


def learner_console_env(env: Mapping[str, str] | None = None,
                        stdout: IO[str] | None = None) -> dict[str, str]:
    """RLFLEET_CONSOLE for the learner: what the environment says, else "human" when
    this command's stdout is a terminal (the learner's stderr is this command's, but a
    `make` or a wrapper may hand it a pipe while the person watches stdout)."""
    human = human_console(env, sys.stdout if stdout is None else stdout)
    return {CONSOLE_ENV: "human" if human else "json"}


# The sets the summary keeps, start and end: the eval and held-out mazes, and the
# held-out ones by shortest-path length
SUMMARY_SETS = ("eval", "heldout", *(f"heldout_{key}" for key, _, _, _ in BANDS))


def curve_rate(point: dict) -> float:
    """The learning curve's solve rate at one point of summary.json's `curve`: a full
    evaluation holds the curve's held-out subset as `heldout_curve`, a curve point as
    `heldout`."""
    return point.get("heldout_curve", point["heldout"])


def step_breakdown(steps: list[dict], evals: list[dict]) -> dict:
    """Means per step of each phase (evals: per eval), and what the steps trained on."""
    if not steps:
        return {}

    def mean(key: str) -> float:
        return round(sum(s.get(key, 0.0) for s in steps) / len(steps), 3)

    out = {f"{phase}_s": mean(f"{phase}_s") for phase in ("rollout", "score", "update",
                                                          "publish", "step")}
    out["eval_s"] = round(sum(e["seconds"] for e in evals) / max(len(evals), 1), 2)
    out["eval_s_total"] = round(sum(e["seconds"] for e in evals), 1)
    out.update(rows=mean("rows"), forward_rows=mean("forward_rows"),
               mean_turns=mean("mean_turns"), trajectories=mean("trajectories"),
               signal_trajectories=mean("signal_trajectories"),
               signal_per_min=round(steps[-1]["signal_per_min"], 1))
    return out


def steps_line(steps: int, minutes: float | None) -> str:
    """What the run will train: its steps, or its time budget's most."""
    if minutes is None:
        return f"{steps} GRPO steps"
    return f"GRPO steps for {minutes:g} min (at most {steps})"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m rlfleet.local.run", description=__doc__,
                    formatter_class=DocHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="learner config (default: %(default)s, from the current "
                             "directory)")
    parser.add_argument("--steps", type=int, default=None,
                        help="GRPO steps (default: the config's)")
    parser.add_argument("--replicas", type=int, default=2, help="rollout replicas")
    parser.add_argument("--reward", default=None,
                        help="the reward function the fleet scores with, by name "
                             "(default: the config's `reward`, else task)")
    parser.add_argument("--run", default=None, help="run id (default: local-<time>)")
    parser.add_argument("--runs-root", type=Path, default=DEFAULT_RUNS_ROOT,
                        help="where the run's directory is made (default: %(default)s, from "
                             "the current directory)")
    parser.add_argument("--record", default=None, metavar="NAME",
                        help="keep the run's figures as the record results/NAME.json (and "
                             "its curve as results/NAME.png), from the repository root; "
                             "docs/results.md is made from the records")
    args = parser.parse_args(argv)
    if args.record:
        try:
            records.new_record_path(args.record)
        except records.RecordError as exc:
            parser.error(f"--record: {exc}")
    try:
        learner_console_env()  # a mistyped RLFLEET_CONSOLE: said before anything starts
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    run = args.run or time.strftime("local-%Y%m%d-%H%M%S")
    try:
        cfg = learner_config(args.config, run=run, steps=args.steps)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        parser.error(str(exc))
    model_dir = resolve_model_dir(cfg.model.profile, cfg.model.path, defaults.cache_dir())
    runs_root = args.runs_root.resolve()
    try:  # the one containment check: a name or a symlink that leads out is refused
        run_dir = RunsRoot(runs_root).run_dir(run)
    except ValueError as exc:  # InvalidRunName, PathOutsideRunsRoot
        parser.error(str(exc))
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"rlfleet local run {run}: model {model_dir}, {args.replicas} rollout replicas, "
          f"{steps_line(cfg.steps, cfg.minutes)}; output in {run_dir}", flush=True)

    interrupted = False

    def on_sigint(signum: int, _frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        print("\ninterrupted: stopping the learner and every service", flush=True)

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)
    # Auth stays on locally too: a token made for this run unless the environment has one;
    # the learner inherits it through the environment.
    token = fleet_token("none") or secrets.token_hex(16)
    os.environ[TOKEN_NAME] = token
    reward = args.reward or cfg.reward or "task"
    stack = start_stack(run_dir, runs_root=runs_root, run=run, model_dir=model_dir,
                        replicas=args.replicas, token=token, reward=reward,
                        log=lambda m: print(f"  {m}", flush=True))
    learner_rc = 1
    try:
        cfg = updated(cfg, {"reward": reward, "model": {"path": model_dir}, "fleet": {
            "redis_url": stack.redis_url, "sync_address": stack.sync_address,
            "runs_root": runs_root, "min_replicas": args.replicas}})
        config_path = run_dir / "learner.yaml"
        config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        console = learner_console_env()
        if console[CONSOLE_ENV] == "human":
            print(f"  learner: a line per step here; its JSON log in "
                  f"{run_dir / 'logs' / 'learner.log'}", flush=True)
        learner = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
             str(config_path), "--summary", str(run_dir / "learner_summary.json")],
            env={**os.environ, **console}, start_new_session=True)
        while learner.poll() is None:
            if interrupted:
                learner.send_signal(signal.SIGTERM)
                try:
                    learner.wait(120)
                except subprocess.TimeoutExpired:
                    learner.kill()
                break
            time.sleep(0.5)
        learner_rc = learner.wait()
    finally:
        print("stopping services", flush=True)
        stack.close()
    if interrupted:
        return 130
    if learner_rc != 0:
        print(f"learner failed (exit {learner_rc}); service logs in {run_dir / 'logs'}")
        return learner_rc
    events = read_events(run_dir / "metrics.jsonl")
    evals = [e for e in events if e["event"] == "eval"]
    steps = [e for e in events if e["event"] == "step"]
    full = [e for e in evals if e.get("full")]  # start and end: every set
    learning_curve(steps, evals, run_dir / "learning_curve.png", title=f"rlfleet {run}")
    wall = time.perf_counter() - started
    before, after = full[0], full[-1]
    calibration = next((e for e in events if e["event"] == "calibration"), None)
    end = next((e for e in events if e["event"] == "end"), {})
    summary = {
        "run": run,
        "steps": steps[-1]["step"] if steps else 0,
        "wall_clock_s": round(wall, 1),
        "replicas": args.replicas,
        "config": cfg.model_dump(mode="json"),
        "before": {k: before[k] for k in SUMMARY_SETS if k in before},
        "after": {k: after[k] for k in SUMMARY_SETS if k in after},
        "change_points": {k: round(100 * (after[k]["solve_rate"] - before[k]["solve_rate"]), 2)
                          for k in SUMMARY_SETS if k in before and k in after},
        "per_step": step_breakdown(steps, evals),
        "calibration": calibration,
        # the time budget's last plan (config minutes): the steps it fixed, the pace it saw
        "planned": next((e for e in reversed(events) if e["event"] == "planned"), None),
        "pool_retries": end.get("pool_retries", {}),
        **({"time_budget_cut": end["time_budget_cut"]} if end.get("time_budget_cut") else {}),
        "curve": [{"step": e["step"], **{k: e[k]["solve_rate"]
                                         for k in ("eval", "heldout", "heldout_curve")
                                         if k in e}} for e in evals],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    caps = turn_caps(cfg.data.task, eval_sets(cfg.eval.eval_seeds, cfg.eval.heldout_seeds),
                     cfg.data.size, cfg.data.max_turns)
    print()
    print(comparison_table([("before (SFT)", before), ("after GRPO", after)],
                           [c.describe() for c in caps]))
    cut = end.get("time_budget_cut")
    if cut:
        print(f"\nThe time budget of {cut['minutes']:g} min ended the run after "
              f"{cut['steps']} of the recipe's {cut['recipe_steps']} steps.")
    print(f"\n{summary['steps']} GRPO steps in {wall / 60:.1f} min wall clock (whole run).")
    print(f"Learning curve: {run_dir / 'learning_curve.png'}")
    print(f"Files: {run_dir / 'summary.json'} (these figures), {run_dir / 'metrics.jsonl'} "
          f"(every step and eval; TensorBoard: tensorboard --logdir {run_dir}), "
          f"{run_dir / 'logs'} (each process's log)")
    if args.record:
        path = records.write_record(
            args.record, "make run", run_command(args), run_figures(summary),
            recipe=records.recipe_of(cfg), config=str(args.config),
            curve_png=run_dir / "learning_curve.png")
        print(f"Recorded as {path}: python -m rlfleet.local.records updates docs/results.md")
    return 0


def run_command(args: argparse.Namespace) -> str:
    """The command that repeats this run's recipe: `make run`'s line, or this module's
    when a flag changed what `make run` would train."""
    if args.steps is not None or args.replicas != 2 or args.reward:
        flags = [f"--config {args.config}", f"--replicas {args.replicas}"]
        flags += [f"--steps {args.steps}"] if args.steps is not None else []
        flags += [f"--reward {args.reward}"] if args.reward else []
        return "python -m rlfleet.local.run " + " ".join(flags)
    return "make run" + ("" if args.config == DEFAULT_CONFIG else f" CONFIG={args.config}")


def run_figures(summary: dict) -> dict:
    """What a record keeps of a run's summary: each set's solve rate before and after
    (with its standard error and size), the curve, the steps and the wall clock."""
    sets = {}
    for key in SUMMARY_SETS:
        a, b = summary["before"].get(key), summary["after"].get(key)
        if a and b:
            sets[key] = {"before": a["solve_rate"], "after": b["solve_rate"],
                         "after_se": b.get("solve_rate_se"), "episodes": b["episodes"]}
    return {"steps": summary["steps"], "wall_clock_s": summary["wall_clock_s"], **sets,
            "curve": summary["curve"],
            **({"time_budget_cut": summary["time_budget_cut"]}
               if summary.get("time_budget_cut") else {})}


if __name__ == "__main__":
    sys.exit(main())
