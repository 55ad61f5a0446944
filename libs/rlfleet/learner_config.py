"""The learner's typed configuration (one YAML file; see configs/) and its loading.

It lives in the library, beside the services' settings (rlfleet.service), so the learner,
`make run`, the tests and the chart's schema build it one way: `load_learner_config`,
file < environment < flags for every field, as every service's settings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlfleet import defaults, limits
from rlfleet.config import (
    ClientTls,
    ClosedModel,
    ConfigError,
    ProfileName,
    load_config,
    merged,
    read_config_file,
)
from rlfleet.grpo import GRPOConfig
from rlfleet.maze.tasks import EVAL_SEEDS, HELDOUT_SEEDS
from rlfleet.names import CONTEXTS, ENGINE_NAMES


class ModelConfig(ClosedModel):
    profile: ProfileName = Field(
        "tiny", description="the policy profile (rlfleet.policy.profiles: tiny, qwen3-vl-8b "
        "or a package's): model family and serving limits")
    path: Path | None = Field(
        None, description="the starting checkpoint (e.g. the SFT model); none: the tiny "
        "profile's model, built into the cache")
    name: str = Field("tiny-sft", description="recorded in adapter manifests as the base model")
    lora_rank: int = Field(16, ge=1, le=512, description="the LoRA adapters' rank")
    lora_alpha: int | None = Field(None, description="LoRA alpha; none: twice the rank")
    lora_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        description="language-model projections that get adapters (rlfleet.policy.lora): "
        "attention only, or with the MLP's gate_proj/up_proj/down_proj too")

    @field_validator("lora_modules")
    @classmethod
    def _known_modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from rlfleet.policy.lora import language_modules

        language_modules(value)  # raises, naming the modules LoRA can target
        return value
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cpu, or cuda: each rank uses the GPU Ray gives it "
        "(ray.num_gpus_per_worker)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the weights' dtype; auto: bfloat16 on cuda, float32 on cpu "
        "(exact CPU work)")
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward "
        "(non-reentrant): the memory of full-history 8B sequences for about a third more "
        "compute")
    torch_threads: int | None = Field(1, ge=1, description="torch intra-op threads of each "
                                      "trainer; none: torch's own")

    def torch_dtype(self) -> str:
        """The dtype the trainer loads the weights in (a torch dtype's name)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device == "cuda" else "float32"


class DataConfig(ClosedModel):
    task: str = Field("maze_2d", description="the env task episodes are played in")
    size: int = Field(7, ge=5, le=63, description="the mazes' size (odd, walls included)")
    max_turns: int = Field(0, ge=0, le=1000,
                           description="turns an episode may take; 0: the task's default "
                           "for the size")
    turn_margin: int = Field(
        0, ge=0, le=1000, description="training episodes only: a limit sized to each maze, "
        "its shortest solution + the stop + turn_margin (0: off); evals always play to "
        "max_turns, VisGym's limit")
    cell_px: int = Field(16, ge=0, le=64, description="pixels per maze cell in the frames; "
                         "0: the task's default")
    context: Literal[CONTEXTS] = Field(  # type: ignore[valid-type]  # the proto enum
        "last_frame", description="the observation profile: what each turn's prompt shows "
        "(rlfleet.policy.contexts)")
    groups_per_step: int = Field(8, ge=1, description="groups of episodes trained on a step")
    group_size: int = Field(8, ge=1, le=64, description="episodes of one maze in a group "
                            "(GRPO's group)")
    max_groups_per_step: int = Field(
        0, ge=0, le=1024, description="dynamic sampling (rlfleet_learner.dynamic_sampling): "
        "a step draws groups until groups_per_step of them carry signal (unequal rewards), "
        "at most this many in all; 0 (or up to groups_per_step): a step trains on the "
        "groups_per_step groups it drew")
    min_moves: int = Field(
        0, ge=0, le=4096, description="curriculum: training mazes whose shortest solution "
        "has fewer moves are passed over (the evals keep every maze)")
    max_moves: int | None = Field(
        None, ge=0, le=4096, description="curriculum: training mazes whose shortest "
        "solution has more moves are passed over; none: no upper bound")
    temperature: float = Field(
        1.0, gt=0, le=max(limits.MAX_TEMPERATURE.values()), description="the replicas' "
        "sampling temperature (grpo.temperature follows it); at most what each engine of "
        "fleet.engines serves (vLLM: 2, hf: 5)")
    max_new_tokens: int = Field(4, ge=1, le=4096, description="tokens generated a turn, "
                                "at most")

    def moves_band(self) -> tuple[int, int | None]:
        """The curriculum's band of shortest solutions, (0, None) for every maze."""
        return self.min_moves, self.max_moves

    @model_validator(mode="after")
    def _band_has_mazes(self) -> DataConfig:
        if self.moves_band() == (0, None):
            return self
        if self.max_moves is not None and self.max_moves < self.min_moves:
            raise ValueError(f"data.max_moves={self.max_moves} is less than "
                             f"data.min_moves={self.min_moves}: the band is empty")
        from rlfleet.maze.difficulty import shortest_moves
        from rlfleet.maze.tasks import TRAIN_SEED_BASE

        # the first thousand training mazes tell which lengths this size has
        seen = {shortest_moves(TRAIN_SEED_BASE + i, self.size) for i in range(1000)}
        high = self.max_moves if self.max_moves is not None else max(seen)
        if not any(self.min_moves <= m <= high for m in seen):
            raise ValueError(
                f"data.min_moves={self.min_moves}, data.max_moves={self.max_moves}: no "
                f"training maze of size {self.size} is in that band (the first 1000 have "
                f"shortest solutions of {min(seen)}-{max(seen)} moves, in steps of 4)")
        return self

    @model_validator(mode="after")
    def _visgym_frames(self) -> DataConfig:
        # the visgym profile is VisGym's pictures: 25 px cells (0 takes the task's 25)
        from rlfleet.maze.visgym import VISGYM_CELL_PX

        if self.context == "visgym" and self.cell_px not in (0, VISGYM_CELL_PX):
            raise ValueError(f"data.context visgym shows VisGym's {VISGYM_CELL_PX} px cells "
                             f"({self.size * VISGYM_CELL_PX} px frames at size {self.size}); "
                             f"data.cell_px={self.cell_px} would be another input")
        return self


class OptimConfig(ClosedModel):
    lr: float = Field(5e-4, gt=0, description="AdamW's learning rate (after warmup)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's betas")
    grad_clip: float = Field(1.0, gt=0, description="the gradients' global norm is clipped "
                             "to this")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warmup")
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="the learning rate after warmup: constant, or cosine decay "
        "over the run's steps")
    mini_batches: int = Field(
        1, ge=1, le=64, description="PPO-style reuse of a step's rollouts: the groups are "
        "split into this many parts, one optimizer update each (1: one update); the "
        "clipped ratio keeps the later updates close to the policy that sampled")
    epochs: int = Field(1, ge=1, le=16, description="passes over a step's mini-batches, "
                        "reshuffled each time")


