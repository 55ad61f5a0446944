"""Adapter sync latency: publish → every replica verified, loaded and live, for the tiny
LoRA and for a synthetic adapter of an 8B rank-32 LoRA's size (~170 MB), to 1, 2 and 4
replicas, next to the floor measured in the same run.

One publish is what the learner does (`AdapterPublisher.publish`: write the version dir
under the runs root atomically with its sha256 MANIFEST.json, then ckpt-sync `Publish`,
which verifies and announces it) followed by `WaitForReplicas` until every replica
serves it; the figure is the learner's wall clock from the start of the write until
`WaitForReplicas` returns.

The floor, measured right before each publish with the same bytes on the same
filesystem (the runs root), is what no design can avoid:

    floor = write_fsync_s + read_s
    write_fsync_s: create, write and fsync(2) each adapter file once, with the learner's own
                   write code (chunked, writeback started early) minus hashing, manifest
                   and rename
    read_s:        then N concurrent full reads of those files, one per replica (N
                   processes, like the replicas; each reads every file once into its own
                   private buffer with the replicas' own read code, minus the hashing),
                   from the first read starting until the last one has finished

The reads find the bytes where the write left them (here: the page cache, exactly as the
replicas do, since learner and replicas share this machine); nothing is dropped from the
cache. Hashing, parsing and loading are not in the floor. The target is publish → live
≤ 2× floor; `x_floor` is the median over repeats of (publish → live) / (floor measured
just before it).

Before each floor measurement and each publish the bench pauses `--settle-s` (3 s), so
that both start from the same state: nothing left running from the step before
(unloading the old adapter, collecting old versions), as between training steps, and
memory freed by the step before already handed back (on this VM the kernel returns freed
memory to the host within ~2 s, and touching memory again is then much slower; without
the pause whichever of the two runs second reuses what the first just freed and looks
faster than it is). Both touch the same amount of fresh memory: the page cache for the
written files and one buffer per reader.

Every stage is timed (the learner's publisher, ckpt-sync's and each replica's
"... stages" log lines) and printed as a second table (medians over repeats; for
replica stages the slowest replica of each publish).

The big adapter is shaped for the tiny model (rank ~11.9k on its attention projections)
so replicas really read, hash and load all 170 MB through the same path as any version.

    python -m bench.bench_sync                       # the full matrix
    python -m bench.bench_sync --replicas 4 --adapters big --repeats 3   # the target
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import RESULTS, print_table, write_results
from bench.sync_floor import Readers
from rlfleet.clients.sync import SyncClient
from rlfleet.defaults import cache_dir
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import start_stack
from rlfleet.policy import ensure_tiny_model, load_policy
from rlfleet.policy.lora import adapter_files, add_lora, lora_config
from rlfleet.storage import RunsRoot
from rlfleet.storage.atomic import fsync_file, write_file
from rlfleet_learner.publisher import AdapterPublisher

CACHE = cache_dir()
BIG_RANK = 11_856  # 14,336 bytes per rank on the tiny model -> ~170 MB
REPEATS = 3
SETTLE_S = 3.0
TARGET_X = 2.0
RUN = "sync"
FLOOR_DEFINITION = (
    "write_fsync_s (create + write + fsync each adapter file once, on the runs root, with "
    "the learner's write code minus hashing, manifest and rename) + "
    "read_s (then N concurrent full reads of those files, N = replicas, by N processes, "
    "each into its own buffer with the replicas' read code minus hashing, from where the "
    "write left the bytes (page cache)); measured just before each publish; x_floor = "
    "median over repeats of (publish -> live) / (that floor)")
ADAPTERS = {"tiny": ("tiny LoRA r=16", 16), "big": ("8B-sized (~170 MB)", BIG_RANK)}


def make_adapter(model_dir: Path, rank: int) -> dict[str, bytes]:
    model, _ = load_policy(model_dir)
    return adapter_files(add_lora(model, lora_config(rank, init_random=True)), "tiny")


# -- the floor ----------------------------------------------------------------------------


def _write_fsync(directory: Path, name: str, data: bytes) -> None:
    # The learner's own write (chunks, writeback started as each lands), then fsync: the
    # fastest way this code base has to make the bytes durable, minus hashing, manifest
    # and rename.
    fsync_file(write_file(directory, name, data, fsync=False, start_writeback=True))


def measure_floor(scratch_parent: Path, files: dict[str, bytes], readers: Readers
                  ) -> dict[str, float]:
    """One write + fsync of `files`, then `readers.n` concurrent full reads (module doc)."""
    scratch = scratch_parent / f".floor-{uuid.uuid4().hex[:8]}"
    scratch.mkdir(parents=True)
    try:
        start = time.perf_counter()
        for name, data in files.items():
            _write_fsync(scratch, name, data)
        written = time.perf_counter() - start
        read = readers.read([str(scratch / name) for name in files])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"write_fsync_s": written, "read_s": read, "floor_s": written + read}


# -- stage timings from the services' logs ------------------------------------------------


def _stage_lines(path: Path, msg: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        if msg not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("msg") == msg and isinstance(doc.get("version"), int):
            found[doc["version"]] = doc
    return found


def stage_breakdown(pub: dict[str, Any], sync_log: dict[int, dict], replica_logs: list[dict]
                    ) -> dict[str, float]:
    """One publish's stages in seconds (replica stages: the slowest replica's)."""
    v = pub["version"]
    out: dict[str, float] = {f"learner {k.removesuffix('_s')}": s
                             for k, s in pub["learner"].items()}
    out["learner -> ckpt-sync Publish RPC"] = pub["publish_rpc_s"]
    sync = sync_log.get(v, {}).get("stages", {})
    for k, s in sync.items():
        if k.endswith("_s"):
            out[f"  ckpt-sync {k.removesuffix('_s')}"] = s
    lines = [r[v] for r in replica_logs if v in r]
    if lines:
        announced = max(ln.get("published_at", 0.0) for ln in lines)
        notices = [ln["stages"]["noticed_at"] - ln.get("published_at", announced)
                   for ln in lines]
        out["replica notice (announce -> event)"] = max(notices)
        keys = dict.fromkeys(k for ln in lines for k in ln["stages"] if k.endswith("_s"))
        for k in keys:
            out[f"replica {k.removesuffix('_s')}"] = max(ln["stages"].get(k, 0.0)
                                                         for ln in lines)
        last_ack = max(ln["stages"]["acked_at"] for ln in lines)
        out["WaitForReplicas tail (last ack -> reply)"] = pub["end_wall"] - last_ack
        out["= publish -> live (total)"] = pub["total_s"]
    return out


# -- the bench ----------------------------------------------------------------------------


def publish_once(publisher: AdapterPublisher, version: int, files: dict[str, bytes],
                 replicas: int) -> dict[str, Any]:
    start_wall, start = time.time(), time.perf_counter()
    published = publisher.publish(files, step=version, version=version)
    assert published.version == version, (published.version, version)
    publisher.wait_live(version, replicas, timeout_s=600)
    end = time.perf_counter()
    return {"version": version, "start_wall": start_wall, "end_wall": time.time(),
            "total_s": end - start, "learner": published.stages,
            "publish_rpc_s": published.announce_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="1,2,4", help="comma-separated counts")
    parser.add_argument("--adapters", default="tiny,big", help=f"of {sorted(ADAPTERS)}")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--settle-s", type=float, default=SETTLE_S,
                        help="pause before each floor measurement and each publish")
    args = parser.parse_args(argv)
    counts = sorted({int(x) for x in args.replicas.split(",")})
    chosen = [a.strip() for a in args.adapters.split(",")]

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = ensure_tiny_model(CACHE)
    adapters = {ADAPTERS[a][0]: make_adapter(model_dir, ADAPTERS[a][1]) for a in chosen}
    work = RESULTS / "sync-work"
    shutil.rmtree(work, ignore_errors=True)
    root = RunsRoot(work / "runs")
    group = ProcessGroup(work / "logs")
    stack = start_stack(work, runs_root=root.root, run=RUN, model_dir=model_dir,
                        replicas=1, group=group, log=lambda m: None)
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, list[dict[str, Any]], list[dict[str, float]]]] = []
    try:
        sync = SyncClient(stack.sync_address, timeout_s=620)
        publisher = AdapterPublisher(root, RUN, "tiny", sync)
        version = 0
        for replicas in counts:
            while len(stack.replicas) < replicas:
                stack.add_replica()
            readers = Readers(replicas)
            try:
                for name, files in adapters.items():
                    size = sum(len(b) for b in files.values())
                    pubs, floors = [], []
                    for _ in range(args.repeats):
                        version += 1
                        time.sleep(args.settle_s)
                        floors.append(measure_floor(root.run_dir(RUN), files, readers))
                        time.sleep(args.settle_s)
                        pubs.append(publish_once(publisher, version, files, replicas))
                    cases.append((f"{name} -> {replicas} replica(s)", pubs, floors))
                    total = statistics.median(p["total_s"] for p in pubs)
                    floor = statistics.median(f["floor_s"] for f in floors)
                    x = statistics.median(p["total_s"] / f["floor_s"]
                                          for p, f in zip(pubs, floors, strict=True))
                    rows.append({
                        "case": f"{name} -> {replicas} replica(s)",
                        "MB": size / 1e6,
                        "publish_to_live_s": total,
                        "floor_s": floor,
                        "floor_write_fsync_s": statistics.median(f["write_fsync_s"]
                                                                 for f in floors),
                        "floor_reads_s": statistics.median(f["read_s"] for f in floors),
                        "x_floor": x,
                        "target": f"<= {TARGET_X:g}x",
                        "met": "yes" if x <= TARGET_X else "NO",
                    })
            finally:
                readers.close()
        time.sleep(0.5)  # let the last log lines reach the files
        sync_log = _stage_lines(stack.sync.log_path, "publish stages")
        replica_logs = [_stage_lines(p.log_path, "adapter stages") for p in stack.replicas]
    finally:
        stack.close()

    stages: dict[str, dict[str, float]] = {}
    for case, pubs, _floors in cases:
        per = [stage_breakdown(p, sync_log, replica_logs) for p in pubs]
        keys = dict.fromkeys(k for b in per for k in b)
        stages[case] = {k: statistics.median(b[k] for b in per if k in b) for k in keys}
    for case, breakdown in stages.items():
        print_table(f"stages (median s): {case}",
                    [{"stage": k, "seconds": v} for k, v in breakdown.items()])
    print(f"\nfloor = {FLOOR_DEFINITION}")
    write_results("bench_sync", rows, value_key="publish_to_live_s",
                  unit=f"seconds (median of {args.repeats})",
                  meta={"repeats": args.repeats, "big_rank": BIG_RANK, "target_x_floor": TARGET_X,
                        "settle_s": args.settle_s,
                        "per_publish": {case: [{"total_s": p["total_s"], **f}
                                               for p, f in zip(pubs, floors, strict=True)]
                                        for case, pubs, floors in cases},
                        "floor": FLOOR_DEFINITION,
                        "stages_median_s": stages},
                  title="adapter sync: publish -> all replicas live, vs the floor "
                        f"(target <= {TARGET_X:g}x)")


if __name__ == "__main__":
    main()
