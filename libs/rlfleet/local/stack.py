"""The whole fleet as local processes: Redis, the env/reward service, ckpt-sync and N
rollout replicas (hf engine on the CPU). Used by `make run`, the end-to-end tests and the
benchmarks; every process is stopped when the stack closes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.local.procs import Proc, ProcessGroup, free_port, rlfleet_argv
from rlfleet.local.redis import start_redis


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

    @property
    def env_address(self) -> str:
        assert self.env is not None and self.env.address
        return self.env.address

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
        argv = rlfleet_argv("rollout", "serve", "--port", str(port),
                         "--metrics-port", str(metrics_port), "--model", str(self.model_dir),
                         "--env-address", self.env_address, "--redis-url", self.redis_url,
                         "--sync-address", self.sync_address, "--runs-root",
                         str(self.runs_root), "--run", run or self.run, "--replica-id", name,
                         "--heartbeat-s", "1", *extra)
        if python:
            argv[0] = python
        proc = self.group.start_service(name, argv, f"127.0.0.1:{port}", timeout_s=600)
        proc.extra["metrics_url"] = f"http://127.0.0.1:{metrics_port}/metrics"
        self.replicas.append(proc)
        return proc

    def close(self) -> None:
        self.group.stop_all()


def start_stack(work_dir: Path, *, runs_root: Path, run: str, model_dir: Path,
                replicas: int = 2, reward: str = "task", log=print,  # noqa: ANN001
                group: ProcessGroup | None = None) -> LocalStack:
    group = group or ProcessGroup(work_dir / "logs")
    stack = LocalStack(group, runs_root, run, model_dir)
    try:
        runs_root.mkdir(parents=True, exist_ok=True)
        log("starting redis")
        _, stack.redis_url = start_redis(group)
        port = free_port()
        log(f"starting env/reward service (reward: {reward})")
        stack.env = group.start_service(
            "env", rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                                str(free_port()), "--reward", reward), f"127.0.0.1:{port}")
        port = free_port()
        log("starting ckpt-sync")
        stack.sync = group.start_service(
            "ckptsync", rlfleet_argv("ckptsync", "serve", "--port", str(port),
                                     "--metrics-port", str(free_port()), "--redis-url",
                                     stack.redis_url, "--runs-root", str(runs_root)),
            f"127.0.0.1:{port}")
        for i in range(replicas):
            log(f"starting rollout replica {i + 1}/{replicas}")
            stack.add_replica()
    except BaseException:
        stack.close()
        raise
    return stack