class EvalConfig(ClosedModel):
    every: int = Field(10, ge=0, description="steps between evals; 0: only at start and end")
    eval_seeds: int = Field(64, ge=0, description="the fixed eval mazes 0..N-1 (at most 64)")
    heldout_seeds: int = Field(256, ge=0, description="more mazes (64..) for less noise "
                               "(at most 256)")
    at_start: bool = Field(True, description="evaluate before the first step")
    curve_heldout: int = Field(
        0, ge=0, description="the periodic evals (every N steps) play only the first N "
        "held-out mazes, so the learning curve gets points cheaply; 0: both full sets, as "
        "at the start and end")
    accept_turn_cap: bool = Field(
        False, description="evaluate even when data.max_turns leaves some of the fixed "
        "eval mazes unsolvable (their shortest solution + the stop is longer); false: the "
        "learner refuses to start, naming how many and the limit they need. A cap, the "
        "held-out set's too, is warned about at start and stated in every eval table")

    @model_validator(mode="after")
    def _fits_the_seed_split(self) -> EvalConfig:
        for name, value, split, seeds in (
                ("eval_seeds", self.eval_seeds, EVAL_SEEDS, "the fixed eval mazes"),
                ("heldout_seeds", self.heldout_seeds, HELDOUT_SEEDS, "the held-out mazes")):
            if value > len(split):
                raise ValueError(f"eval.{name}={value}, but {seeds} are only {len(split)} "
                                 f"(seeds {split.start}..{split.stop - 1})")
        if self.curve_heldout > self.heldout_seeds:
            raise ValueError(f"eval.curve_heldout={self.curve_heldout} is more than the "
                             f"{self.heldout_seeds} held-out mazes (eval.heldout_seeds)")
        return self


class CheckpointConfig(ClosedModel):
    every: int = Field(10, ge=0, description="steps between checkpoints; 0: never")
    keep_last: int = Field(3, ge=1, description="checkpoints kept, the newest")


