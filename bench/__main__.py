"""`make bench`: runs every benchmark in turn (each writes bench/results/<name>.json), or
the ones named; `--record NAME` keeps each bench's result as the record
results/NAME-<bench>.json (docs/results.md is made from the records)."""

from __future__ import annotations

import importlib
import json
import sys
import time

from bench.common import RESULTS
from bench.summary import limit_rows, print_summary
from rlfleet.local import records

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


def main(argv: list[str]) -> int:
    names, record = list(argv), None
    if "--record" in names:
        at = names.index("--record")
        if at + 1 >= len(names):
            raise SystemExit("--record needs a NAME")
        record = names[at + 1]
        del names[at:at + 2]
    sys.argv[1:] = []  # the names are ours; a bench's own flags take their defaults
    chosen = [name if name.startswith("bench.") else f"bench.{name}" for name in names]
    unknown = [name for name in chosen if name not in BENCHES + ON_REQUEST]
    if unknown:
        raise SystemExit(f"unknown bench(es) {unknown}: the benches are "
                         f"{[n.removeprefix('bench.') for n in BENCHES + ON_REQUEST]}")
    if record:  # every record's name is checked before any bench runs
        for name in chosen or BENCHES:
            try:
                records.new_record_path(_record_name(record, name))
            except records.RecordError as exc:
                raise SystemExit(f"--record: {exc}") from None
    for name in chosen or BENCHES:
        print(f"\n=== {name}", flush=True)
        start = time.perf_counter()
        importlib.import_module(name).main()
        print(f"=== {name} done in {time.perf_counter() - start:.0f}s", flush=True)
        if record:
            _record(record, name.removeprefix("bench."))
    print_summary()
    return 0


def _record_name(record: str, bench: str) -> str:
    return f"{record}-{bench.removeprefix('bench.').replace('_', '-')}"


def _record(record: str, bench: str) -> None:
    """The bench's JSON result as a record, with the limits it is held to."""
    try:
        result = json.loads((RESULTS / f"{bench}.json").read_text())
    except (OSError, ValueError):
        print(f"no result of {bench} to record", flush=True)
        return
    isolated = RESULTS / ".record"
    isolated.mkdir(exist_ok=True)
    (isolated / f"{bench}.json").write_text(json.dumps(result))
    try:
        limits = [{"what": w, "measured": m, "limit": lim, "met": met}
                  for w, m, lim, met in limit_rows(isolated)]
    finally:
        (isolated / f"{bench}.json").unlink()
    path = records.write_record(_record_name(record, bench), bench,
                                f"make bench BENCHES={bench}",
                                {"limits": limits, "result": result})
    print(f"recorded as {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
