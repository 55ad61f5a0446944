"""The learner's driver: rollouts → GRPO update → publish → (eval, checkpoint), per step.

Modes: `sync` (on-policy: each step's groups are sampled with the adapter of that step,
and the next step waits until replicas serve the new version) and `async` (a producer
keeps groups running while the update happens, bounded by max_staleness; trajectories
older than that are dropped and counted).

A step is all or nothing: a stop while its rollouts are still coming abandons it (no
update, no publish, its seeds stay untrained); once the update has begun the step
finishes. Each phase is timed (rollout wait, scoring, update, publish, eval) and the
times go to metrics.jsonl (and from there to the config's report_to trackers:
rlfleet_learner.trackers), the step's log line and the Prometheus histogram.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import Gauge, Histogram

from rlfleet import defaults
from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.clients.sync import SyncClient
from rlfleet.config import fleet_token
from rlfleet.engines.base import vision_token_ids
from rlfleet.evaluation.play import evaluate
from rlfleet.evaluation.solvable import config_turn_caps
from rlfleet.grpo import NonFiniteRewards
from rlfleet.learner_config import LearnerConfig
from rlfleet.policy.loading import load_processor
from rlfleet.policy.profiles import resolve_model_dir
from rlfleet.storage import (
    Checkpoint,
    RunsRoot,
    capture_rng,
    has_checkpoints,
    load_checkpoint,
    load_latest_intact_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from rlfleet.storage.jsonl import append_json_line
from rlfleet.storage.lease import RunLease
from rlfleet.v1 import rollout_pb2
from rlfleet_learner.budget import (
    BUDGET_SPENT_KEY,
    PLANNED_STEPS_KEY,
    plan_due,
    planned_steps,
)
from rlfleet_learner.console import eval_table, step_line
from rlfleet_learner.cursor import SeedCursor
from rlfleet_learner.dynamic_sampling import NoSignalWatch, draw_groups
from rlfleet_learner.faults import BadRewards, FleetFailure, disk_failure
from rlfleet_learner.feed import Group, GroupFeed
from rlfleet_learner.identity import Difference, check_resume, run_identity
from rlfleet_learner.publisher import AdapterPublisher
from rlfleet_learner.reporting import (
    WaitReport,
    replica_state,
    report_progress,
    start_line,
)
from rlfleet_learner.requests import sampling_seed, train_group
from rlfleet_learner.samples import (
    NoTurnRewards,
    build_rows,
    segment_rows,
    trajectory_sample,
)
from rlfleet_learner.trackers.hub import TrackerHub
from rlfleet_learner.workers import TrainerGroup

log = logging.getLogger(__name__)

REWARD_MEAN = Gauge("rlfleet_learner_reward_mean", "mean reward of the step's trajectories")
EVAL_SOLVE = Gauge("rlfleet_learner_eval_solve_ratio",
                   "fraction of the set's episodes truly solved, greedy", ["set"])
STALENESS = Gauge("rlfleet_learner_staleness_versions",
                  "largest adapter lag among trained trajectories, in versions")
STEP = Gauge("rlfleet_learner_step", "optimizer steps taken")
VERSION = Gauge("rlfleet_learner_adapter_version", "latest adapter version published")
# The update's own numbers, from the step's loss statistics (0 on a step with no update).
LOSS = Gauge("rlfleet_learner_loss", "the step's total loss (policy + KL term)")
KL = Gauge("rlfleet_learner_kl", "mean per-token KL to the reference policy")
CLIP = Gauge("rlfleet_learner_clip_ratio", "fraction of loss tokens whose ratio was clipped")
ENTROPY = Gauge("rlfleet_learner_entropy", "mean negative logprob of the sampled loss tokens")
GRAD_NORM = Gauge("rlfleet_learner_grad_norm", "gradient norm before clipping")
STEP_SECONDS = Histogram("rlfleet_learner_step_seconds", "wall time per step", ["phase"],
                         buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))

PHASES = ("rollout", "score", "update", "publish", "eval")


def reward_fields(trajectories: list) -> dict:
    """The reward service(s) that scored a step's trajectories, for its record:
    `reward_name` / `reward_version` of the service that scored most of them, and
    `reward_services` {"name version": count} (two entries in the step of a swap)."""
    counts: dict[str, int] = {}
    for t in trajectories:
        key = f"{t.reward_name} {t.reward_version}".strip()
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return {"reward_name": "", "reward_version": "", "reward_services": {}}
    top = max(trajectories, key=lambda t: counts[f"{t.reward_name} {t.reward_version}".strip()])
    return {"reward_name": top.reward_name, "reward_version": top.reward_version,
            "reward_services": dict(sorted(counts.items()))}


class NoCheckpoint(RuntimeError):
    """--resume latest, but the run has no complete checkpoint."""


class FreshStartRefused(RuntimeError):
    """--resume none over a run that has checkpoints: the two attempts would mix (steps
    counted again from 0, versions published from the starting weights, metrics twice)."""


@dataclass
class State:
    step: int = 0
    cursor: SeedCursor = field(default_factory=lambda: SeedCursor(7))  # trained seeds
    version: int = 0  # adapter version replicas serve now
    saved_step: int = -1  # the newest checkpointed step (-1: none yet)
    history: list[dict] = field(default_factory=list)
    signal_trajectories: int = 0  # trained trajectories with a non-zero advantage
    train_seconds: float = 0.0  # wall time inside steps (evals excluded)
    planned_steps: int | None = None  # where a time budget ends the run, once planned
    budget_spent_s: float = 0.0  # of the time budget, by the attempts before this one


class Learner:
    def __init__(self, cfg: LearnerConfig, *, resume: str = "none",
                 stop: threading.Event | None = None, lease: RunLease | None = None) -> None:
        """`lease`: the run's lease (rlfleet_learner.lease.hold_run, taken before Ray),
        checked before every write to the run; None: no lease (a caller of its own)."""
        self.lease = lease
        self.cfg = cfg
        # a limit that leaves eval mazes unsolvable: refused (ConfigError) unless the
        # config accepts the cap, which every eval then states
        self.turn_caps = [c.describe() for c in config_turn_caps(cfg)]
        for cap in self.turn_caps:
            log.warning("eval under a turn cap: %s", cap)
        self.stop = stop or threading.Event()
        self.root = RunsRoot(cfg.fleet.runs_root)
        self.run_dir = self.root.run_dir(cfg.run)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.root.metrics_path(cfg.run)
        # the same events, for the trackers the config reports to (TensorBoard, W&B, ...)
        self.trackers = TrackerHub(cfg, self.run_dir, self.metrics_path)
        # The fleet's token (an empty one refuses to start; without one, auth must be off
        # explicitly: RLFLEET_AUTH=none) and TLS options (the config's tls section,
        # RLFLEET_TLS_* in a deployment, as the services'); the pool checks the Redis
        # password now (FleetAuthError: one clear error).
        token = fleet_token()
        tls = cfg.tls.options()
        # With no replica left the pool waits this long for a replacement, then fails the
        # group (NoReplicas): the learner checkpoints and stops (RolloutsFailed, exit 3).
        self.pool = RolloutPool(redis_url=cfg.fleet.redis_url, run=cfg.run, token=token,
                                tls=tls, wait_for_replicas_s=cfg.fleet.replacement_wait_s)
        self.publisher = AdapterPublisher(self.root, cfg.run, cfg.model.name,
                                          SyncClient(cfg.fleet.sync_address, token=token,
                                                     timeout_s=60, tls=tls),
                                          announce_retry_s=cfg.fleet.publish_retry_s)
        model_dir = str(resolve_model_dir(cfg.model.profile, cfg.model.path,
                                          defaults.cache_dir()))
        self.identity = run_identity(cfg, model_dir)
        self.publisher.lease = lease
        self.publisher.base_sha256 = self.identity["model"]["sha256"]
        self.state = State(cursor=SeedCursor(cfg.data.size, moves=cfg.data.moves_band()))
        self.no_signal = NoSignalWatch()
        self._reward_warned = False
        self._attempt_started: float | None = None  # when this attempt's steps began
        checkpoint = self._find_checkpoint(resume)
        # the checkpoint trained this model, LoRA and task (or the config allows the change)
        changes = [] if checkpoint is None else check_resume(
            checkpoint.identity, self.identity, cfg.resume_allow_changes, checkpoint.path.name)
        # Said before the model loads (minutes on a big one): which attempt this is.
        log.info(start_line(cfg.run, resume, checkpoint.step if checkpoint else None,
                            checkpoint.path if checkpoint else None),
                 extra={"run": cfg.run, "resume": resume,
                        "resumed_step": checkpoint.step if checkpoint else None,
                        "checkpoint": str(checkpoint.path) if checkpoint else None})
        self.vision_ids = set(vision_token_ids(load_processor(model_dir)))
        self.trainers = TrainerGroup(cfg, model_dir)
        if checkpoint is not None:
            self._restore(checkpoint, changes)

    # -- checkpoints -----------------------------------------------------------------

    def _find_checkpoint(self, resume: str) -> Checkpoint | None:
        """The checkpoint to continue from. `none` over a run with checkpoints refuses
        (FreshStartRefused); `latest`/`auto` take the newest intact one, setting damaged
        newer ones aside (CheckpointError when every one is damaged)."""
        run = self.cfg.run
        if resume == "none":
            if has_checkpoints(self.root, run):
                raise FreshStartRefused(
                    f"run {run!r} already has checkpoints under "
                    f"{self.root.checkpoints_root(run)}: a fresh start would train it again "
                    "from step 0 and mix the two attempts. Use --resume auto (or latest) to "
                    "continue it, or start a run of another name")
            return None
        if resume in ("latest", "auto"):
            ckpt = load_latest_intact_checkpoint(self.root, run)
            if ckpt is None and resume == "latest":
                raise NoCheckpoint(
                    f"run {run!r} has no complete checkpoint under {self.run_dir}; "
                    "use --resume auto to start fresh when there is none")
            if ckpt is None and has_checkpoints(self.root, run):
                raise FreshStartRefused(
                    f"run {run!r} has no complete checkpoint, but has checkpoint "
                    f"directories under {self.root.checkpoints_root(run)}; not starting "
                    "it over")
            return ckpt
        return load_checkpoint(self.root.resolve(resume))

    def _restore(self, ckpt: Checkpoint, changes: list[Difference]) -> None:
        path = ckpt.path
        self.trainers.load_state({"adapter": ckpt.adapter_state,
                                  "optimizer": ckpt.optimizer_state,
                                  "scheduler": ckpt.scheduler_state})
        cursor = ckpt.data_cursor
        budget = self.cfg.minutes is not None
        planned = cursor.get(PLANNED_STEPS_KEY) if budget else None
        self.state = State(step=ckpt.step,
                           cursor=SeedCursor.from_dict(self.cfg.data.size, cursor,
                                                         self.cfg.data.moves_band()),
                           version=int(cursor["version"]), saved_step=ckpt.step,
                           planned_steps=None if planned is None
                           else min(int(planned), self.cfg.steps),  # a lower --steps holds
                           budget_spent_s=float(cursor.get(BUDGET_SPENT_KEY, 0.0))
                           if budget else 0.0)
        # The checkpoint's schedule decays over the steps of the attempt that saved it; this
        # one's may differ (--steps, a budget's plan).
        self.trainers.set_horizon(self.horizon)
        restore_rng(ckpt.rng)  # last: building the trainers drew random numbers
        self._event("resumed", checkpoint=str(path), step=ckpt.step)
        if changes:  # allowed by resume_allow_changes: the run's record says so
            self._event("resume_changes", step=ckpt.step, checkpoint=str(path),
                        allowed=list(self.cfg.resume_allow_changes),
                        changes=[d.as_dict() for d in changes])
            log.warning("resuming with changed settings (resume_allow_changes): %s",
                        "; ".join(str(d) for d in changes), extra={"step": ckpt.step})

    def _checkpoint(self) -> None:
        """Saves the current step, unless it is saved already or nothing was trained."""
        if self.state.step <= max(self.state.saved_step, 0):
            return
        if self.lease is not None:
            self.lease.ensure_held()  # a fenced-off learner saves nothing
        state = self.trainers.state()
        save_checkpoint(
            self.root, self.cfg.run, self.state.step,
            adapter_state=state["adapter"], optimizer_state=state["optimizer"],
            scheduler_state=state["scheduler"],
            data_cursor={**self.state.cursor.to_dict(), "version": self.state.version,
                         **self._budget_cursor()},
            metrics=self.state.history[-1] if self.state.history else {},
            rng=capture_rng(), identity=self.identity)
        self.state.saved_step = self.state.step
        prune_checkpoints(self.root, self.cfg.run, self.cfg.checkpoint.keep_last)

    # -- output ----------------------------------------------------------------------

    def _event(self, kind: str, **fields: object) -> dict:
        if self.lease is not None:
            self.lease.ensure_held()  # a fenced-off learner records nothing
        doc = {"event": kind, "time": round(time.time(), 3), **fields}
        append_json_line(self.metrics_path, doc)  # whole lines only, even on a full disk
        self.trackers.write(doc)
        return doc

    def _lease_fields(self) -> dict:
        """The start record's lease: its generation, and whose expired lease it took."""
        if self.lease is None:
            return {}
        taken = self.lease.taken_over
        return {"lease_generation": self.lease.generation,
                "took_over_from": taken.describe() if taken is not None else None}

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
            wanted = self.cfg.fleet.min_replicas
            with WaitReport(f"{wanted} replica(s) to serve adapter version "
                            f"{published.version}",
                            lambda: replica_state(self.pool, wanted, published.version)):
                live = self.publisher.wait_live(
                    published.version, wanted, self.cfg.fleet.sync_timeout_s,
                    live_ids=self._live_replica_ids,
                    replacement_wait_s=self.cfg.fleet.replacement_wait_s)
            if live.short:
                log.warning("training on with fewer replicas than min_replicas: the others "
                            "died, hang or did not load the version in time",
                            extra={"version": published.version, "serving": live.replica_ids,
                                   "wanted": wanted, "refusals": live.refusals})
                self._event("replicas_short", step=self.state.step,
                            version=published.version, serving=live.replica_ids,
                            wanted=wanted, refusals=live.refusals)
            return live.publish_to_live_s
        return 0.0

    def _live_replica_ids(self) -> set[str] | None:
        """The replicas that heartbeat now (None when the fleet store cannot be read: then
        nobody is assumed gone)."""
        try:
            return {r.replica_id for r in self.pool.replicas()}
        except Exception:  # noqa: BLE001 - a hint only; the wait goes on without it
            log.debug("fleet store unreadable while waiting for replicas", exc_info=True)
            return None

    # -- rollouts --------------------------------------------------------------------

    def _request(self, step: int, index: int, seed: int, min_version: int
                 ) -> rollout_pb2.GroupRequest:
        sampling = (sampling_seed(self.cfg.seed, step, index) if self.cfg.deterministic
                    else 0)
        return train_group(self.cfg.data, run=self.cfg.run, step=step, index=index, seed=seed,
                           min_version=min_version, sampling_seed=sampling)

    def _sync_groups(self, step: int) -> list[Group] | None:
        """This step's groups, sampled with the current version (drawn on while too few
        carry signal, data.max_groups_per_step); None if stopped."""

        def take(first: int, count: int) -> list[Group] | None:
            seeds = self.state.cursor.next_seeds(first + count)[first:]
            requests = [self._request(step, first + g, seed, self.state.version)
                        for g, seed in enumerate(seeds)]
            feed = GroupFeed(self.pool, requests,
                             max_in_flight=self.cfg.fleet.max_groups_in_flight)
            try:
                groups = feed.take(len(requests), self.stop)
            finally:
                feed.close()
            if groups is None:
                return None
            order = {r.idempotency_key: i for i, r in enumerate(requests)}
            return sorted(groups, key=lambda g: order[g[0].idempotency_key])

        return draw_groups(take, self.cfg.data.groups_per_step,
                           self.cfg.data.max_groups_per_step)

    def _async_requests(self) -> Iterator[rollout_pb2.GroupRequest]:
        """Endless requests over the untrained seeds, each asking for a version at most
        max_staleness behind the learner's current one."""
        max_staleness = self.cfg.grpo.max_staleness
        per_step = self.cfg.data.groups_per_step
        for n, seed in enumerate(self.state.cursor.untrained()):
            step, index = self.state.step + n // per_step, n % per_step
            yield self._request(step, index, seed,
                                max(0, self.state.version - max_staleness))

    # -- eval ------------------------------------------------------------------------

    def evaluate(self, heldout_only: int = 0) -> dict:
        start = time.perf_counter()
        result = evaluate(self.pool, self.cfg, self.state.version, heldout_only=heldout_only)
        for name, summary in result.items():
            EVAL_SOLVE.labels(name).set(summary["solve_rate"])
        seconds = time.perf_counter() - start
        STEP_SECONDS.labels("eval").observe(seconds)
        # full: every set (the run's start and end); else the learning curve's subset
        doc = self._event("eval", step=self.state.step, version=self.state.version,
                          seconds=round(seconds, 2), full=not heldout_only, **result,
                          **({"turn_caps": self.turn_caps} if self.turn_caps else {}))
        report_progress("eval", {
            "step": self.state.step, "version": self.state.version,
            "seconds": round(seconds, 2),
            **{f"{name}_{k}": v for name, summary in result.items()
               for k, v in summary.items()}},
            lambda: eval_table(doc))
        return doc

    # -- the loop --------------------------------------------------------------------

    def check_fleet(self) -> None:
        """Fails fast (InsufficientCapacity) when the fleet cannot hold what the recipe
        keeps in flight, once ``min_replicas`` replicas are live (or the sync timeout)."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.fleet.sync_timeout_s
        wanted = cfg.fleet.min_replicas
        with WaitReport(f"{wanted} live rollout replica(s)",
                        lambda: replica_state(self.pool, wanted)):
            while len(self.pool.replicas()) < wanted and \
                    time.monotonic() < deadline and not self.stop.is_set():
                time.sleep(0.5)
        self.pool.check_fits(cfg.data.group_size, cfg.fleet.max_groups_in_flight, wait_s=1.0)

    def run(self) -> dict:
        """Trains; on a FleetFailure checkpoints the trained steps, records the failure
        and raises it (the CLI turns it into one line and EXIT_FLEET_FAILURE)."""
        try:
            return self._run()
        except FleetFailure as exc:
            self._stop_on_failure(exc)
            raise
        except OSError as exc:  # a checkpoint or a metrics record the disk did not take
            failure = disk_failure(exc, "to the runs root")
            if failure is None:
                raise
            self._stop_on_failure(failure)  # the checkpoint may fail the same way: said
            raise failure from exc
        finally:
            self.trackers.close()

    def _stop_on_failure(self, exc: FleetFailure) -> None:
        """Saves every trained step (unless checkpoints are off) so that a rerun with
        --resume auto loses none; a disk that cannot take it is said, not raised over the
        failure that stopped the run."""
        if self.cfg.checkpoint.every:
            try:
                self._checkpoint()
            except OSError as err:
                log.error("could not checkpoint step %d while stopping: %s",
                          self.state.step, err, extra={"step": self.state.step})
        try:
            self._event("failed", step=self.state.step, saved_step=self.state.saved_step,
                        error=type(exc).__name__, reason=str(exc))
        except OSError as err:
            log.error("could not record the failure in metrics.jsonl: %s", err)

    def _run(self) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        self.check_fleet()
        self._event("start", config=json.loads(cfg.model_dump_json()), step=self.state.step,
                    **self._lease_fields())
        self.publish()  # replicas serve exactly the learner's starting (or resumed) weights
        evals = []
        if cfg.eval.at_start and (cfg.eval.eval_seeds or cfg.eval.heldout_seeds):
            evals.append(self.evaluate())
        feed = None
        if cfg.mode == "async":
            feed = GroupFeed(self.pool, self._async_requests(),
                             max_in_flight=cfg.fleet.max_groups_in_flight,
                             max_queued=cfg.data.groups_per_step
                             * (cfg.grpo.max_staleness + 1))
        self._attempt_started = last_plan_time = time.perf_counter()
        last_plan_step = self.state.step
        try:
            while self.state.step < self.horizon and not self.stop.is_set():
                if not self._one_step(feed):
                    break  # stopped while waiting for rollouts: the step is abandoned
                if cfg.eval.every and self.state.step % cfg.eval.every == 0 \
                        and self.state.step < self.horizon:
                    evals.append(self.evaluate(heldout_only=cfg.eval.curve_heldout))
                if cfg.minutes is not None and \
                        plan_due(self.state.step - last_plan_step, cfg.eval.every):
                    now = time.perf_counter()
                    self._plan((now - last_plan_time) / (self.state.step - last_plan_step))
                    last_plan_step, last_plan_time = self.state.step, now
                if cfg.checkpoint.every and self.state.step % cfg.checkpoint.every == 0:
                    self._checkpoint()
        finally:
            if feed is not None:
                feed.close()
        if self.stop.is_set():
            if cfg.checkpoint.every:
                self._checkpoint()
            self._event("stopped", step=self.state.step)
            return {"stopped": True, "step": self.state.step}
        if cfg.eval.eval_seeds or cfg.eval.heldout_seeds:
            evals.append(self.evaluate())
        if cfg.checkpoint.every:
            self._checkpoint()
        cut = self._budget_cut()
        return self._event("end", step=self.state.step, version=self.state.version,
                           **({"time_budget_cut": cut} if cut else {}),
                           seconds=round(time.perf_counter() - started, 1),
                           train_seconds=round(self.state.train_seconds, 1),
                           signal_trajectories=self.state.signal_trajectories,
                           pool_retries=dict(self.pool.retries),
                           first_eval=evals[0] if evals else None,
                           last_eval=evals[-1] if evals else None)

    def _one_step(self, feed: GroupFeed | None) -> bool:
        """One optimiser step; False if a stop came before its rollouts were all in."""
        t0 = time.perf_counter()
        step = self.state.step
        if feed is None:
            groups = self._sync_groups(step)
        else:
            groups = draw_groups(lambda _, count: feed.take(count, self.stop),
                                 self.cfg.data.groups_per_step,
                                 self.cfg.data.max_groups_per_step)
        if groups is None:
            self._event("abandoned", step=step + 1, reason="stop while waiting for rollouts")
            return False
        t1 = time.perf_counter()
        keyed = [(request.idempotency_key, ts) for request, ts in groups]
        try:
            rows, batch, signal = build_rows(keyed, self.state.version, self.cfg.grpo,
                                             self.vision_ids)
        except (NonFiniteRewards, NoTurnRewards) as exc:  # nothing trained: seeds stay untrained
            raise BadRewards(f"step {step + 1}: {exc}") from exc
        trajectories = [t for _, ts in keyed for t in ts]
        t2 = time.perf_counter()
        result = self.trainers.step(rows) if rows else None
        t3 = time.perf_counter()
        self.state.step += 1
        self.state.cursor.mark_trained(request.task.seed for request, _ in groups)
        try:
            live_s = self.publish()
        except FleetFailure:
            # The step is trained and is checkpointed on the way out (run): its record,
            # written now, keeps it (and its seeds) in the run's lineage.
            n = max(len(trajectories), 1)
            try:
                self._event("step", step=self.state.step, version=self.state.version,
                            published=False, trajectories=len(trajectories),
                            seeds=[request.task.seed for request, _ in groups],
                            reward_mean=sum(t.reward for t in trajectories) / n,
                            rows=len(rows), grad_norm=result.grad_norm if result else 0.0)
            except OSError as err:  # the disk that failed the publish: say it, go on
                log.error("could not record step %d: %s", self.state.step, err)
            raise
        t4 = time.perf_counter()
        self.state.signal_trajectories += signal
        self.state.train_seconds += t4 - t0
        warning = self.no_signal.observe(self.state.step, groups)
        if warning:
            log.warning(warning)
        scored_by = reward_fields(trajectories)
        self._check_reward(scored_by)
        n = max(len(trajectories), 1)
        phases = {"rollout": t1 - t0, "score": t2 - t1, "update": t3 - t2, "publish": t4 - t3}
        doc = {
            "step": self.state.step,
            "version": self.state.version,
            "reward_mean": sum(t.reward for t in trajectories) / n,
            "solve_rate_sampled": sum(t.final_state.solved for t in trajectories) / n,
            "mean_turns": sum(len(t.turns) for t in trajectories) / n,
            "trajectories": len(trajectories),
            "seeds": [request.task.seed for request, _ in groups],  # trained exactly once
            **scored_by,
            "signal_trajectories": signal,
            "signal_total": self.state.signal_trajectories,
            "signal_per_min": 60 * self.state.signal_trajectories
            / max(self.state.train_seconds, 1e-9),
            "rows": len(rows),
            "forward_rows": result.forward_rows if result else 0,
            "dropped_unscoreable": len(trajectories) - batch.num_input,
            **{f"batch_{k}": v for k, v in batch.as_dict().items()},
            **({f"loss_{k}": v for k, v in result.stats.items()} if result else {}),
            "grad_norm": result.grad_norm if result else 0.0,
            "lr": self.trainers.lr(),
            **{f"{phase}_s": round(seconds, 3) for phase, seconds in phases.items()},
            "step_s": round(t4 - t0, 3),
            "publish_to_live_s": round(live_s, 3),
            "generate_s": sum(t.timings.generate_s for t in trajectories),
            "env_s": sum(t.timings.env_s for t in trajectories),
        }
        self.state.history.append(doc)
        self._event("step", **doc)
        if self.state.step == self.cfg.calibrate_step:
            self._calibrate(rows, trajectories, phases)
        REWARD_MEAN.set(doc["reward_mean"])
        STALENESS.set(batch.max_staleness_seen)
        STEP.set(self.state.step)
        LOSS.set(doc.get("loss_loss", 0.0))
        KL.set(doc.get("loss_kl", 0.0))
        CLIP.set(doc.get("loss_clip_frac", 0.0))
        ENTROPY.set(doc.get("loss_entropy", 0.0))
        GRAD_NORM.set(doc["grad_norm"])
        for phase, seconds in phases.items():
            STEP_SECONDS.labels(phase).observe(seconds)
        report_progress("step", {**doc, "steps": self.horizon},
                        lambda: step_line(doc, self.horizon))
        return True

    @property
    def horizon(self) -> int:
        """The step the run ends at: its time budget's plan, else its steps."""
        planned = self.state.planned_steps
        return self.cfg.steps if planned is None else planned

    def _budget_spent_s(self) -> float:
        """Seconds of the time budget spent: by earlier attempts, and by this one's
        steps so far."""
        started = self._attempt_started
        return self.state.budget_spent_s + (
            0.0 if started is None else time.perf_counter() - started)

    def _budget_cursor(self) -> dict:
        """What a checkpoint keeps of the time budget (nothing without one)."""
        if self.cfg.minutes is None:
            return {}
        return {BUDGET_SPENT_KEY: round(self._budget_spent_s(), 3),
                **({} if self.state.planned_steps is None
                   else {PLANNED_STEPS_KEY: self.state.planned_steps})}

    def _budget_cut(self) -> dict | None:
        """How a time budget (cfg.minutes) shortened the run, said once at its end (a
        recipe's `steps` is otherwise what it trains); None when it did not."""
        planned, cfg = self.state.planned_steps, self.cfg
        if cfg.minutes is None or planned is None or planned >= cfg.steps:
            return None
        log.warning(f"the time budget of {cfg.minutes:g} min ended the run after "
                    f"{self.state.step} of the recipe's {cfg.steps} steps")
        return {"minutes": cfg.minutes, "steps": self.state.step, "recipe_steps": cfg.steps}

    def _plan(self, seconds_per_step: float) -> None:
        """How many steps the time budget holds at the recent pace (at most cfg.steps):
        the loop's end and the schedule's horizon, said with the pace and the budget
        spent."""
        cfg = self.cfg
        assert cfg.minutes is not None
        spent = self._budget_spent_s()
        planned = planned_steps(self.state.step, seconds_per_step, spent, cfg.minutes * 60,
                                cfg.steps)
        self.state.planned_steps = planned
        self.trainers.set_horizon(planned)
        doc = self._event("planned", step=self.state.step, steps=planned,
                          max_steps=cfg.steps, minutes=cfg.minutes,
                          seconds_per_step=round(seconds_per_step, 3),
                          spent_s=round(spent, 1))
        log.info(f"time budget: {planned} steps fit in {cfg.minutes:g} min at "
                 f"{seconds_per_step:.2f} s a step ({spent / 60:.1f} min spent; evaluations "
                 f"included; at most {cfg.steps})",
                 extra={k: v for k, v in doc.items() if k not in ("event", "time")})

    def _check_reward(self, fields: dict) -> None:
        """Once: a step scored by another reward than the recipe's (cfg.reward)."""
        wanted, got = self.cfg.reward, fields["reward_name"]
        if wanted and got and got != wanted and not self._reward_warned:
            self._reward_warned = True
            log.warning(f"step {self.state.step} was scored by reward {got!r}, not the "
                        f"recipe's {wanted!r}: the fleet's reward service serves another "
                        "(a swap, or a fleet started for another recipe)")

    def _calibrate(self, rows: list, trajectories: list, phases: dict[str, float]) -> dict:
        """This step's update and rollout against their limits on the same rows: a bare
        forward+backward (update) and a bare batched forward of every turn's prompt
        (rollout), on the same ranks, as tokens/s ratios."""
        keyed = [trajectory_sample(t, f"calibrate/{i}").with_advantage(0.0)
                 for i, t in enumerate(trajectories) if sum(t.loss_mask) > 0]
        turn_rows = [r for sample in keyed for r in segment_rows(sample)]
        bare_update_s, _ = self.trainers.bare_seconds(rows, forward_batch=64)
        _, bare_rollout_s = self.trainers.bare_seconds(turn_rows, forward_batch=64)
        update_tokens = sum(r.num_tokens for r in rows)
        rollout_tokens = sum(r.num_tokens for r in turn_rows)
        doc = self._event(
            "calibration", step=self.state.step,
            update_tokens=update_tokens, update_s=round(phases["update"], 3),
            bare_forward_backward_s=round(bare_update_s, 3),
            update_tokens_per_s=update_tokens / max(phases["update"], 1e-9),
            bare_forward_backward_tokens_per_s=update_tokens / max(bare_update_s, 1e-9),
            update_vs_bare=bare_update_s / max(phases["update"], 1e-9),
            rollout_tokens=rollout_tokens, rollout_s=round(phases["rollout"], 3),
            bare_forward_s=round(bare_rollout_s, 3),
            rollout_tokens_per_s=rollout_tokens / max(phases["rollout"], 1e-9),
            bare_forward_tokens_per_s=rollout_tokens / max(bare_rollout_s, 1e-9),
            rollout_vs_bare=bare_rollout_s / max(phases["rollout"], 1e-9))
        report_progress("calibration", doc, lambda: (
            f"[calibration step {self.state.step}] update {doc['update_vs_bare']:.2f}x the "
            f"bare forward+backward ({doc['update_tokens_per_s']:.0f} vs "
            f"{doc['bare_forward_backward_tokens_per_s']:.0f} tok/s), rollout "
            f"{doc['rollout_vs_bare']:.2f}x the bare batched forward "
            f"({doc['rollout_tokens_per_s']:.0f} vs {doc['bare_forward_tokens_per_s']:.0f}"
            " tok/s)"))
        return doc