class FleetConfig(ClosedModel):
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="the fleet store "
                           "(RLFLEET_REDIS_URL in a deployment)")
    sync_address: str = Field(defaults.local_address(defaults.CKPTSYNC_PORT),
                              description="ckpt-sync's HOST:PORT (RLFLEET_SYNC_ADDRESS in a "
                              "deployment)")
    runs_root: Path = Field(defaults.RUNS_ROOT, description="where runs are kept "
                            "(RLFLEET_RUNS_ROOT in a deployment)")
    min_replicas: int = Field(1, ge=1, description="wait for this many replicas to serve a "
                              "new version")
    sync_timeout_s: float = Field(
        300, gt=0, description="after this long, train on with the replicas that serve the "
        "new version (fewer than min_replicas: the step's record says so); replicas whose "
        "heartbeat expired are not waited for")
    replacement_wait_s: float = Field(
        300, ge=0, description="when no replica serves a new version, or none is left to "
        "play a group: how long to wait for a replacement before checkpointing and "
        "stopping (exit 3)")
    publish_retry_s: float = Field(
        600, gt=0, description="how long ckpt-sync may answer only UNAVAILABLE / "
        "RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED (down, hung, Redis gone) before the "
        "learner checkpoints and stops")
    max_groups_in_flight: int = Field(8, ge=1, description="groups sent to replicas and "
                                      "not yet answered, at most")
    engines: tuple[Literal[ENGINE_NAMES], ...] = Field(  # type: ignore[valid-type]
        ENGINE_NAMES, min_length=1, description="the engines the fleet's replicas may run: "
        "the sampling settings are checked against each at load (a replica refuses what "
        "its engine cannot serve, and the group is not re-sent); default: every engine "
        "rlfleet ships")


class RayConfig(ClosedModel):
    address: str | None = Field(None, description="the Ray cluster; none: RAY_ADDRESS, "
                                "else a local Ray of the learner's own")
    num_workers: int = Field(1, ge=1, description="data-parallel trainers "
                             "(torch.distributed: NCCL on cuda, gloo on cpu)")
    num_gpus_per_worker: float = Field(
        0, ge=0, le=8, description="the GPUs each trainer rank asks Ray for (0 on CPU; a "
        "fake GPU resource works too)")
    resources_timeout_s: float = Field(
        300, ge=0, description="how long the start waits for the cluster to show the GPUs "
        "the ranks ask for (KubeRay's GPU workers may join after the driver starts); then a "
        "clear error")
    bucket_mb: float = Field(25, gt=0, description="gradients are summed across ranks in "
                             "flat buckets of at most this size")
    object_store_mb: int = Field(256, ge=64, description="a local Ray's object store")


class MetricsConfig(ClosedModel):
    host: str = Field("127.0.0.1", description="address of the Prometheus endpoint "
                      "(--metrics-host; RLFLEET_HOST in a deployment: 0.0.0.0)")
    port: int | None = Field(None, ge=0, le=65535, description="its port (--metrics-port; "
                             "RLFLEET_METRICS_PORT in a deployment); none: no endpoint")


# The experiment trackers a learner can report to, by name (rlfleet_learner.trackers
# registers one of each; a test holds the two equal).
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow")
TrackerName = Literal["tensorboard", "wandb", "mlflow"]


class WandbConfig(ClosedModel):
    project: str | None = Field(None, description="the W&B project; none: WANDB_PROJECT, "
                                "else `rlfleet`")
    entity: str | None = Field(None, description="the W&B entity (user or team); none: "
                               "WANDB_ENTITY, else the API key's own")
    name: str | None = Field(None, description="the W&B run's display name; none: "
                             "WANDB_NAME, else the run's name")
    mode: Literal["online", "offline"] | None = Field(
        None, description="online (the key: WANDB_API_KEY) or offline (no network: the "
        "run's files under WANDB_DIR, else the run's directory, for `wandb sync` later); "
        "none: WANDB_MODE, else online")


class MlflowConfig(ClosedModel):
    tracking_uri: str | None = Field(
        None, description="the MLflow tracking server (http://HOST:5000); none: "
        "MLFLOW_TRACKING_URI (one of the two is needed with mlflow in report_to)")
    experiment: str | None = Field(None, description="the MLflow experiment the run is "
                                   "filed under; none: MLFLOW_EXPERIMENT_NAME, else `rlfleet`")


