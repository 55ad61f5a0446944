"""`rlfleet eval`: a policy on the fixed maze sets, as the learner evaluates it.

A base model (a Hugging Face Qwen3-VL directory) and, optionally, a LoRA adapter made
for it are played greedily on the 64 fixed eval mazes and/or the held-out mazes, at a
size (7, 9, 11), with an observation profile (visgym: VisGym's harness, the production
path; frame_only: the tiny local policy's), on the transformers engine (CPU or GPU) or
vLLM. The episodes are played by a fleet of this command's own (env/reward service,
ckpt-sync, Redis and one rollout replica, stopped at the end) with the learner's own
evaluation (rlfleet.evaluation.play): the same episode player, env and reward a
training run uses. Without an adapter the table has one column; with one, the base
model (before) and the adapter (after) side by side. The summary goes to --out as JSON.

A learner config (--config) gives the episodes' settings (size, turn limit, observation
profile, reply budget, reward, sets); the flags override it.

Exit 0: evaluated; 1: the fleet failed (one line, and where its logs are); 2: bad input
(not a model, an adapter of another model, an unknown set or size: one line, nothing
started or written)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlfleet.cliargs import Deferred

SIZES = (7, 9, 11)
SET_NAMES = ("eval", "heldout")
RUN = "eval"


def _reward_names() -> list[str]:
    from rlfleet.reward import default_rewards

    return default_rewards().names()


def _profile_names() -> list[str]:
    from rlfleet.policy.profiles import profile_names

    return profile_names()


def _contexts() -> tuple[str, ...]:
    from rlfleet.names import CONTEXTS

    return CONTEXTS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model (and an adapter) on the fixed mazes",
                       description=__doc__)
    p.add_argument("--model", type=Path, required=True, metavar="DIR",
                   help="the base model: a Hugging Face Qwen3-VL checkpoint directory")
    p.add_argument("--adapter", type=Path, default=None, metavar="DIR",
                   help="a LoRA adapter of the model (adapter_config.json + "
                        "adapter_model.safetensors); its results beside the base model's")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="a learner config whose data section, reward, model profile and "
                        "eval sets the evaluation plays (default: the flags alone)")
    p.add_argument("--sets", nargs="+", choices=SET_NAMES, default=None, metavar="SET",
                   help="eval: the 64 fixed mazes; heldout: the held-out mazes (default: "
                        "the config's, else eval)")
    p.add_argument("--heldout-mazes", type=int, default=None, metavar="N",
                   help="how many held-out mazes (1..256; default: the config's, else 256)")
    p.add_argument("--size", type=int, choices=SIZES, default=None,
                   help="maze size, walls included (default: the config's, else 7)")
    p.add_argument("--context", choices=Deferred(_contexts), default=None,
                   help="observation profile: visgym (VisGym's harness, production) or "
                        "frame_only (the tiny local policy's); default: the config's, else "
                        "frame_only")
    p.add_argument("--max-turns", type=int, default=None, metavar="N",
                   help="turn limit (0: VisGym's for the size; default: the config's)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="reply budget a turn (default: the config's, else 4)")
    p.add_argument("--reward", choices=Deferred(_reward_names), default=None,
                   help="the reward service's function (pass@1 counts reward > 0; "
                        "default: the config's, else task)")
    p.add_argument("--profile", choices=Deferred(_profile_names), default=None,
                   help="serving profile (default: the config's model.profile, else tiny)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="hf: transformers in the replica (CPU or GPU); vllm: vLLM, in the "
                        "vLLM venv")
    p.add_argument("--device", default="cpu", help="torch device of the hf engine")
    p.add_argument("--engine-args", type=json.loads, default=None, metavar="JSON",
                   help="extra engine arguments (rlfleet rollout serve --engine-args)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="where the summary is written as JSON (default: not written)")
    p.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                   help="keep the fleet's logs and configs here (default: a temporary "
                        "directory, removed at the end)")
    p.set_defaults(func=_run)


def _fail(message: str) -> int:
    print(f"rlfleet eval: {message}", file=sys.stderr)
    return 2


def eval_config(args: argparse.Namespace) -> Any:
    """The learner config the evaluation plays: --config (or the defaults of the tiny
    local policy) with the flags laid over it."""
    from rlfleet.learner_config import LearnerConfig, load_learner_config, updated

    base = (load_learner_config(args.config, env={}) if args.config else
            LearnerConfig(data={"context": "frame_only", "cell_px": 0},
                          eval={"eval_seeds": 64, "heldout_seeds": 0}, reward="task"))
    data: dict[str, Any] = {}
    for key in ("size", "context", "max_turns", "max_new_tokens"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.context is not None or args.size is not None:
        data["cell_px"] = 0  # the profile's frames at any size (visgym: VisGym's 25 px)
    ev: dict[str, Any] = {"every": 0, "curve_heldout": 0, "accept_turn_cap": True}
    heldout = args.heldout_mazes
    if args.sets is not None:
        ev["eval_seeds"] = 64 if "eval" in args.sets else 0
        ev["heldout_seeds"] = (heldout or 256) if "heldout" in args.sets else 0
    elif heldout is not None:
        ev["heldout_seeds"] = heldout
    if heldout is not None and not 1 <= heldout <= 256:
        raise ValueError(f"--heldout-mazes {heldout}: the held-out mazes are 1..256")
    changes: dict[str, Any] = {"data": data, "eval": ev,
                               "model": {"path": str(args.model)}}
    if args.profile:
        changes["model"]["profile"] = args.profile
    top: dict[str, Any] = {"run": RUN, "reward": args.reward or base.reward or "task"}
    return updated(base, changes, replace=top)


def _run(args: argparse.Namespace) -> int:
    from rlfleet.config import ConfigError
    from rlfleet.evaluation.inputs import EvalInputError, check_adapter, check_model
    from rlfleet.evaluation.play import eval_sets
    from rlfleet.evaluation.solvable import turn_caps

    try:
        check_model(args.model)
        if args.adapter is not None:
            check_adapter(args.adapter, args.model)
        cfg = eval_config(args)
    except (EvalInputError, ConfigError, ValueError) as exc:
        return _fail(str(exc).replace("\n", " "))
    if not (cfg.eval.eval_seeds or cfg.eval.heldout_seeds):
        return _fail("no mazes to play: --sets names none, or the config's eval section "
                     "has eval_seeds and heldout_seeds 0")
    caps = turn_caps(cfg.data.task, eval_sets(cfg.eval.eval_seeds, cfg.eval.heldout_seeds),
                     cfg.data.size, cfg.data.max_turns)
    work = args.keep_logs or Path(tempfile.mkdtemp(prefix="rlfleet-eval-"))
    try:
        summary = evaluate_model(cfg, args, work, [c.describe() for c in caps])
    except Exception as exc:  # a service that did not start, a replica that failed
        reason = (str(exc).strip().splitlines() or [repr(exc)])[0]
        print(f"rlfleet eval: failed: {reason} (the fleet's logs: {work / 'logs'})",
              file=sys.stderr)
        return 1
    if args.keep_logs is None:
        shutil.rmtree(work, ignore_errors=True)
    from rlfleet.evaluation.table import comparison_table

    columns = [(c["name"], c["result"]) for c in summary["columns"]]
    print(comparison_table(columns, summary["turn_caps"]))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.out}")
    return 0


def _replica_args(cfg: Any, args: argparse.Namespace) -> list[str]:
    extra = ["--profile", cfg.model.profile, "--engine", args.engine]
    if args.engine == "hf":
        extra += ["--device", args.device]
    if args.engine_args:
        extra += ["--engine-args", json.dumps(args.engine_args)]
    return extra


def evaluate_model(cfg: Any, args: argparse.Namespace, work: Path, caps: list[str]
                   ) -> dict:
    """Starts the fleet, evaluates the base model (version 0) and the adapter (version
    1, published to the fleet as a training run publishes its versions); the summary."""
    from rlfleet.clients.rollout_pool import RolloutPool
    from rlfleet.clients.sync import SyncClient
    from rlfleet.engines.vllm import default_venv_python
    from rlfleet.evaluation.play import evaluate
    from rlfleet.evaluation.solvable import effective_max_turns
    from rlfleet.local.procs import ProcessGroup
    from rlfleet.local.stack import start_stack
    from rlfleet.storage import RunsRoot, publish_adapter_dir

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            say(f"  {done}/{total} episodes")

    runs = work / "runs"
    started = time.perf_counter()
    with ProcessGroup(work / "logs") as group:
        stack = start_stack(work, runs_root=runs, run=RUN, model_dir=args.model.resolve(),
                            replicas=0, reward=cfg.reward, group=group, log=say)
        python = str(default_venv_python()) if args.engine == "vllm" else None
        say(f"starting a rollout replica ({args.engine} engine, profile "
            f"{cfg.model.profile})")
        stack.add_replica("rollout-0", *_replica_args(cfg, args), python=python)
        pool = RolloutPool(redis_url=stack.redis_url, run=RUN, token=stack.token)
        columns = []
        try:
            say(f"playing the base model {args.model}")
            columns.append({"name": "base model" if args.adapter else "model",
                            "path": str(args.model), "version": 0,
                            "result": evaluate(pool, cfg, 0, progress)})
            if args.adapter is not None:
                manifest = publish_adapter_dir(RunsRoot(runs), RUN, 1, args.adapter,
                                               base_model=cfg.model.name, step=0)
                sync = SyncClient(stack.sync_address, token=stack.token, timeout_s=60)
                sync.publish(RUN, 1, sha256=manifest.manifest_sha256)
                sync.wait_for_replicas(RUN, 1, 1, timeout_s=600)
                say(f"playing the adapter {args.adapter}")
                columns.append({"name": "with adapter", "path": str(args.adapter),
                                "version": 1, "result": evaluate(pool, cfg, 1, progress)})
        finally:
            pool.close()
    data = cfg.data
    return {
        "model": str(args.model),
        "adapter": str(args.adapter) if args.adapter else None,
        "engine": args.engine,
        "profile": cfg.model.profile,
        "task": data.task, "size": data.size,
        "max_turns": effective_max_turns(data.size, data.max_turns),
        "context": data.context, "max_new_tokens": data.max_new_tokens,
        "reward": cfg.reward,
        "turn_caps": caps,
        "columns": columns,
        "seconds": round(time.perf_counter() - started, 1),
    }
