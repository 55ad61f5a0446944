"""`make bench`: runs every benchmark in turn (each writes bench/results/<name>.json)."""

from __future__ import annotations

import importlib
import sys
import time

from bench.targets import print_targets

BENCHES = [
    "bench.bench_env",
    "bench.bench_engines",
    "bench.bench_rollout",
    "bench.bench_sync",
    "bench.bench_learner",
    "bench.bench_load",
    "bench.bench_grpo_vs_sft",  # reads the newest `make run` (or runs one first)
]
# Run by name only (`python -m bench bench_grpo_levers`): a local fleet per lever, 4-8
# minutes each on 2 quiet cores; the policy probe, about 1.5 minutes per policy.
ON_REQUEST = ["bench.bench_grpo_levers", "bench.bench_policy_probe"]


def main(names: list[str]) -> int:
    sys.argv[1:] = []  # the names are ours; a bench's own flags take their defaults
    chosen = [name if name.startswith("bench.") else f"bench.{name}" for name in names]
    unknown = [name for name in chosen if name not in BENCHES + ON_REQUEST]
    if unknown:
        raise SystemExit(f"unknown bench(es) {unknown}: the benches are "
                         f"{[n.removeprefix('bench.') for n in BENCHES + ON_REQUEST]}")
    for name in chosen or BENCHES:
        print(f"\n=== {name}", flush=True)
        start = time.perf_counter()
        importlib.import_module(name).main()
        print(f"=== {name} done in {time.perf_counter() - start:.0f}s", flush=True)
    print_targets()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