class LearnerConfig(ClosedModel):
    run: str = Field("local", description="the run's name: its directory under the runs "
                     "root (RLFLEET_RUN in a deployment)")
    seed: int = Field(0, description="the run's seed")
    steps: int = Field(20, ge=0, description="GRPO steps to train (with `minutes`: the most)")
    minutes: float | None = Field(
        None, gt=0, le=7 * 24 * 60, description="a wall-clock budget for the steps (their "
        "curve evaluations included; the evaluations before the first step and after the "
        "last are outside it): after each curve evaluation (every 5 steps without them) "
        "the learner plans, from the pace since the last plan, how many steps fit, at "
        "most `steps`, and the cosine schedule decays over those; a resumed run goes on "
        "with its plan and the budget it has spent. None: `steps` steps")
    @field_validator("run")
    @classmethod
    def _run_name(cls, value: str) -> str:
        # the run names a directory under the runs root: refused here, at load, before
        # anything is started or written (rlfleet.storage.paths holds the one rule)
        from rlfleet.storage.paths import validate_run_name

        return validate_run_name(value)  # InvalidRunName is a ValueError
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: each new version is waited for (fleet.min_replicas) "
        "before the next step's rollouts; async: groups keep playing while a step trains, "
        "within grpo.max_staleness")
    deterministic: bool = Field(False, description="CPU, fixed seeds, seeded sampling: "
                                "resumable bit-exactly (mode sync)")
    calibrate_step: int = Field(
        0, ge=0, description="after this step, also time a bare forward+backward and a bare "
        "batched forward of its rows (the limits the update and the rollout are measured "
        "against); 0: never")
    reward: str | None = Field(
        None, description="the reward the recipe is made for, by name (e.g. progress): "
        "`make run` starts its fleet's reward service with it (in a cluster the chart's "
        "values choose); the learner warns once when a step was scored by another. None: "
        "whatever the fleet serves")
    lease_s: float = Field(
        30, gt=0, le=3600, description="the learner's lease on its run (one learner per "
        "run): renewed every quarter of this; a second learner is refused while it is "
        "renewed, and takes the run over once it has not been for this long (its holder "
        "died or was cut off) or at once when the holder, on the same machine, is gone")
    resume_allow_changes: tuple[Literal["model", "lora", "task"], ...] = Field(
        (), description="what a resume may change from its checkpoint: model (the base "
        "model's weights), lora (alpha; rank and target modules never: the adapter's "
        "shapes), task (task, size, context); any other difference refuses the resume "
        "before Ray starts, naming it. An allowed change is recorded in metrics.jsonl "
        "(event resume_changes)")
    model: ModelConfig = Field(ModelConfig(), description="the policy and its LoRA")
    data: DataConfig = Field(DataConfig(), description="the episodes a step trains on")
    grpo: GRPOConfig = Field(
        GRPOConfig(), description="the GRPO objective; data.temperature reaches "
        "grpo.temperature (the learner's logprobs use the sampling temperature), so the "
        "section need not repeat it")
    optim: OptimConfig = Field(OptimConfig(), description="the optimizer")
    eval: EvalConfig = Field(EvalConfig(), description="greedy evals on fixed mazes")
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="checkpoints")
    fleet: FleetConfig = Field(FleetConfig(), description="the fleet the learner drives")
    ray: RayConfig = Field(RayConfig(), description="the trainers as Ray actors")
    metrics: MetricsConfig = Field(MetricsConfig(), description="the Prometheus endpoint")
    tls: ClientTls = Field(ClientTls(), description="TLS of the learner's clients of "
                           "ckpt-sync and the replicas (RLFLEET_TLS_* in a deployment)")
    report_to: list[TrackerName] = Field(
        ["tensorboard"], description="the experiment trackers each step's and eval's numbers "
        "(metrics.jsonl's), the resolved config and, at the end, learning_curve.png and "
        "summary.json go to, besides metrics.jsonl (the record): tensorboard (event files "
        "in the run's directory), wandb, mlflow. A tracker that fails is warned about once "
        "and never stops training; a resumed run continues the same tracker runs "
        "(their ids in the run's trackers.json)")
    wandb: WandbConfig = Field(WandbConfig(), description="Weights & Biases, with wandb in "
                               "report_to")
    mlflow: MlflowConfig = Field(MlflowConfig(), description="MLflow, with mlflow in "
                                 "report_to")

    @field_validator("report_to")
    @classmethod
    def _once_each(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"report_to names a tracker twice: {names}")
        return names

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        if "temperature" not in self.grpo.model_fields_set:
            self.grpo = self.grpo.model_copy(update={"temperature": self.data.temperature})
            # still unset: a dump of the fields set (`updated`) keeps following data's
            self.grpo.model_fields_set.discard("temperature")
        elif self.grpo.temperature != self.data.temperature:
            raise ValueError(
                f"grpo.temperature={self.grpo.temperature:g} differs from "
                f"data.temperature={self.data.temperature:g}, the temperature replicas "
                "sample at: the importance ratio would compare unlike logprobs (drop "
                "grpo.temperature)")
        for engine in self.fleet.engines:
            try:
                limits.check_sampling(engine, self.data.temperature)
            except limits.UnservableSampling as exc:
                raise ValueError(f"data.temperature: {exc} (fleet.engines: "
                                 f"{', '.join(self.fleet.engines)})") from None
        if self.deterministic and self.mode != "sync":
            raise ValueError("deterministic runs need mode: sync")
        if self.deterministic and self.minutes is not None:
            raise ValueError("deterministic runs cannot have a time budget (minutes): the "
                             "steps it plans depend on the machine's speed")
        self._check_device()
        return self

    def _check_device(self) -> None:
        """What the config asks of the hardware, checked before anything starts (the
        worker checks its own device again: rlfleet_learner.devices)."""
        m, r = self.model, self.ray
        if m.device == "cuda" and r.num_gpus_per_worker < 1:
            raise ValueError(
                f"model.device is cuda but ray.num_gpus_per_worker={r.num_gpus_per_worker:g}:"
                " each trainer rank needs at least 1 GPU from Ray (set it to 1)")
        if m.device == "cpu" and m.torch_dtype() == "float16":
            raise ValueError("model.dtype float16 on device cpu: CPUs train in float32 or "
                             "bfloat16 (float16 is for GPUs)")


