"""The whole fleet as local processes: Redis, the env/reward service, ckpt-sync and N
rollout replicas (hf engine on the CPU). Used by `make run`, the end-to-end tests and the
benchmarks; every process is stopped when the stack closes.

Auth: with a token (given, or RLFLEET_AUTH_TOKEN[_FILE] in the environment) every service
requires it. Without one the stack turns auth off explicitly (RLFLEET_AUTH=none, the
`--insecure-no-auth` setting; the services bind loopback only), also for the processes
this one starts afterwards (the learner of `make run`), by setting RLFLEET_AUTH=none in
this process's environment unless it says otherwise."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.config import fleet_token
from rlfleet.local.procs import Proc, ProcessGroup, free_port, serve_argv
from rlfleet.local.redis import start_redis


def auth_env(token: str | None) -> dict[str, str]:
    """The environment that gives a service the fleet's token, or turns auth off (None)."""
    return {"RLFLEET_AUTH_TOKEN": token} if token else {"RLFLEET_AUTH": "none"}


@dataclass
class LocalStack:
    group: ProcessGroup
    runs_root: Path
    run: str
    model_dir: Path
    redis_url: str = ""
    env: Proc | None = None
    sync: Proc | None = None
    replicas: list[Proc] = field(default_factory=list)
    token: str | None = None  # the fleet's shared token; None: auth explicitly off
    # A reward service of its own (start_stack(separate_reward=True)); None: the env
    # process scores too (one env/reward process).
    reward: Proc | None = None

    @property
    def service_env(self) -> dict[str, str]:
        return auth_env(self.token)

    @property
    def config_dir(self) -> Path:
        return self.group.log_dir.parent / "configs"

    @property
    def env_address(self) -> str:
        assert self.env is not None and self.env.address
        return self.env.address

    @property
    def reward_address(self) -> str:
        """Where replicas score: the reward service's own address, else the env's."""
        return self.reward.address if self.reward is not None and self.reward.address \
            else self.env_address

    def start_reward(self, argv_for: str | Callable[[int, int], list[str]],
                     name: str = "reward", port: int | None = None,
                     env: dict[str, str] | None = None) -> Proc:
        """Starts a reward service of its own: a reward function's name (served by
        `rlfleet env serve --role reward`), or `argv_for(port, metrics_port)` for a
        service with a command of its own (e.g. a user's reward package)."""
        port = port or free_port()
        metrics_port = free_port()
        if isinstance(argv_for, str):
            argv = serve_argv("env", self.config_dir, name, {
                "role": "reward", "reward": argv_for, "port": port,
                "metrics_port": metrics_port})
        else:
            argv = argv_for(port, metrics_port)
        self.reward = self.group.start_service(name, argv, f"127.0.0.1:{port}",
                                               env={**self.service_env, **(env or {})})
        return self.reward

    def swap_reward(self, argv_for: str | Callable[[int, int], list[str]],
                    name: str = "reward-2", env: dict[str, str] | None = None) -> Proc:
        """Replaces the reward service while the fleet runs, at the same address (as a
        Kubernetes Service keeps its name when the pods behind it change): the old one
        drains (SIGTERM: calls in flight finish), the new one starts there. Replicas score
        through the new one from then on; a group that tries to score in between gets
        UNAVAILABLE and is retried by the learner's pool."""
        assert self.reward is not None, "start_stack(separate_reward=True) first"
        port = int(self.reward.address.rsplit(":", 1)[1])
        self.group.stop(self.reward)
        return self.start_reward(argv_for, name=name, port=port, env=env)

    @property
    def sync_address(self) -> str:
        assert self.sync is not None and self.sync.address
        return self.sync.address

    def add_replica(self, name: str | None = None, *extra: str, run: str | None = None,
                    python: str | None = None) -> Proc:
        """Starts one more replica (of `run`, default the stack's) and waits until ready.
        `python` runs it under another interpreter (the vLLM venv's for --engine vllm)."""
        name = name or f"rollout-{len(self.replicas)}"
        port, metrics_port = free_port(), free_port()
        argv = serve_argv("rollout", self.config_dir, name, {
            "port": port, "metrics_port": metrics_port, "model": self.model_dir,
            "env_address": self.env_address, "reward_address": self.reward_address,
            "redis_url": self.redis_url, "sync_address": self.sync_address,
            "runs_root": self.runs_root, "run": run or self.run, "replica_id": name,
            "heartbeat_s": 1}, *extra)
        if python:
            argv[0] = python
        proc = self.group.start_service(name, argv, f"127.0.0.1:{port}", timeout_s=600,
                                        env=self.service_env)
        proc.extra["metrics_url"] = f"http://127.0.0.1:{metrics_port}/metrics"
        self.replicas.append(proc)
        return proc

    def close(self) -> None:
        self.group.stop_all()


def start_stack(work_dir: Path, *, runs_root: Path, run: str, model_dir: Path,
                replicas: int = 2, reward: str = "task", log=print,  # noqa: ANN001
                group: ProcessGroup | None = None, token: str | None = None,
                separate_reward: bool = False, env_args: Sequence[str] = ()) -> LocalStack:
    """The fleet; with `separate_reward` the env (`--role env`) and the reward service
    (`--role reward`) are two processes at two addresses, as in the chart, so the reward
    can be swapped (`LocalStack.swap_reward`) without touching the env. `env_args` go to
    `rlfleet env serve` (e.g. ``--skyrl-env ENV_ID=DATA`` for a SkyRL environment)."""
    token = token or fleet_token("none")  # the environment's token, if it has one
    if token is None:
        os.environ.setdefault("RLFLEET_AUTH", "none")  # explicit, for the learner too
    group = group or ProcessGroup(work_dir / "logs")
    stack = LocalStack(group, runs_root, run, model_dir, token=token)
    try:
        runs_root.mkdir(parents=True, exist_ok=True)
        log("starting redis")
        _, stack.redis_url = start_redis(group)
        port = free_port()
        role = {"role": "env"} if separate_reward else {"reward": reward}
        log("starting env service" if separate_reward
            else f"starting env/reward service (reward: {reward})")
        stack.env = group.start_service(
            "env", serve_argv("env", stack.config_dir, "env", {
                "port": port, "metrics_port": free_port(), **role}, *env_args),
            f"127.0.0.1:{port}", env=stack.service_env)
        if separate_reward:
            log(f"starting reward service ({reward})")
            stack.start_reward(reward)
        port = free_port()
        log("starting ckpt-sync")
        stack.sync = group.start_service(
            "ckptsync", serve_argv("ckptsync", stack.config_dir, "ckptsync", {
                "port": port, "metrics_port": free_port(), "redis_url": stack.redis_url,
                "runs_root": runs_root}),
            f"127.0.0.1:{port}", env=stack.service_env)
        for i in range(replicas):
            log(f"starting rollout replica {i + 1}/{replicas}")
            stack.add_replica()
    except BaseException:
        stack.close()
        raise
    return stack
