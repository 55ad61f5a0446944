"""Bounded load test on loopback: the env service and the rollout pool
at a fixed concurrency — throughput, latency, error rate — and at overload, where the
answer must be a clear RESOURCE_EXHAUSTED while the accepted work keeps its throughput
(no collapse, no other errors).

    python -m bench.bench_load            # about 2-3 minutes on 2 cores
"""

from __future__ import annotations

import collections
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_results
from rlfleet.clients.env import EnvClient
from rlfleet.clients.rollout import RolloutClient
from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.local.redis import start_redis
from rlfleet.rpc.errors import RpcError
from rlfleet.rpc.health import check
from rlfleet.v1 import common_pb2, env_pb2, rollout_pb2

MOVES = ["('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)"]
WINDOW_S = 8.0
BACKOFF_S = 0.02  # a caller told RESOURCE_EXHAUSTED waits this long before trying again


def run_load(worker: Callable[[int], Callable[[], None]], concurrency: int,
             duration_s: float) -> dict[str, Any]:
    """`concurrency` threads call their op (from worker(i)) in a loop for duration_s;
    returns calls/s (OK only), error rate, codes and latency percentiles of OK calls.
    A caller told RESOURCE_EXHAUSTED backs off BACKOFF_S before its next call."""
    codes: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def loop(i: int) -> None:
        op = worker(i)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                op()
                code = "OK"
            except RpcError as err:
                code = err.code.name
            dt = time.perf_counter() - t0
            if code == "RESOURCE_EXHAUSTED":
                time.sleep(BACKOFF_S)  # as a well-behaved client does; no tight spin
            with lock:
                codes[code] += 1
                if code == "OK":
                    latencies.append(dt)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join(120)
    elapsed = time.perf_counter() - start
    total = sum(codes.values())
    lat = sorted(latencies) or [0.0]
    return {
        "ok_per_s": codes["OK"] / elapsed,
        "calls": total,
        "error_rate": (total - codes["OK"]) / total if total else 0.0,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "codes": dict(codes),
    }


def env_worker(address: str) -> Callable[[int], Callable[[], None]]:
    """Each thread keeps one episode and steps it (with the rendered image), reopening it
    when done: the env service's hot path."""

    def make(i: int) -> Callable[[], None]:
        client = EnvClient(address, timeout_s=30, max_attempts=1)
        spec = common_pb2.TaskSpec(task="maze_2d", seed=1_000_000 + i, max_turns=1000)
        state = {"id": "", "n": 0}

        def op() -> None:
            if not state["id"]:
                state["id"] = client.open([spec])[0].episode_id
            state["n"] += 1
            result = client.step(
                [env_pb2.Action(episode_id=state["id"], text=MOVES[state["n"] % 4])],
                include_image=True)[0]
            if result.observation.done:
                client.close_episodes([state["id"]])
                state["id"] = ""

        return op

    return make


def group_request(seed: int, g: int = 4, turns: int = 3) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=turns),
        group_size=g, sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=3),
        idempotency_key=uuid.uuid4().hex)


def _retries() -> float:
    from prometheus_client import REGISTRY

    return sum(s.value for m in REGISTRY.collect() if m.name == "rlfleet_pool_group_retries"
               for s in m.samples if s.name.endswith("_total"))


def pool_load(pool: RolloutPool, in_flight: int, groups: int, g: int) -> dict[str, Any]:
    retries = _retries()
    requests = [group_request(2_000_000 + i, g) for i in range(groups)]
    failed, trajectories = 0, 0
    start = time.perf_counter()
    results = pool.run_groups(requests, max_in_flight=in_flight)
    while True:
        try:
            _, ts = next(results)
        except StopIteration:
            break
        except Exception:  # noqa: BLE001 - a failed group counts as an error
            failed += 1
            continue
        trajectories += len(ts)
    elapsed = time.perf_counter() - start
    return {"ok_per_s": (groups - failed) / elapsed, "calls": groups,
            "error_rate": failed / groups, "trajectories_per_s": trajectories / elapsed,
            "lost_trajectories": groups * g - trajectories,
            "codes": f"pool retries={_retries() - retries:.0f}"}