# Every field reads RLFLEET_<FIELD> / RLFLEET_<SECTION>__<FIELD> (rlfleet.config). These
# shorter names are the ones a deployment sets for every pod (the Helm chart does), read
# below those: the fleet's addresses, the metrics endpoint and TLS belong to the
# deployment, not to the training recipe; the names are the services' own.
ENV_ALIASES = {
    "RLFLEET_REDIS_URL": "fleet.redis_url",
    "RLFLEET_SYNC_ADDRESS": "fleet.sync_address",
    "RLFLEET_RUNS_ROOT": "fleet.runs_root",
    "RLFLEET_MODEL": "model.path",
    "RLFLEET_HOST": "metrics.host",
    "RLFLEET_METRICS_PORT": "metrics.port",
    "RLFLEET_TLS_CA": "tls.ca",
    "RLFLEET_TLS_CLIENT_CA": "tls.client_ca",
    "RLFLEET_TLS_CERT": "tls.cert",
    "RLFLEET_TLS_KEY": "tls.key",
    "RLFLEET_TLS_IP_SERVER_NAME": "tls.ip_server_name",
}


def load_learner_config(path: str | Path, env: Mapping[str, str] | None = None,
                        **flags: Any) -> LearnerConfig:
    """The learner config: the YAML file, then the environment (`env`, default
    os.environ), then `flags` (nested mappings: {"metrics": {"port": 9104}})."""
    env = os.environ if env is None else env
    # A deployment names the run (the chart's RLFLEET_RUN); a config file that names
    # another would be renamed behind its author's back: refuse instead.
    named = read_config_file(path).get("run")
    if env.get("RLFLEET_RUN") and named and env["RLFLEET_RUN"] != named:
        raise ConfigError(
            f"{path} names the run {named!r} but RLFLEET_RUN={env['RLFLEET_RUN']!r}: "
            "give both the same name, or drop `run` from the file (the chart's `run` value "
            "sets RLFLEET_RUN)")
    return load_config(LearnerConfig, path, overrides=flags, env=env, aliases=ENV_ALIASES,
                       what=f"learner configuration {path}")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config that the flags of `rlfleet.cliargs.add_learner_args` set: `--set`, then
    the named flags above it (as a service's, rlfleet.service.load_settings)."""
    from rlfleet.cliargs import assignments

    metrics = {"host": args.metrics_host, "port": args.metrics_port}
    named = {"steps": args.steps, "run": args.run,
             "metrics": {k: v for k, v in metrics.items() if v is not None}}
    return merged(assignments(args.set_values),
                  {k: v for k, v in named.items() if v not in (None, {})})


def updated(cfg: LearnerConfig, changes: Mapping[str, Any],
            replace: Mapping[str, Any] | None = None) -> LearnerConfig:
    """`cfg` with `changes` merged in (a section's other fields kept) and the top-level
    keys or whole sections of `replace` replaced, checked again as a new config."""
    data = merged(cfg.model_dump(exclude_unset=True), changes)
    return LearnerConfig.model_validate({**data, **(replace or {})})
