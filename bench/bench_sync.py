"""Adapter sync latency: publish (write to the runs root + ckpt-sync verify + announce) →
every replica verified, loaded and live, for the tiny LoRA and for a synthetic adapter of
an 8B rank-32 LoRA's size (~170 MB), to 1, 2 and 4 replicas; next to the floor of
reading those bytes once at the measured disk read rate.

The big adapter is shaped for the tiny model (rank ~11.9k on its attention projections)
so replicas really hash, copy and load all 170 MB through the same path as any version.

    python -m bench.bench_sync
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.common import RESULTS, write_results
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import start_stack
from rlfleet.policy import ensure_tiny_model, load_policy
from rlfleet.policy.lora import adapter_files, add_lora, lora_config
from rlfleet.rpc.client import RpcClient
from rlfleet.storage import RunsRoot, publish_adapter_dir
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc

CACHE = Path(os.environ.get("RLFLEET_CACHE", Path.home() / ".cache" / "rlfleet"))
BIG_RANK = 11_856  # 14,336 bytes per rank on the tiny model -> ~170 MB
REPEATS = 3


def make_adapter(model_dir: Path, rank: int) -> dict[str, bytes]:
    model, _ = load_policy(model_dir)
    return adapter_files(add_lora(model, lora_config(rank, init_random=True)), "tiny")


def read_rate(path: Path) -> float:
    """Bytes/s reading `path` after asking the kernel to drop its cached pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start, n = time.perf_counter(), 0
        while chunk := os.read(fd, 8 << 20):
            n += len(chunk)
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)


def publish_and_wait(root: RunsRoot, run: str, version: int, files: dict[str, bytes],
                     sync: RpcClient, replicas: int) -> tuple[float, float]:
    start = time.perf_counter()
    publish_adapter_dir(root, run, version, files, base_model="tiny", step=version)
    sync.call(sync_pb2_grpc.SyncServiceStub, "Publish", sync_pb2.PublishRequest(
        adapter=common_pb2.AdapterRef(run=run, version=version)))
    reply = sync.call(sync_pb2_grpc.SyncServiceStub, "WaitForReplicas",
                      sync_pb2.WaitForReplicasRequest(run=run, version=version,
                                                      min_replicas=replicas, timeout_s=600),
                      timeout_s=620)
    return time.perf_counter() - start, reply.publish_to_live_s


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = ensure_tiny_model(CACHE)
    adapters = {"tiny LoRA r=16": make_adapter(model_dir, 16),
                "8B-sized (~170 MB)": make_adapter(model_dir, BIG_RANK)}
    work = RESULTS / "sync-work"
    root = RunsRoot(work / "runs")
    group = ProcessGroup(work / "logs")
    stack = start_stack(work, runs_root=root.root, run="sync", model_dir=model_dir,
                        replicas=1, group=group, log=lambda m: None)
    rows = []
    try:
        sync = RpcClient(stack.sync_address, timeout_s=620)
        version = 0
        for replicas in (1, 2, 4):
            while len(stack.replicas) < replicas:
                stack.add_replica()
            for name, files in adapters.items():
                size = sum(len(b) for b in files.values())
                totals, lags = [], []
                for _ in range(REPEATS):
                    version += 1
                    total, lag = publish_and_wait(root, "sync", version, files, sync, replicas)
                    totals.append(total)
                    lags.append(lag)
                weights = root.adapter_dir("sync", version) / "adapter_model.safetensors"
                rate = read_rate(weights)
                rows.append({
                    "case": f"{name} -> {replicas} replica(s)",
                    "bytes": size,
                    "publish_to_live_s": statistics.median(totals),
                    "ckptsync_measured_s": statistics.median(lags),
                    "floor_s": size / rate,
                    "disk_read_MBps": rate / 1e6,
                    "x_floor": statistics.median(totals) / (size / rate),
                })
    finally:
        stack.close()
    write_results("sync", rows, value_key="publish_to_live_s", unit="seconds (median of 3)",
                  meta={"repeats": REPEATS, "big_rank": BIG_RANK,
                        "note": "floor = the adapter's bytes read once at the measured rate; "
                                "each replica also hashes and copies them"},
                  title="adapter sync latency: publish -> all replicas live")


if __name__ == "__main__":
    main()
