"""Rollout throughput on the tiny model: engine tokens/s by batch size (hf in-process),
and trajectories/s through the full service path with 1 vs 2 replicas.

    python -m bench.bench_rollout
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from pathlib import Path

from bench.common import RESULTS, write_results
from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.defaults import cache_dir
from rlfleet.engines.base import GenerationRequest, SamplingConfig
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import start_stack
from rlfleet.maze.tasks import new_episode
from rlfleet.policy import ChatCodec, ensure_tiny_model
from rlfleet.v1 import common_pb2, rollout_pb2

CACHE = cache_dir()


def prompt(codec: ChatCodec, seed: int) -> GenerationRequest:
    ep = new_episode("maze_2d", seed, size=7, cell_px=16)
    obs = ep.observe()
    url = "data:image/png;base64," + base64.b64encode(obs.png).decode()
    enc = codec.encode_prompt([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": f"{obs.instruction}\n\n{obs.status}"}]}])
    return GenerationRequest(enc.token_ids, enc.images)


def engine_rows(model_dir: Path) -> list[dict]:
    from rlfleet.engines.hf import HFEngine

    engine = HFEngine(model_dir, num_threads=1)
    codec = engine.codec
    rows = []
    for batch in (1, 8, 32):
        requests = [prompt(codec, 1_000_000 + i) for i in range(batch)]
        params = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=1)
        engine.generate(requests, params)  # warm-up
        start = time.perf_counter()
        n_tokens, reps = 0, 0
        while time.perf_counter() - start < 3.0:
            n_tokens += sum(len(g.token_ids) for g in engine.generate(requests, params))
            reps += 1
        dt = time.perf_counter() - start
        rows.append({"case": f"hf engine batch={batch}", "tokens_per_s": n_tokens / dt,
                     "prompt_tokens": len(requests[0].prompt_ids), "calls": reps})
    engine.close()
    return rows


CASES = (("hf", 1), ("hf", 2), ("vllm", 1))


def service_rows(model_dir: Path, work: Path, groups: int = 12) -> list[dict]:
    from rlfleet.engines.vllm import default_venv_python

    rows = []
    for engine, replicas in CASES:
        name = f"{engine}-r{replicas}"
        group = ProcessGroup(work / name / "logs")
        stack = start_stack(work / name, runs_root=work / name / "runs", run="bench",
                            model_dir=model_dir, replicas=replicas if engine == "hf" else 0,
                            group=group, log=lambda m: None)
        try:
            if engine == "vllm":
                stack.add_replica("vllm", "--engine", "vllm",
                                  python=str(default_venv_python()))
            pool = RolloutPool(redis_url=stack.redis_url, run="bench")
            requests = [rollout_pb2.GroupRequest(
                task=common_pb2.TaskSpec(task="maze_2d", seed=1_000_000 + i, size=7,
                                         max_turns=10),
                group_size=8,
                sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=4),
                idempotency_key=uuid.uuid4().hex, include_images=True,
                context_mode=common_pb2.CONTEXT_LAST_FRAME)
                for i in range(groups)]
            start = time.perf_counter()
            results = list(pool.run_groups(requests, max_in_flight=4))
            dt = time.perf_counter() - start
            trajectories = [t for _, ts in results for t in ts]
            tokens = sum(sum(t.loss_mask) for t in trajectories)
            rows.append({"case": f"service, {replicas} {engine} replica(s)",
                         "trajectories_per_s": len(trajectories) / dt,
                         "tokens_per_s": tokens / dt, "trajectories": len(trajectories),
                         "seconds": dt})
        finally:
            stack.close()
    base = rows[0]["trajectories_per_s"]
    for r in rows:
        r["vs_1_hf_replica"] = r["trajectories_per_s"] / base
    return rows


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = ensure_tiny_model(CACHE)
    rows = engine_rows(model_dir)
    rows += service_rows(model_dir, RESULTS / "rollout-work")
    write_results("rollout", rows, value_key="tokens_per_s", unit="generated tokens per second",
                  meta={"model": "tiny Qwen3-VL (~1M params)", "maze": "7x7, 16 px/cell",
                        "context": "last_frame", "machine_cores": os.cpu_count()},
                  title="rollout throughput, tiny model (one run; compare ratios)")


if __name__ == "__main__":
    main()
