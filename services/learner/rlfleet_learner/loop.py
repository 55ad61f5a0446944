"""The learner's driver: rollouts → GRPO update → publish → (eval, checkpoint), per step.

Modes: `sync` (on-policy: each step's groups are sampled with the adapter of that step,
and the next step waits until replicas serve the new version) and `async` (a producer
keeps groups running while the update happens, bounded by max_staleness; trajectories
older than that are dropped and counted).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Gauge, Histogram

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.config import read_secret
from rlfleet.engines.base import vision_token_ids
from rlfleet.maze.tasks import train_seeds
from rlfleet.policy.loading import load_processor
from rlfleet.policy.profiles import resolve_model_dir
from rlfleet.rpc.client import RpcClient
from rlfleet.storage import (
    RunsRoot,
    capture_rng,
    latest_complete_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from rlfleet.v1 import rollout_pb2
from rlfleet_learner.config import LearnerConfig
from rlfleet_learner.evaluation import evaluate
from rlfleet_learner.publisher import AdapterPublisher
from rlfleet_learner.requests import sampling_seed, train_group
from rlfleet_learner.samples import build_rows
from rlfleet_learner.workers import TrainerGroup

log = logging.getLogger(__name__)

REWARD_MEAN = Gauge("rlfleet_learner_reward_mean", "mean reward of the step's trajectories")
EVAL_SOLVE = Gauge("rlfleet_learner_eval_solve_rate", "greedy true solve rate", ["set"])
STALENESS = Gauge("rlfleet_learner_staleness", "largest adapter lag among trained trajectories")
STEP = Gauge("rlfleet_learner_step", "optimizer steps taken")
VERSION = Gauge("rlfleet_learner_adapter_version", "latest adapter version published")
STEP_SECONDS = Histogram("rlfleet_learner_step_seconds", "wall time per step", ["phase"],
                         buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))


class NoCheckpoint(RuntimeError):
    """--resume latest, but the run has no complete checkpoint."""


@dataclass
class State:
    step: int = 0
    cursor: int = 0  # training-seed cursor
    version: int = 0  # adapter version replicas serve now
    history: list[dict] = field(default_factory=list)


class Learner:
    def __init__(self, cfg: LearnerConfig, *, resume: str = "none",
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.root = RunsRoot(cfg.fleet.runs_root)
        self.run_dir = self.root.run_dir(cfg.run)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.root.metrics_path(cfg.run)
        token = read_secret("RLFLEET_AUTH_TOKEN")
        self.pool = RolloutPool(redis_url=cfg.fleet.redis_url, run=cfg.run, token=token)
        self.publisher = AdapterPublisher(self.root, cfg.run, cfg.model.name,
                                          RpcClient(cfg.fleet.sync_address, token=token,
                                                    timeout_s=60))
        self.state = State()
        checkpoint = self._find_checkpoint(resume)
        model_dir = str(resolve_model_dir(cfg.model.profile, cfg.model.path))
        self.vision_ids = set(vision_token_ids(load_processor(model_dir)))
        self.trainers = TrainerGroup(cfg, model_dir)
        if checkpoint is not None:
            self._restore(checkpoint)

    # -- checkpoints -----------------------------------------------------------------

    def _find_checkpoint(self, resume: str) -> Path | None:
        if resume == "none":
            return None
        if resume in ("latest", "auto"):
            path = latest_complete_checkpoint(self.root, self.cfg.run)
            if path is None and resume == "latest":
                raise NoCheckpoint(
                    f"run {self.cfg.run!r} has no complete checkpoint under {self.run_dir}; "
                    "use --resume none (or auto) to start fresh")
            return path
        path = self.root.resolve(resume)
        return path

    def _restore(self, path: Path) -> None:
        ckpt = load_checkpoint(path)
        self.trainers.load_state({"adapter": ckpt.adapter_state,
                                  "optimizer": ckpt.optimizer_state,
                                  "scheduler": ckpt.scheduler_state})
        cursor = ckpt.data_cursor
        self.state = State(step=ckpt.step, cursor=int(cursor["cursor"]),
                           version=int(cursor["version"]))
        restore_rng(ckpt.rng)  # last: building the trainers drew random numbers
        self._event("resumed", checkpoint=str(path), step=ckpt.step)

    def _checkpoint(self) -> None:
        if latest_complete_checkpoint(self.root, self.cfg.run) == \
                self.root.checkpoint_dir(self.cfg.run, self.state.step):
            return  # this step is already saved
        state = self.trainers.state()
        save_checkpoint(
            self.root, self.cfg.run, self.state.step,
            adapter_state=state["adapter"], optimizer_state=state["optimizer"],
            scheduler_state=state["scheduler"],
            data_cursor={"cursor": self.state.cursor, "version": self.state.version},
            metrics=self.state.history[-1] if self.state.history else {},
            rng=capture_rng())
        prune_checkpoints(self.root, self.cfg.run, self.cfg.checkpoint.keep_last)

    # -- output ----------------------------------------------------------------------

    def _event(self, kind: str, **fields: object) -> dict:
        doc = {"event": kind, "time": round(time.time(), 3), **fields}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(doc) + "\n")
        return doc

    # -- publishing ------------------------------------------------------------------

    def publish(self) -> float:
        """Publishes the trainers' adapter as the next version; waits for replicas in sync
        mode (returns publish→live seconds, 0 when not waited)."""
        version = self.publisher.next_version(self.state.version + 1)
        published = self.publisher.publish(self.trainers.adapter_files(), self.state.step,
                                           version)
        self.state.version = published.version
        VERSION.set(published.version)
        if self.cfg.mode == "sync":
            return self.publisher.wait_live(published.version, self.cfg.fleet.min_replicas,
                                            self.cfg.fleet.sync_timeout_s)
        return 0.0

    # -- rollouts --------------------------------------------------------------------

    def _step_requests(self, step: int) -> list[rollout_pb2.GroupRequest]:
        d = self.cfg.data
        batch = train_seeds(self.state.cursor, d.groups_per_step, d.size)
        self.state.cursor = batch.next_cursor
        return [
            train_group(d, run=self.cfg.run, step=step, index=g, seed=seed,
                        min_version=self.state.version,
                        sampling_seed=sampling_seed(self.cfg.seed, step, g)
                        if self.cfg.deterministic else 0)
            for g, seed in enumerate(batch.seeds)
        ]

    def _sync_groups(self, step: int) -> list[tuple[str, list]]:
        requests = self._step_requests(step)
        done = dict((r.idempotency_key, t) for r, t in self.pool.run_groups(
            requests, max_in_flight=self.cfg.fleet.max_groups_in_flight))
        return [(r.idempotency_key, done[r.idempotency_key]) for r in requests]

    # -- eval ------------------------------------------------------------------------

    def evaluate(self) -> dict:
        start = time.perf_counter()
        result = evaluate(self.pool, self.cfg, self.state.version)
        for name, summary in result.items():
            EVAL_SOLVE.labels(name).set(summary["solve_rate"])
        doc = self._event("eval", step=self.state.step, version=self.state.version,
                          seconds=round(time.perf_counter() - start, 2), **result)
        line = "  ".join(f"{k} solve {100 * v['solve_rate']:.1f}%±{100 * v['solve_rate_se']:.1f}"
                         f" pass@1 {100 * v['pass_at_1']:.1f}% turns {v['mean_turns']:.1f}"
                         for k, v in result.items())
        print(f"[eval step {self.state.step:>4}] {line}", flush=True)
        return doc

    # -- the loop --------------------------------------------------------------------

    def run(self) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        self._event("start", config=json.loads(cfg.model_dump_json()), step=self.state.step)
        self.publish()  # replicas serve exactly the learner's starting (or resumed) weights
        evals = []
        if cfg.eval.at_start and (cfg.eval.eval_seeds or cfg.eval.heldout_seeds):
            evals.append(self.evaluate())
        producer = _AsyncProducer(self) if cfg.mode == "async" else None
        try:
            while self.state.step < cfg.steps and not self.stop.is_set():
                self._one_step(producer)
                if cfg.eval.every and self.state.step % cfg.eval.every == 0 \
                        and self.state.step < cfg.steps:
                    evals.append(self.evaluate())
                if cfg.checkpoint.every and self.state.step % cfg.checkpoint.every == 0:
                    self._checkpoint()
        finally:
            if producer is not None:
                producer.close()
        if self.stop.is_set():
            self._event("stopped", step=self.state.step)
            return {"stopped": True, "step": self.state.step}
        if cfg.eval.eval_seeds or cfg.eval.heldout_seeds:
            evals.append(self.evaluate())
        if cfg.checkpoint.every:
            self._checkpoint()
        return self._event("end", step=self.state.step, version=self.state.version,
                           seconds=round(time.perf_counter() - started, 1),
                           first_eval=evals[0] if evals else None,
                           last_eval=evals[-1] if evals else None)

    def _one_step(self, producer: _AsyncProducer | None) -> None:
        t0 = time.perf_counter()
        step = self.state.step
        groups = producer.take(self.cfg.data.groups_per_step) if producer else \
            self._sync_groups(step)
        t1 = time.perf_counter()
        rows, batch = build_rows(groups, self.state.version, self.cfg.grpo_config(),
                                 self.vision_ids)
        trajectories = [t for _, ts in groups for t in ts]
        result = self.trainers.step(rows) if rows else None
        t2 = time.perf_counter()
        self.state.step += 1
        live_s = self.publish()
        t3 = time.perf_counter()
        rewards = [t.reward for t in trajectories]
        doc = {
            "step": self.state.step,
            "version": self.state.version,
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            "solve_rate_sampled": sum(t.final_state.solved for t in trajectories)
            / max(len(trajectories), 1),
            "mean_turns": sum(len(t.turns) for t in trajectories) / max(len(trajectories), 1),
            "rows": len(rows),
            "dropped_unscoreable": len(trajectories) - batch.num_input,
            **{f"batch_{k}": v for k, v in batch.as_dict().items()},
            **({f"loss_{k}": v for k, v in result.stats.items()} if result else {}),
            "grad_norm": result.grad_norm if result else 0.0,
            "lr": self.trainers.lr(),
            "rollout_s": round(t1 - t0, 3),
            "train_s": round(t2 - t1, 3),
            "publish_s": round(t3 - t2, 3),
            "publish_to_live_s": round(live_s, 3),
            "generate_s": sum(t.timings.generate_s for t in trajectories),
            "env_s": sum(t.timings.env_s for t in trajectories),
        }
        self.state.history.append(doc)
        self._event("step", **doc)
        REWARD_MEAN.set(doc["reward_mean"])
        STALENESS.set(batch.max_staleness_seen)
        STEP.set(self.state.step)
        for phase, seconds in (("rollout", t1 - t0), ("train", t2 - t1), ("publish", t3 - t2)):
            STEP_SECONDS.labels(phase).observe(seconds)
        print(f"[step {self.state.step:>4}/{self.cfg.steps}] reward {doc['reward_mean']:.3f} "
              f"solved {100 * doc['solve_rate_sampled']:.0f}% turns {doc['mean_turns']:.1f} "
              f"kept {batch.num_kept}/{batch.num_input} (zero-var groups "
              f"{batch.num_zero_variance_groups}, stale {batch.num_stale}) "
              f"loss {doc.get('loss_loss', 0):+.4f} | rollout {t1 - t0:.1f}s "
              f"train {t2 - t1:.1f}s publish {t3 - t2:.1f}s", flush=True)


class _AsyncProducer:
    """Keeps rollouts running ahead of the trainer, never more than max_staleness versions
    behind: each request asks for at least (current version − max_staleness)."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        cfg = learner.cfg
        self.queue: queue.Queue = queue.Queue(
            maxsize=cfg.data.groups_per_step * (cfg.grpo_config().max_staleness + 1))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def _requests(self):  # noqa: ANN202
        step = self.learner.state.step
        g = 0
        max_staleness = self.learner.cfg.grpo_config().max_staleness
        while not self._stop.is_set():
            d = self.learner.cfg.data
            batch = train_seeds(self.learner.state.cursor, 1, d.size)
            self.learner.state.cursor = batch.next_cursor
            min_version = max(0, self.learner.state.version - max_staleness)
            yield train_group(d, run=self.learner.cfg.run, step=step, index=g,
                              seed=batch.seeds[0], min_version=min_version)
            g += 1
            if g >= d.groups_per_step:
                g, step = 0, step + 1

    def _run(self) -> None:
        try:
            pool = self.learner.pool
            for request, trajectories in pool.run_groups(
                    self._requests(), self.learner.cfg.fleet.max_groups_in_flight):
                while not self._stop.is_set():
                    try:
                        self.queue.put((request.idempotency_key, trajectories), timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer thread
            self._error = exc

    def take(self, n: int) -> list[tuple[str, list]]:
        out = []
        while len(out) < n:
            if self._error is not None:
                raise RuntimeError("rollout producer failed") from self._error
            try:
                out.append(self.queue.get(timeout=0.5))
            except queue.Empty:
                if self.learner.stop.is_set():
                    break
        return out

    def close(self) -> None:
        self._stop.set()