def main() -> None:
    import logging

    logging.getLogger("rlfleet.clients.rollout_pool").setLevel(logging.ERROR)  # counted
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="rlfleet-bench-load-"))
    from rlfleet.policy import ensure_tiny_model

    model_dir = ensure_tiny_model(Path.home() / ".cache" / "rlfleet")
    with ProcessGroup(RESULTS / "logs") as group:
        # -- env service: fixed concurrency, then overload past max_concurrent_rpcs ------
        port = free_port()
        env_address = f"127.0.0.1:{port}"
        group.start_service("env-load", rlfleet_argv(
            "env", "serve", "--port", str(port), "--metrics-port", str(free_port()),
            "--insecure-no-auth"), env_address)
        for c in (1, 8, 32):
            r = run_load(env_worker(env_address), c, WINDOW_S)
            rows.append({"case": f"env Step, {c} clients", **r})
        port = free_port()
        capped = f"127.0.0.1:{port}"
        group.start_service("env-capped", rlfleet_argv(
            "env", "serve", "--port", str(port), "--metrics-port", str(free_port()),
            "--insecure-no-auth"), capped, env={"RLFLEET_MAX_CONCURRENT_RPCS": "4"})
        for c in (4, 64):
            r = run_load(env_worker(capped), c, WINDOW_S)
            rows.append({"case": f"env Step, {c} clients, limit 4", **r})
        assert check(capped) == "SERVING"

        # -- rollout pool: 2 replicas, fixed groups in flight; then overload -------------
        _, redis_url = start_redis(group)
        replicas = []
        for name in ("load-a", "load-b"):
            port = free_port()
            replicas.append(group.start(name, rlfleet_argv(
                "rollout", "serve", "--port", str(port), "--metrics-port", str(free_port()),
                "--model", str(model_dir), "--env-address", env_address, "--redis-url",
                redis_url, "--run", "load", "--replica-id", name, "--runs-root",
                str(work / "runs"), "--max-groups", "2", "--heartbeat-s", "0.5",
                "--insecure-no-auth"),
                address=f"127.0.0.1:{port}"))
        for proc in replicas:
            while check(proc.address or "") != "SERVING":
                if not proc.alive:
                    raise RuntimeError(proc.log_tail())
                time.sleep(0.5)
        pool = RolloutPool(redis_url=redis_url, run="load", stream_timeout_s=300)
        pool_load(pool, 2, 2, 4)  # warm-up
        for in_flight in (2, 4, 8):
            r = pool_load(pool, in_flight, 12, 4)
            rows.append({"case": f"pool groups (G=4), {in_flight} in flight", **r})
        # straight at one replica (max 2 groups), 8 callers: the surplus is refused
        address = replicas[0].address or ""

        def replica_worker(i: int) -> Callable[[], None]:
            client = RolloutClient(address, timeout_s=300, max_attempts=1)
            return lambda: client.play(group_request(3_000_000 + i))

        r = run_load(replica_worker, 8, WINDOW_S)
        rows.append({"case": "one replica (limit 2 groups), 8 callers", **r})
        pool.close()

    for row in rows:
        row["codes"] = " ".join(f"{k}={v}" for k, v in sorted(row["codes"].items())) \
            if isinstance(row.get("codes"), dict) else row.get("codes", "")
    write_results("load", rows, value_key="ok_per_s", unit="OK calls (or groups) per second",
                  meta={"window_s": WINDOW_S, "env_limit": 4, "replica_max_groups": 2,
                        "backoff_s": BACKOFF_S},
                  title="load on loopback (one run; compare ratios)")


if __name__ == "__main__":
    main()
